"""llama-server's native reply objects: `/completion`'s result, its stream chunks and probabilities.

Shapes follow llama.cpp's tools/server/server-task.cpp (`task_result_cmpl_final` /
`task_result_cmpl_partial` `to_json_non_oaicompat`, `completion_token_output::probs_to_json`).
Pure functions of an `Outcome` or `TokenEvent`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from outpost.api.llama.schemas import DEFAULT_SAMPLERS
from outpost.api.openai.render import json_logprob, piece
from outpost.api.pipeline.generation import Outcome
from outpost.backend import PromptCodec
from outpost.messages import FinishReason, GenerateRequest, PromptProgress, SamplingParams, TokenLogprob


@dataclass(frozen=True)
class NativeSpec:
    """What every reply of one /completion request repeats."""

    model: str
    codec: PromptCodec
    sampling: SamplingParams
    n_predict: int
    stop: tuple[str, ...]
    samplers: tuple[str, ...]
    stream: bool
    return_tokens: bool
    post_sampling_probs: bool
    slot: int = -1  # the `id_slot` asked for (-1: any); the last chunk says the one used


def stop_type(out: Outcome, codec: PromptCodec, stop: tuple[str, ...]) -> tuple[str, str]:
    """llama-server's `stop_type` ("eos", "word", "limit", "none") and `stopping_word`."""
    if out.finish is FinishReason.LENGTH:
        return "limit", ""
    if out.finish is not FinishReason.STOP:
        return "none", ""
    generated = codec.detokenize(out.token_ids)[len(out.text) :] if stop else ""
    word = next((s for s in stop if s in generated), "")
    return ("word", word) if word else ("eos", "")


def _prob_entry(codec: PromptCodec, token: int, logprob: float, as_prob: bool) -> dict[str, Any]:
    text, raw = piece(codec, token)
    entry: dict[str, Any] = {"id": token, "token": text, "bytes": raw}
    if as_prob:
        entry["prob"] = math.exp(logprob) if math.isfinite(logprob) else 0.0
    else:
        entry["logprob"] = json_logprob(logprob)
    return entry


def probabilities(codec: PromptCodec, items: list[TokenLogprob], as_prob: bool) -> list[dict[str, Any]]:
    """`completion_probabilities`: each token with its logprob (or prob) and its top alternatives."""
    out = []
    for lp in items:
        entry = _prob_entry(codec, lp.token, lp.logprob, as_prob)
        top = [_prob_entry(codec, t, v, as_prob) for t, v in lp.top]
        entry["top_probs" if as_prob else "top_logprobs"] = top
        out.append(entry)
    return out


def sampler_settings(s: SamplingParams, n_predict: int) -> dict[str, Any]:
    """The sampler's fields of llama-server's `generation_settings` (and of /props' `params`)."""
    return {
        "n_predict": n_predict,
        "seed": -1 if s.seed is None else s.seed,
        "temperature": s.temperature,
        "top_k": s.top_k,
        "top_p": s.top_p,
        "min_p": s.min_p,
        "typical_p": s.typical_p,
        "repeat_last_n": s.penalty_last_n,
        "repeat_penalty": s.repeat_penalty,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
    }


def generation_settings(spec: NativeSpec) -> dict[str, Any]:
    s = spec.sampling
    return {
        **sampler_settings(s, spec.n_predict),
        "stop": list(spec.stop),
        "max_tokens": spec.n_predict,
        "n_probs": max(0, s.n_probs),
        "ignore_eos": s.ignore_eos,
        "stream": spec.stream,
        "logit_bias": [[t, b if math.isfinite(b) else False] for t, b in s.logit_bias],
        "grammar": s.grammar or "",
        "samplers": list(spec.samplers),
        "post_sampling_probs": spec.post_sampling_probs,
    }


def final(spec: NativeSpec, index: int, out: Outcome, prompt: str) -> dict[str, Any]:
    """The last object: the whole result, or (streamed) the closing chunk with empty content."""
    kind, word = stop_type(out, spec.codec, spec.stop)
    content = "" if spec.stream else out.text
    tokens = out.token_ids if spec.return_tokens and not spec.stream else []
    res: dict[str, Any] = {
        "index": index,
        "content": content,
        "tokens": tokens,
        "id_slot": out.slot,
        "stop": True,
        "model": spec.model,
        "tokens_predicted": out.timings.predicted_n or len(out.token_ids),  # timings' count, as llama-server
        "tokens_evaluated": out.n_prompt,
        "generation_settings": generation_settings(spec),
        "prompt": prompt,
        "has_new_line": "\n" in out.text,
        "truncated": False,
        "stop_type": kind,
        "stopping_word": word,
        "tokens_cached": out.n_prompt + len(out.token_ids),
        "timings": out.timings.as_dict(),
    }
    if not spec.stream and out.logprobs:
        res["completion_probabilities"] = probabilities(spec.codec, out.logprobs, spec.post_sampling_probs)
    return res


def verbose(
    model: str, codec: PromptCodec, req: GenerateRequest, out: Outcome, prompt: str
) -> dict[str, Any]:
    """llama-server's `__verbose` on an OpenAI reply (a request's `verbose`): the native result."""
    chain = DEFAULT_SAMPLERS
    spec = NativeSpec(model, codec, req.sampling, req.max_tokens, req.stop, chain, False, False, False)
    return final(spec, 0, out, prompt)


def progress(spec: NativeSpec, index: int, out: Outcome, read: PromptProgress) -> dict[str, Any]:
    """llama-server's `return_progress` chunk: no content, `prompt_progress` as the prompt is read."""
    return {**partial(spec, index, out, "", [], []), "prompt_progress": read.as_dict()}


def partial(
    spec: NativeSpec, index: int, out: Outcome, text: str, tokens: list[int], probs: list[TokenLogprob]
) -> dict[str, Any]:
    res: dict[str, Any] = {
        "index": index,
        "content": text,
        "tokens": tokens if spec.return_tokens else [],
        "stop": False,
        "id_slot": spec.slot,
        "tokens_predicted": len(out.token_ids),
        "tokens_evaluated": out.n_prompt,
    }
    if probs:
        res["completion_probabilities"] = probabilities(spec.codec, probs, spec.post_sampling_probs)
    return res
