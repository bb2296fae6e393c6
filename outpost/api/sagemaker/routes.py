"""SageMaker's container contract: GET /ping and POST /invocations.

/invocations takes Hugging Face TGI's `{"inputs": "...", "parameters": {...}}` (raw-text prompt;
reply `[{"generated_text": ...}]`, as TGI does), or an OpenAI chat body (`messages`) or text
completion body (`prompt`), answered exactly as /v1/chat/completions or /v1/completions would.
SageMaker passes the caller's ContentType and Accept through: the body is read as JSON whatever the
type says (not JSON: 400), and the reply is JSON, or an SSE stream when the body asks for `stream`
(an Accept that allows neither: 406).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Body, Depends, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from outpost.api.errors import ApiError, bad_request
from outpost.api.openai.handlers import handle_chat, handle_completion
from outpost.api.pipeline import mapping
from outpost.api.pipeline.schemas import ChatCompletionRequest, CompletionRequest, TgiParameters, TgiRequest
from outpost.api.pipeline.submit import Submission, outcomes, submit
from outpost.api.state import ServerState, state_of
from outpost.messages import SamplingParams

router = APIRouter()
TGI = mapping.Names("inputs", "max_new_tokens")


@router.get("/ping", tags=["sagemaker"])
async def ping(request: Request) -> JSONResponse:
    """200 once the model is loaded and the server is not draining; 503 otherwise."""
    state = state_of(request)
    return JSONResponse({"status": state.status}, status_code=200 if state.status == "ok" else 503)


def _parse(model: type[BaseModel], body: dict[str, Any]) -> Any:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from exc


_REPLY_TYPES = ("application/json", "text/event-stream")


def _media_types(header: str) -> list[str]:
    return [part.split(";")[0].strip().lower() for part in header.split(",") if part.strip()]


def negotiate(request: Request) -> None:
    """406 for an Accept that allows no reply this route gives. The body is JSON whatever its
    Content-Type says, as on every route (`limits.py`: `curl -d` sends form encoding, and a
    SageMaker client may name none); a body that is not JSON is a 400 that says so."""
    accept = request.headers.get("accept")
    if accept:
        ok = {"*/*", "application/*", "text/*", *_REPLY_TYPES}
        if not any(r in ok or r.endswith("+json") for r in _media_types(accept)):
            raise ApiError(
                406, f"/invocations answers {' or '.join(_REPLY_TYPES)}; Accept: {accept!r} allows neither",
                code="not_acceptable",
            )  # fmt: skip


@router.post("/invocations", tags=["sagemaker"], dependencies=[Depends(negotiate)])
async def invocations(request: Request, body: dict[str, Any] = Body(...)) -> Response:  # noqa: B008
    """A TGI body (`inputs`), an OpenAI chat body (`messages`) or a completion body (`prompt`)."""
    state = state_of(request)
    if "messages" in body:
        return await handle_chat(state, _parse(ChatCompletionRequest, body), request)
    if "inputs" in body:
        return await handle_tgi(state, _parse(TgiRequest, body), request)
    if "prompt" in body:
        return await handle_completion(state, _parse(CompletionRequest, body), request)
    raise bad_request("expected a TGI body with 'inputs' or an OpenAI body with 'messages' or 'prompt'")


def tgi_sampling(p: TgiParameters) -> SamplingParams:
    """TGI's rules: greedy unless do_sample, or a temperature/top_p/top_k asks for sampling."""
    asked = any(v is not None for v in (p.temperature, p.top_p, p.top_k))
    sample = asked if p.do_sample is None else p.do_sample
    seed = None if p.seed is None else p.seed & 0xFFFFFFFF
    penalty = p.repetition_penalty or 1.0
    if not sample:
        return SamplingParams(temperature=0.0, repeat_penalty=penalty, seed=seed)
    return SamplingParams(
        temperature=p.temperature or 1.0,
        top_k=p.top_k or 0,
        top_p=p.top_p or 1.0,
        min_p=0.0,
        repeat_penalty=penalty,
        seed=seed,
    )


async def handle_tgi(state: ServerState, body: TgiRequest, request: Request) -> Response:
    backend = state.ready_backend()
    arrival = time.monotonic()
    tokens = await asyncio.to_thread(backend.codec.tokenize_prompt, body.inputs)
    p = body.parameters
    sub = Submission(
        backend,
        [tokens],
        p.max_new_tokens,
        state.config.default_max_tokens,
        tgi_sampling(p),
        mapping.stop_strings(p.stop),
        TGI,
        "tgi",
        arrival=arrival,
    )
    _, gens = await submit(state, request, sub)
    (out,) = await outcomes(state, request, gens, [body.inputs])
    text = body.inputs + out.text if p.return_full_text else out.text
    return JSONResponse([{"generated_text": text}])
