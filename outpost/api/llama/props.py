"""llama-server's server-state routes: `GET /props`, `POST /props`, `GET /slots`, in its shapes.

`POST /props` without `--props` is llama-server's 501; with it, `{"success": true}` for a JSON
object and no setting changes (llama-server's handler applies none of the fields either). `/slots`
(off with `--no-slots`: 501) lists the slots with whether each is busy: Outpost's scheduler places
requests per step, so a slot's figures are the pool's (no per-slot prompt or task id).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

import outpost
from outpost.api.llama.infill import not_supported
from outpost.api.llama.render import sampler_settings
from outpost.api.llama.schemas import DEFAULT_SAMPLERS
from outpost.api.llama.slots import object_body
from outpost.api.state import ServerState, state_of
from outpost.backend import InferenceBackend

router = APIRouter()


def default_params(state: ServerState) -> dict[str, Any]:
    """The sampling settings a request without any gets: llama-server's with `--temp`, `-s`, `-n`."""
    return {
        **sampler_settings(state.sampling_defaults, state.config.n_predict),
        "n_probs": 0,
        "ignore_eos": False,
        "stream": False,
        "samplers": list(DEFAULT_SAMPLERS),
    }


def _piece(backend: InferenceBackend, token: int) -> str:
    return backend.codec.token_piece(token).decode("utf-8", errors="replace") if token >= 0 else ""


@router.get("/props", tags=["llama.cpp"])
async def get_props(request: Request) -> dict[str, Any]:
    """The server's model, context, slots and defaults, as llama-server reports them."""
    state = state_of(request)
    model_id, backend = state.backend_for(None)
    return {
        "default_generation_settings": {"n_ctx": backend.n_ctx_seq, "params": default_params(state)},
        "total_slots": backend.stats().slots_total,
        "model_alias": model_id,
        "model_path": backend.describe().get("model_path", model_id),
        "modalities": {"vision": False, "audio": False},
        "chat_template": backend.codec.chat_template_source or "",
        "bos_token": _piece(backend, backend.codec.bos_token),
        "eos_token": "",
        "build_info": f"outpost-{getattr(outpost, '__version__', '0')}",
        "webui": state.config.webui,
        "endpoint_slots": state.config.slots,
        "endpoint_props": state.config.props,
        "endpoint_metrics": True,
        "is_sleeping": False,
    }


@router.post("/props", tags=["llama.cpp"])
async def set_props(request: Request) -> dict[str, Any]:
    """llama-server's: with `--props`, accepts a JSON object and changes nothing (as there)."""
    if not state_of(request).config.props:
        raise not_supported(
            "This server does not support changing global properties. Start it with `--props`"
        )
    await object_body(request, "a JSON object of properties")
    return {"success": True}


@router.get("/slots", tags=["llama.cpp"])
async def slots(request: Request) -> list[dict[str, Any]]:
    """One entry per slot: id, n_ctx, is_processing (the first `slots_busy` are busy)."""
    state = state_of(request)
    if not state.config.slots:  # `--no-slots`: llama-server's refusal
        raise not_supported("This server does not support slots endpoint. Start it with `--slots`")
    _, backend = state.backend_for(None)
    stats = backend.stats()
    params = default_params(state)
    return [
        {
            "id": i,
            "id_task": -1,
            "n_ctx": backend.n_ctx_seq,
            "is_processing": i < stats.slots_busy,
            "params": params,
        }
        for i in range(stats.slots_total)
    ]
