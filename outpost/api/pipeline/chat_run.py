"""One chat request through the pipeline, for every API that speaks chat: start it, read its answer.

`start_chat` plans, tokenizes, budgets and submits a `ChatCompletionRequest` (which the Responses,
Anthropic and Ollama routes build from their own bodies); `answer_parts` and `collect` read the
answer as the chat output reader splits it, so each API only translates `Part`s and the `Ending`
into its own events or objects.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from outpost.api.errors import ApiError
from outpost.api.pipeline import chat_plan, mapping
from outpost.api.pipeline.chat_plan import ChatPlan
from outpost.api.pipeline.generation import Generation, Outcome, outcome_error, until_disconnect
from outpost.api.pipeline.schemas import ChatCompletionRequest
from outpost.api.pipeline.submit import Submission, submit
from outpost.api.record import record_of
from outpost.api.state import ServerState
from outpost.backend import InferenceBackend
from outpost.messages import FinishReason


@dataclass
class ChatRun:
    """A started chat generation and what reading its answer needs."""

    model_id: str
    backend: InferenceBackend
    plan: ChatPlan
    gen: Generation
    rid: str
    prompt: str
    stops: tuple[str, ...]
    gens: list[Generation] = field(default_factory=list)  # n choices (chat's `n`); gens[0] is `gen`


@dataclass(frozen=True)
class Part:
    reasoning: str = ""
    content: str = ""


@dataclass
class Ending:
    """How the answer ended: `finish` is OpenAI's chat finish reason (stop, length, tool_calls)."""

    finish: str
    out: Outcome
    calls: list[dict[str, Any]] = field(default_factory=list)
    stop_string: str | None = None  # the stop string that ended it, if one did


def _max_tokens(body: ChatCompletionRequest) -> tuple[int | None, str]:
    if body.max_completion_tokens is not None:
        return body.max_completion_tokens, "max_completion_tokens"
    return body.max_tokens, "max_tokens"


@dataclass(frozen=True)
class Protocol:
    """How an API that speaks chat differs in its request: its id prefix, its field names (errors
    name them), and how many choices it can answer with (`n`)."""

    prefix: str = "chatcmpl"
    names: mapping.Names | None = None  # None: chat's own (max_tokens or max_completion_tokens)
    most_choices: int = mapping.MAX_N


CHAT = Protocol()


async def plan_for(state: ServerState, body: ChatCompletionRequest) -> tuple[str, InferenceBackend, ChatPlan]:
    model_id, backend = state.backend_for(body.model)
    return model_id, backend, await plan_on(state, backend, body)


async def plan_on(state: ServerState, backend: InferenceBackend, body: ChatCompletionRequest) -> ChatPlan:
    """`body`'s chat plan over `backend`'s template, with the server's reasoning settings."""
    render_with = functools.partial(mapping.render_dicts, backend.codec)
    cfg = state.config
    return await asyncio.to_thread(
        chat_plan.prepare,
        body,
        render_with,
        backend.codec.chat_template_source,
        cfg.reasoning_format,
        cfg.reasoning != "off",
    )


async def input_tokens(state: ServerState, body: ChatCompletionRequest) -> int:
    """The prompt tokens `body` would take (llama-server's and Anthropic's token-count routes)."""
    _, backend, plan = await plan_for(state, body)
    return len(await asyncio.to_thread(mapping.prompt_tokens, backend.codec, plan.prompt))


async def start_chat(
    state: ServerState, body: ChatCompletionRequest, request: Request, protocol: Protocol = CHAT
) -> ChatRun:
    """Plan, tokenize, budget and submit `body`; refusals are ApiErrors before any reply byte, naming
    the fields as the protocol calls them."""
    names = protocol.names or mapping.Names("messages", _max_tokens(body)[1])
    arrival = time.monotonic()
    try:
        n = mapping.check_n(body.n, protocol.most_choices)
        model_id, backend, plan = await plan_for(state, body)
        codec = backend.codec
        tokens = await asyncio.to_thread(mapping.prompt_tokens, codec, plan.prompt)
        n_probs = (body.top_logprobs or 0) if body.logprobs else -1
        sampling = plan.sampling(mapping.sampling_params(codec, body, n_probs, state.sampling_defaults))
        stops = mapping.stop_strings(body.stop)
        sub = Submission(
            backend,
            [tokens],
            _max_tokens(body)[0],
            state.config.default_max_tokens,
            sampling,
            stops,
            names,
            protocol.prefix,
            choices=n,
            spec=mapping.speculative(body),
            lora=mapping.lora(body.lora),
            arrival=arrival,
        )
        rid, gens = await submit(state, request, sub)
    except ApiError as err:
        err.param = names.rename(err.param)
        raise
    return ChatRun(model_id, backend, plan, gens[0], rid, plan.prompt, stops, gens)


def _stop_string(run: ChatRun, out: Outcome, last_ids: list[int]) -> str | None:
    """The stop string that ended `out`: the engine ends on one with the token that completed it,
    while an end-of-generation token is never in token_ids (scheduler._on_token)."""
    if out.finish is not FinishReason.STOP or not last_ids or not run.stops:
        return None
    if len(run.stops) == 1:
        return run.stops[0]
    tail = run.backend.codec.detokenize(out.token_ids)[max(0, len(out.text) - 1) :]
    found = [(tail.find(s), s) for s in run.stops if s in tail]
    return min(found)[1] if found else run.stops[0]


async def answer_parts(run: ChatRun, timeout: float) -> AsyncIterator[Part | Ending]:
    """The answer as it streams; a failed finish (timeout, engine error, abort) raises its ApiError."""
    out = run.gen.new_outcome()
    reader = run.plan.output()
    async for event in run.gen.events():
        out.add(event)
        delta = reader.feed(event.text) if event.text else {}
        if delta:
            yield Part(delta.get("reasoning_content", ""), delta.get("content", ""))
        if not event.finished:
            continue
        if (err := outcome_error(out, timeout)) is not None:
            raise err
        for delta in reader.finish(truncated=event.finish_reason is FinishReason.LENGTH):
            if "tool_calls" not in delta:
                yield Part(delta.get("reasoning_content", ""), delta.get("content", ""))
        base = "length" if event.finish_reason is FinishReason.LENGTH else "stop"
        finish = run.plan.finish_reason(base, bool(reader.tool_calls)) or base
        stop = _stop_string(run, out, event.token_ids)
        yield Ending(finish, out, list(reader.tool_calls), stop)
        return


@dataclass
class Answer:
    reasoning: str
    content: str
    ending: Ending


async def _gather(run: ChatRun, timeout: float) -> Answer:
    reasoning: list[str] = []
    content: list[str] = []
    async for piece in answer_parts(run, timeout):
        if isinstance(piece, Ending):
            return Answer("".join(reasoning), "".join(content), piece)
        reasoning.append(piece.reasoning)
        content.append(piece.content)
    raise ApiError(503, "the request ended without an answer", code="aborted")


async def collect(state: ServerState, request: Request, run: ChatRun) -> Answer:
    """The whole answer of a reply that is not streamed; a client that hangs up aborts it."""
    cfg = state.config
    answer = await until_disconnect(request.receive, _gather(run, cfg.request_timeout))
    record_of(request).add_outcome(answer.ending.out, run.prompt, cfg.log_prompts)
    return answer
