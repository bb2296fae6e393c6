"""Server-sent events for streamed completions, as OpenAI sends them.

Chat: a role chunk, content chunks, a chunk with `finish_reason` (and llama-server's `timings`),
an optional usage chunk (`stream_options.include_usage`), then `data: [DONE]`. Text completions
likewise, with one `index` per prompt. An error after the reply has started (timeout, engine
failure) is one `data: {"error": {...}}` event followed by `data: [DONE]`.

While a stream waits it sends `: keep-alive` comments every `StreamSpec.keepalive` seconds
(pipeline/sse.py frames the events and the keep-alives).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from outpost.api.openai import render
from outpost.api.pipeline.chat_plan import ChatPlan
from outpost.api.pipeline.generation import Generation, Outcome, failure, outcome_error
from outpost.api.pipeline.sse import DONE, merge, sse, with_keepalive
from outpost.api.record import RequestRecord
from outpost.backend import PromptCodec
from outpost.messages import FinishReason


@dataclass
class StreamSpec:
    """What a stream needs besides its generations."""

    rid: str
    model: str
    codec: PromptCodec
    logprobs: bool
    include_usage: bool
    timeout: float
    record: RequestRecord
    log_prompts: bool
    prompts: list[str]
    chat: ChatPlan | None = None  # chat streams: reads tool calls and reasoning out of the text
    keepalive: float = 15.0  # seconds without an event before a KEEPALIVE comment; 0: never


def chat_stream(gens: list[Generation], spec: StreamSpec) -> AsyncIterator[bytes]:
    """One choice per generation (n > 1: their chunks interleave, each with its `index`)."""
    body = _chat_stream(gens[0], spec) if len(gens) == 1 else _chat_choices(gens, spec)
    return with_keepalive(body, spec.keepalive)


async def _chat_choices(gens: list[Generation], spec: StreamSpec) -> AsyncIterator[bytes]:
    outs: list[Outcome] = []
    one = dataclasses.replace(spec, include_usage=False)
    streams = [_chat_stream(g, one, index=i, outs=outs) for i, g in enumerate(gens)]
    async for _, chunk in merge(streams):
        yield chunk
    if spec.include_usage and len(outs) == len(gens):
        use, timings = render.choices_usage(outs), outs[0].timings.as_dict()
        yield sse(
            render.usage_chunk("chat.completion.chunk", spec.rid, spec.model, int(time.time()), use, timings)
        )
    yield DONE


def completion_stream(gens: list[Generation], spec: StreamSpec) -> AsyncIterator[bytes]:
    return with_keepalive(_completion_stream(gens, spec), spec.keepalive)


async def _chat_stream(
    gen: Generation, spec: StreamSpec, index: int = 0, outs: list[Outcome] | None = None
) -> AsyncIterator[bytes]:
    """One choice's chunks; with `outs` (one of n choices) its outcome goes there and no [DONE]."""
    created = int(time.time())
    out = gen.new_outcome()
    plan = spec.chat or ChatPlan("", think=False)
    reader = plan.output()
    chunk = functools.partial(render.chat_chunk, spec.rid, spec.model, created, index=index)
    yield sse(chunk({"role": "assistant", "content": ""}))
    try:
        async for event in gen.events():
            out.add(event)
            lp = (
                render.chat_logprobs(spec.codec, event.logprobs) if spec.logprobs and event.logprobs else None
            )
            delta = reader.feed(event.text) if event.text else {}
            if delta or lp:
                yield sse(chunk(delta, logprobs=lp))
            if not event.finished:
                continue
            err = outcome_error(out, spec.timeout)
            if err is not None:
                yield sse(err.body())
                break
            for delta in reader.finish(truncated=event.finish_reason is FinishReason.LENGTH):
                yield sse(chunk(delta))
            timings = out.timings.as_dict()
            reason = plan.finish_reason(render.finish_reason(event.finish_reason), bool(reader.tool_calls))
            last = chunk({}, finish=reason, timings=timings)
            if outs is not None:
                outs.append(out)
            if reader.dropped_call:
                last["choices"][0][render.DROPPED_CALL] = True
            yield sse(last)
            if spec.include_usage:
                use = render.usage(out.n_prompt, len(out.token_ids), out.timings.cache_n)
                yield sse(
                    render.usage_chunk("chat.completion.chunk", spec.rid, spec.model, created, use, timings)
                )
    except Exception as exc:
        yield sse(failure(exc).body())
    finally:
        spec.record.add_outcome(out, spec.prompts[0], spec.log_prompts)
    if outs is None:
        yield DONE


async def _completion_stream(gens: list[Generation], spec: StreamSpec) -> AsyncIterator[bytes]:
    created = int(time.time())
    outs = [g.new_outcome() for g in gens]
    try:
        async for index, event in merge([g.events() for g in gens]):
            out = outs[index]
            out.add(event)
            lp = None
            if spec.logprobs and event.logprobs:
                lp = render.completion_logprobs(spec.codec, event.logprobs, len(out.text) - len(event.text))
            err = outcome_error(out, spec.timeout) if event.finished else None
            if err is not None:
                yield sse(err.body())
                break
            if event.text or lp or event.finished:
                reason = render.finish_reason(event.finish_reason)
                yield sse(render.text_chunk(spec.rid, spec.model, created, index, event.text, lp, reason))
        else:
            if spec.include_usage:
                use, timings = render.total_usage(outs), outs[0].timings.as_dict()
                yield sse(render.usage_chunk("text_completion", spec.rid, spec.model, created, use, timings))
    except Exception as exc:
        yield sse(failure(exc).body())
    finally:
        for prompt, out in zip(spec.prompts, outs, strict=False):
            spec.record.add_outcome(out, prompt, spec.log_prompts)
    yield DONE
