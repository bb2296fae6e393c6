"""llama-server's `GET /lora-adapters` and `POST /lora-adapters`: the loaded adapters, their scales.

POST sets the server-wide scales (adapters not named: 0, as llama-server); a request's own `lora`
list overrides them for that request. An id that names no adapter is a 400 naming `lora`; a
gateway answers 501 (its workers hold the adapters).
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from pydantic import TypeAdapter, ValidationError

from outpost.api.errors import bad_request
from outpost.api.llama.infill import not_supported
from outpost.api.pipeline.schemas import LoraList
from outpost.api.state import state_of
from outpost.messages import NotSupported, RequestRejected

router = APIRouter()
_LIST = TypeAdapter(LoraList)


@router.get("/lora-adapters", tags=["llama.cpp"])
async def get_lora_adapters(request: Request) -> list[dict[str, Any]]:
    _, backend = state_of(request).backend_for(None)
    try:
        adapters = backend.lora_adapters()
    except NotSupported as exc:
        raise not_supported(str(exc)) from None
    return [
        {"id": a.id, "path": a.path, "scale": a.scale, "task_name": "", "prompt_prefix": ""} for a in adapters
    ]


@router.post("/lora-adapters", tags=["llama.cpp"])
async def post_lora_adapters(request: Request) -> dict[str, bool]:
    """Sets the default scales from a list of `{"id", "scale"}`."""
    try:
        body = json.loads(await request.body())
    except ValueError:
        raise bad_request("the request body is not valid JSON") from None
    if not isinstance(body, list):
        raise bad_request("Request body must be an array", "lora")
    try:
        entries = _LIST.validate_python(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise bad_request(f"lora[{where}]: {first['msg']}", "lora") from None
    _, backend = state_of(request).backend_for(None)
    try:
        backend.set_lora_scales(tuple((e.id, e.scale) for e in entries))
    except NotSupported as exc:
        raise not_supported(str(exc)) from None
    except RequestRejected as exc:
        raise bad_request(str(exc), exc.param) from None
    return {"success": True}
