"""llama-server's router routes: POST /models/load and POST /models/unload (body `{"model": NAME}`),
and the `status` each model card carries in GET /models on a server whose models load on demand
(`--models-dir`, the store, `--sleep-idle-seconds`: outpost/serving/model_pool.py).

As llama-server: a load answers at once and the model loads behind it. Unlike llama-server, a
model with requests in flight is not unloaded under them: a 409.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import APIRouter, Request

from outpost.api.errors import ApiError, bad_request
from outpost.api.state import state_of
from outpost.backend import InferenceBackend, ManagedBackend

router = APIRouter()


def model_status(backend: InferenceBackend | None) -> dict[str, Any] | None:
    """llama-server's `status` object for a model card; None where the model is not managed."""
    if not isinstance(backend, ManagedBackend):
        return None
    status: dict[str, Any] = {"value": backend.status, "args": []}
    if backend.error is not None and backend.status == "unloaded":
        status |= {"failed": True, "error": backend.error}
    return status


async def _managed(request: Request, unknown_status: int) -> tuple[str, ManagedBackend]:
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError as exc:
        raise bad_request(f"invalid JSON body: {exc}") from None
    name = body.get("model") if isinstance(body, dict) else None
    if not isinstance(name, str) or not name:
        raise bad_request("model must be a non-empty string", param="model")
    state = state_of(request)
    backend = state.backends.get(name)
    if backend is None:
        raise ApiError(unknown_status, f"model {name!r} is not found", param="model", code="model_not_found")
    if not isinstance(backend, ManagedBackend):
        raise ApiError(
            501,
            "this server serves one model and keeps it loaded; start it with --models-dir (or "
            "--sleep-idle-seconds) to load and unload models",
            type="not_supported_error",
        )
    return name, backend


@router.post("/models/load", tags=["llama.cpp"])
async def load(request: Request) -> dict[str, Any]:
    """Load a model now; answers at once while it loads (GET /models shows its status)."""
    name, backend = await _managed(request, 404)
    if backend.status != "unloaded":
        raise bad_request(f"model {name!r} is already running", param="model")
    # The load runs behind the reply; its failure is the model's status, not this request's.
    task = asyncio.ensure_future(backend.load())
    background = state_of(request).background
    background.add(task)
    task.add_done_callback(background.discard)
    task.add_done_callback(lambda t: t.cancelled() or t.exception())
    return {"success": True}


@router.post("/models/unload", tags=["llama.cpp"])
async def unload(request: Request) -> dict[str, Any]:
    """Unload a loaded model that has no request in flight."""
    name, backend = await _managed(request, 400)
    if backend.status != "loaded":
        raise bad_request(f"model {name!r} is not running", param="model")
    if not await backend.unload():
        raise ApiError(
            409,
            f"model {name!r} has {backend.inflight} request(s) in flight; unload it once they end",
            param="model",
            code="model_busy",
        )
    return {"success": True}
