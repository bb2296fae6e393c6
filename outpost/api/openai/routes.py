"""OpenAI's routes: /v1/chat/completions, /v1/completions, /v1/models (llama-server's unprefixed
aliases too; GET /models is also its router's list, each card with its `status` where models load on
demand). Thin: parse the body, hand it to `handlers.py`."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from outpost.api.errors import ApiError
from outpost.api.llama.router import model_status
from outpost.api.openai.handlers import handle_chat, handle_completion
from outpost.api.pipeline.chat_run import input_tokens
from outpost.api.pipeline.schemas import ChatCompletionRequest, CompletionRequest
from outpost.api.state import state_of
from outpost.backend import InferenceBackend

router = APIRouter()
_STARTED = int(time.time())


@router.post("/v1/chat/completions", tags=["openai"])
@router.post("/chat/completions", include_in_schema=False)
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    """Chat completion, streamed as SSE with `"stream": true`."""
    return await handle_chat(state_of(request), body, request)


@router.post("/v1/chat/completions/input_tokens", tags=["llama.cpp"])
@router.post("/chat/completions/input_tokens", include_in_schema=False)
async def chat_input_tokens(body: ChatCompletionRequest, request: Request) -> dict[str, Any]:
    """llama-server's: the prompt tokens the chat request would take, rendered by the template."""
    n = await input_tokens(state_of(request), body)
    return {"input_tokens": n, "object": "response.input_tokens"}


@router.post("/v1/completions", tags=["openai"])
async def completions(body: CompletionRequest, request: Request) -> Response:
    """Text completion of a prompt (a string, a list of strings, or token ids)."""
    return await handle_completion(state_of(request), body, request)


def _model_card(model_id: str, backend: InferenceBackend | None) -> dict[str, Any]:
    card: dict[str, Any] = {"id": model_id, "object": "model", "created": _STARTED, "owned_by": "outpost"}
    if backend is not None:
        card["meta"] = {**backend.describe(), "n_ctx_seq": backend.n_ctx_seq}
    if (status := model_status(backend)) is not None:  # llama-server's router: loaded, loading or unloaded
        card["status"] = status
    return card


@router.get("/v1/models", tags=["openai"])
@router.get("/models", include_in_schema=False)
async def list_models(request: Request) -> dict[str, Any]:
    """The models this server serves; an `id` is what requests may put in `model`."""
    state = state_of(request)
    cards = [_model_card(m, state.backends.get(m)) for m in state.model_ids]
    return {"object": "list", "data": cards}


@router.get("/v1/models/{model_id}", tags=["openai"])
async def get_model(model_id: str, request: Request) -> dict[str, Any]:
    state = state_of(request)
    if model_id not in state.model_ids:
        raise ApiError(
            404, f"the model {model_id!r} does not exist here", param="model", code="model_not_found"
        )
    return _model_card(model_id, state.backends.get(model_id))
