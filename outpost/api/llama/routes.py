"""llama-server's extensions: /tokenize, /detokenize, /apply-template, and the ops endpoints
/health and /metrics."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from outpost.api.metrics import PROMETHEUS_CONTENT_TYPE
from outpost.api.pipeline import chat_run, mapping
from outpost.api.pipeline.schemas import ApplyTemplateRequest, DetokenizeRequest, TokenizeRequest
from outpost.api.state import state_of

router = APIRouter()


@router.post("/tokenize", tags=["llama.cpp"])
async def tokenize(body: TokenizeRequest, request: Request) -> dict[str, Any]:
    """Text -> token ids (`with_pieces`: each id with its text)."""
    codec = state_of(request).ready_backend().codec
    tokens = await asyncio.to_thread(codec.tokenize, body.content, body.add_special, True)
    if not body.with_pieces:
        return {"tokens": tokens}
    pieces = [codec.token_piece(t).decode("utf-8", errors="replace") for t in tokens]
    return {"tokens": [{"id": t, "piece": p} for t, p in zip(tokens, pieces, strict=True)]}


@router.post("/detokenize", tags=["llama.cpp"])
async def detokenize(body: DetokenizeRequest, request: Request) -> dict[str, Any]:
    """Token ids -> text."""
    codec = state_of(request).ready_backend().codec
    mapping.check_token_ids(codec, body.tokens, "tokens")
    return {"content": codec.detokenize(body.tokens)}


@router.post("/apply-template", tags=["llama.cpp"])
async def apply_template(body: ApplyTemplateRequest, request: Request) -> dict[str, Any]:
    """The prompt the chat template renders for `messages` (with the generation prompt)."""
    state = state_of(request)
    return {"prompt": (await chat_run.plan_on(state, state.ready_backend(), body)).prompt}


@router.get("/health", tags=["ops"])
@router.get("/v1/health", include_in_schema=False)  # llama-server's alias
async def health(request: Request) -> JSONResponse:
    """200 with slot and queue figures when ready; 503 while loading, draining or failed."""
    state = state_of(request)
    stats = state.stats()
    body: dict[str, Any] = {
        "status": state.status,
        "model": state.model_id,
        "slots_total": stats.slots_total if stats is not None else state.slots,
        "slots_busy": stats.slots_busy if stats is not None else 0,
        "queue_depth": stats.queue_depth if stats is not None else 0,
    }
    if stats is not None:
        body.update(stats.extra)
    if state.load_error:
        body["error"] = state.load_error
    return JSONResponse(body, status_code=200 if state.status == "ok" else 503)


@router.get("/metrics", tags=["ops"])
async def metrics(request: Request) -> Response:
    """Prometheus text format."""
    return Response(state_of(request).metrics.render(), media_type=PROMETHEUS_CONTENT_TYPE)
