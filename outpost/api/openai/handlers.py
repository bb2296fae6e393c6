"""Chat and text completions, shared by the OpenAI routes and SageMaker's /invocations.

Each handler validates against the model, builds `GenerateRequest`s, submits them (admission
errors become 429/400 before any reply byte), then either streams SSE or waits for the outcome
while watching for the client hanging up.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from outpost.api.llama import render as native_render
from outpost.api.openai import render
from outpost.api.openai.streaming import StreamSpec, chat_stream, completion_stream
from outpost.api.pipeline import mapping
from outpost.api.pipeline.chat_plan import ChatPlan
from outpost.api.pipeline.chat_run import start_chat
from outpost.api.pipeline.generation import Outcome
from outpost.api.pipeline.schemas import ChatCompletionRequest, CompletionRequest
from outpost.api.pipeline.sse import sse_response
from outpost.api.pipeline.submit import Submission, outcomes, submit
from outpost.api.record import record_of
from outpost.api.state import ServerState
from outpost.backend import InferenceBackend, PromptCodec
from outpost.messages import FinishReason

COMPLETION = mapping.Names("prompt", "max_tokens")


def _spec(
    state: ServerState,
    request: Request,
    served: tuple[str, InferenceBackend],
    rid: str,
    logprobs: bool,
    body: Any,
    prompts: list[str],
) -> StreamSpec:
    opts = body.stream_options
    return StreamSpec(
        rid=rid,
        model=served[0],
        codec=served[1].codec,
        logprobs=logprobs,
        include_usage=bool(opts and opts.include_usage),
        timeout=state.config.request_timeout,
        record=record_of(request),
        log_prompts=state.config.log_prompts,
        prompts=prompts,
        keepalive=state.config.sse_keepalive,
    )


async def handle_chat(state: ServerState, body: ChatCompletionRequest, request: Request) -> Response:
    run = await start_chat(state, body, request)
    gens, codec = run.gens, run.backend.codec
    if body.stream:
        served = (run.model_id, run.backend)
        spec = _spec(state, request, served, run.rid, bool(body.logprobs), body, [run.prompt])
        spec.chat = run.plan
        return sse_response(chat_stream(gens, spec), gens)
    outs = await outcomes(state, request, gens, [run.prompt] * len(gens))
    choices = [_chat_choice(run.plan, i, out, codec, bool(body.logprobs)) for i, out in enumerate(outs)]
    reply = render.chat_completion(run.rid, run.model_id, choices, outs)
    if body.verbose:
        reply["__verbose"] = native_render.verbose(run.model_id, codec, gens[0].request, outs[0], run.prompt)
    return JSONResponse(reply)


def _chat_choice(
    plan: ChatPlan, index: int, out: Outcome, codec: PromptCodec, logprobs: bool
) -> dict[str, Any]:
    """One choice's message, read for tool calls and reasoning."""
    reader = plan.output()
    message = reader.message(out.text, truncated=out.finish is FinishReason.LENGTH)
    choice = {
        "index": index,
        "message": message,
        "logprobs": render.chat_logprobs(codec, out.logprobs) if logprobs else None,
        "finish_reason": plan.finish_reason(render.finish_reason(out.finish), bool(reader.tool_calls)),
    }
    if reader.dropped_call:
        choice[render.DROPPED_CALL] = True
    return choice


def _prompts(body: CompletionRequest) -> list[str | list[int]]:
    prompt = body.prompt
    if isinstance(prompt, str):
        return [prompt]
    strings = [p for p in prompt if isinstance(p, str)]
    if len(strings) == len(prompt):
        return list(strings)
    return [[p for p in prompt if isinstance(p, int)]]


async def handle_completion(state: ServerState, body: CompletionRequest, request: Request) -> Response:
    model_id, backend = served = state.backend_for(body.model)
    codec = backend.codec
    arrival = time.monotonic()
    n = mapping.check_n(body.n)
    cfg = state.config
    prompts = _prompts(body)
    token_lists = [await asyncio.to_thread(mapping.prompt_tokens, codec, p) for p in prompts]
    n_probs = body.logprobs if body.logprobs is not None else -1
    sampling = mapping.sampling_params(codec, body, n_probs, state.sampling_defaults)
    # choice index i*n + j, as OpenAI orders n choices of several prompts
    sub = Submission(
        backend,
        token_lists,
        body.max_tokens,
        cfg.default_max_tokens,
        sampling,
        mapping.stop_strings(body.stop),
        COMPLETION,
        "cmpl",
        choices=n,
        spec=mapping.speculative(body),
        lora=mapping.lora(body.lora),
        arrival=arrival,
    )
    rid, gens = await submit(state, request, sub)
    wants_text = cfg.log_prompts or bool(body.echo)
    texts = [p if isinstance(p, str) else codec.detokenize(p) if wants_text else "" for p in prompts]
    texts = [t for t in texts for _ in range(n)]
    if body.stream:
        spec = _spec(state, request, served, rid, body.logprobs is not None, body, texts)
        return sse_response(completion_stream(gens, spec), gens)
    outs = await outcomes(state, request, gens, texts)
    prefixes = texts if body.echo else [""] * len(outs)
    reply = render.text_completion(rid, model_id, outs, codec, body.logprobs is not None, prefixes)
    if body.verbose:
        reply["__verbose"] = native_render.verbose(model_id, codec, gens[0].request, outs[0], texts[0])
    return JSONResponse(reply)
