"""OpenAI reply objects as plain dicts: chat.completion(.chunk), text_completion, usage, logprobs.

Pure functions of an `Outcome` or `TokenEvent`; token text for logprobs comes from the engine's
vocabulary (`PromptCodec.token_piece`).
"""

from __future__ import annotations

import math
import time
from typing import Any

from outpost.api.pipeline.generation import Outcome
from outpost.backend import PromptCodec
from outpost.messages import FinishReason, Timings, TokenLogprob

FINGERPRINT = "outpost"
# A choice field set when the answer hit max_tokens inside a tool call: the complete calls are in
# `tool_calls` (finish_reason "tool_calls"), the cut one was dropped.
DROPPED_CALL = "truncated_tool_call"


def finish_reason(reason: FinishReason | None) -> str | None:
    if reason is None:
        return None
    return "length" if reason is FinishReason.LENGTH else "stop"


def usage(n_prompt: int, n_completion: int, cached: int = 0) -> dict[str, Any]:
    return {
        "prompt_tokens": n_prompt,
        "completion_tokens": n_completion,
        "total_tokens": n_prompt + n_completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def choices_usage(outs: list[Outcome]) -> dict[str, Any]:
    """The usage of n choices of one prompt: the prompt counted once, as OpenAI counts them."""
    return usage(outs[0].n_prompt, sum(len(o.token_ids) for o in outs), outs[0].timings.cache_n)


def total_usage(outs: list[Outcome]) -> dict[str, Any]:
    """The usage of several prompts' choices: every prompt counted."""
    n_prompt, cached = sum(o.n_prompt for o in outs), sum(o.timings.cache_n for o in outs)
    return usage(n_prompt, sum(len(o.token_ids) for o in outs), cached)


def json_logprob(value: float) -> float:
    """A JSON-safe logprob: OpenAI's -9999.0 stands for -inf (a banned token)."""
    return value if math.isfinite(value) else -9999.0


def piece(codec: PromptCodec, token: int) -> tuple[str, list[int]]:
    """A token's text (invalid UTF-8 replaced) and its raw bytes."""
    raw = codec.token_piece(token)
    return raw.decode("utf-8", errors="replace"), list(raw)


def chat_logprobs(codec: PromptCodec, items: list[TokenLogprob]) -> dict[str, Any]:
    content = []
    for lp in items:
        text, raw = piece(codec, lp.token)
        top = []
        for token, value in lp.top:
            t_text, t_raw = piece(codec, token)
            top.append({"token": t_text, "logprob": json_logprob(value), "bytes": t_raw})
        content.append(
            {"token": text, "logprob": json_logprob(lp.logprob), "bytes": raw, "top_logprobs": top}
        )
    return {"content": content, "refusal": None}


def completion_logprobs(codec: PromptCodec, items: list[TokenLogprob], offset: int = 0) -> dict[str, Any]:
    tokens, values, tops, offsets = [], [], [], []
    for lp in items:
        text, _ = piece(codec, lp.token)
        tokens.append(text)
        values.append(json_logprob(lp.logprob))
        tops.append({piece(codec, t)[0]: json_logprob(v) for t, v in lp.top})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def _head(obj: str, rid: str, model: str, created: int | None) -> dict[str, Any]:
    return {
        "id": rid,
        "object": obj,
        "created": created or int(time.time()),
        "model": model,
        "system_fingerprint": FINGERPRINT,
    }


def chat_completion(
    rid: str, model: str, choices: list[dict[str, Any]], outs: list[Outcome]
) -> dict[str, Any]:
    reply = _head("chat.completion", rid, model, None)
    reply["choices"] = choices
    reply["usage"] = choices_usage(outs)
    reply["timings"] = outs[0].timings.as_dict()
    return reply


def text_completion(
    rid: str, model: str, outs: list[Outcome], codec: PromptCodec, with_logprobs: bool, prefixes: list[str]
) -> dict[str, Any]:
    reply = _head("text_completion", rid, model, None)
    reply["choices"] = [
        {
            "index": i,
            "text": prefixes[i] + out.text,
            "logprobs": completion_logprobs(codec, out.logprobs, len(prefixes[i])) if with_logprobs else None,
            "finish_reason": finish_reason(out.finish),
        }
        for i, out in enumerate(outs)
    ]
    reply["usage"] = total_usage(outs)
    reply["timings"] = outs[0].timings.as_dict() if len(outs) == 1 else _sum_timings(outs)
    return reply


def _sum_timings(outs: list[Outcome]) -> dict[str, float | int]:
    total = Timings()
    for o in outs:
        t = o.timings
        total.prompt_n += t.prompt_n
        total.predicted_n += t.predicted_n
        total.cache_n += t.cache_n
        total.prompt_ms = max(total.prompt_ms, t.prompt_ms)
        total.predicted_ms = max(total.predicted_ms, t.predicted_ms)
        total.queue_ms = max(total.queue_ms, t.queue_ms)
    return total.as_dict()


def chat_chunk(rid: str, model: str, created: int, delta: dict[str, Any], **extra: Any) -> dict[str, Any]:
    choice = {"index": extra.pop("index", 0), "delta": delta, "logprobs": extra.pop("logprobs", None)}
    choice["finish_reason"] = extra.pop("finish", None)
    return {**_head("chat.completion.chunk", rid, model, created), "choices": [choice], **extra}


def text_chunk(
    rid: str, model: str, created: int, index: int, text: str, logprobs: Any = None, finish: str | None = None
) -> dict[str, Any]:
    chunk = _head("text_completion", rid, model, created)
    chunk["choices"] = [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}]
    return chunk


def usage_chunk(
    obj: str, rid: str, model: str, created: int, use: dict[str, Any], timings: Any
) -> dict[str, Any]:
    return {**_head(obj, rid, model, created), "choices": [], "usage": use, "timings": timings}
