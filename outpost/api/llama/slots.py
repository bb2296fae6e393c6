"""llama-server's `POST /slots/{id}?action=save|restore|erase`: a slot's KV cache to a file and back.

A file name is checked as llama-server's `fs_validate_filename` checks it, so a request cannot reach
outside `--slot-save-path`. Refusals: 501 without `--slot-save-path` (llama-server's) and through a
gateway; 400 for an unknown slot, a bad name or file; 409 for a slot that is processing a request
(llama-server defers the action until the slot is idle).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from fastapi import APIRouter, Request

from outpost.api.errors import ApiError, bad_request
from outpost.api.llama.infill import not_supported
from outpost.api.state import state_of
from outpost.messages import SlotAction, SlotActionError

router = APIRouter()

_ACTIONS: dict[str, Literal["save", "restore", "erase"]] = {a: a for a in ("save", "restore", "erase")}
_FORBIDDEN = set(':*?"<>|/\\') | {"\ufffd", "\ufeff", "\uff0e", "\u2215", "\u2216"}


def valid_filename(name: str) -> bool:
    """llama.cpp's `fs_validate_filename` (common/common.cpp) without subfolders."""
    if not name or len(name.encode("utf-8", errors="replace")) > 255:
        return False
    for ch in name:
        c = ord(ch)
        if c <= 0x1F or c == 0x7F or 0x80 <= c <= 0x9F or 0xD800 <= c <= 0xDFFF or ch in _FORBIDDEN:
            return False
    return not (name[0] == " " or name[-1] in " ." or ".." in name)


async def object_body(request: Request, what: str = "a JSON object") -> dict[str, Any]:
    """The body as llama-server reads an object's: none is `{}`; `what` names what it must be."""
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError:
        raise bad_request("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be {what}")
    return body


def _filename(body: dict[str, Any]) -> str:
    name = body.get("filename")
    if not isinstance(name, str):
        raise bad_request("'filename' (a file name in the server's --slot-save-path) is required", "filename")
    if not valid_filename(name):
        raise bad_request(f"Invalid filename {name!r}: a bare file name, no path", "filename")
    return name


def _refusal(exc: SlotActionError) -> ApiError:
    if exc.reason in ("disabled", "unsupported"):
        return not_supported(str(exc))
    if exc.reason == "busy":
        return ApiError(409, str(exc), code="slot_busy")
    return bad_request(str(exc), "id_slot" if exc.reason == "unknown_slot" else "filename")


@router.post("/slots/{id_slot}", tags=["llama.cpp"])
async def slot_action(id_slot: str, request: Request, action: str = "") -> dict[str, Any]:
    """Save (`{"filename": "x.bin"}`), restore (same body) or erase (no body) slot `id_slot`."""
    try:
        slot = int(id_slot)
    except ValueError:
        raise bad_request(f"Invalid slot ID {id_slot!r}", "id_slot") from None
    kind = _ACTIONS.get(action)
    if kind is None:
        raise bad_request("Invalid action: use ?action=save, restore or erase", "action")
    filename = "" if kind == "erase" else _filename(await object_body(request))
    _, backend = state_of(request).backend_for(None)
    try:
        result = await backend.slot_action(SlotAction(kind, slot, filename))
    except SlotActionError as exc:
        raise _refusal(exc) from None
    if kind == "erase":
        return {"id_slot": slot, "n_erased": result.n_tokens}
    tokens, size = ("n_saved", "n_written") if kind == "save" else ("n_restored", "n_read")
    done = {tokens: result.n_tokens, size: result.n_bytes}
    return {"id_slot": slot, "filename": filename, **done, "timings": {f"{kind}_ms": result.ms}}
