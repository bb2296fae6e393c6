"""llama-server's native completion API: `POST /completion`, as its web UI and scripts call it.

The body (`llama/schemas.py`) becomes one `GenerateRequest` per prompt with llama-server's
defaults; the reply is one result object (or, for several prompts, a list of them), and a stream
is `data: {...}` chunks carrying `content`, ending with a `stop: true` chunk holding `timings`,
`generation_settings` and `stop_type`, with no `[DONE]` (llama-server sends none on native routes).
`POST /completions` (no /v1) is the same route, as on llama-server; OpenAI's shape is /v1/completions'.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from outpost.api.errors import bad_request
from outpost.api.llama import render as native_render
from outpost.api.llama.render import NativeSpec
from outpost.api.llama.schemas import (
    DEFAULT_SAMPLERS,
    SAMPLER_NAMES,
    NativeCompletionRequest,
    PromptPiece,
    prompt_pieces,
)
from outpost.api.pipeline import mapping
from outpost.api.pipeline.generation import Generation, Outcome, failure, outcome_error
from outpost.api.pipeline.sse import merge, sse, sse_response, with_keepalive
from outpost.api.pipeline.submit import Submission, outcomes, submit
from outpost.api.state import state_of
from outpost.backend import InferenceBackend, PromptCodec
from outpost.messages import SamplingParams

router = APIRouter()

NATIVE = mapping.Names("prompt", "n_predict")


def _logit_bias(
    codec: PromptCodec, raw: list[list[Any]] | dict[str, float | bool] | None
) -> dict[str, float]:
    """llama-server's `[[id, bias]]` pairs or `{"id": bias}`, `false` banning the token -> OpenAI's form."""
    pairs = raw.items() if isinstance(raw, dict) else [tuple(p) for p in raw or []]
    out: dict[str, float] = {}
    for pair in pairs:
        if len(pair) != 2 or not isinstance(pair[1], int | float | bool):
            raise bad_request("logit_bias entries are [token id, bias or false]", param="logit_bias")
        key, value = pair
        text = isinstance(key, str) and not key.lstrip("-").isdigit()  # llama-server biases its tokens
        for token in codec.tokenize(key, add_special=False) if text else [key]:
            out[str(token)] = -100.0 if value is False else float(value)
    return out


# llama-server's one-letter sampler names, e.g. "kfypmt" (a letter not here is skipped)
_LETTERS = dict(
    zip("dkypmxtse", "dry top_k typ_p top_p min_p xtc temperature top_n_sigma penalties".split(), strict=True)
)
# What a sampler left out of `samplers` leaves its settings at: switched off.
_OFF: dict[str, dict[str, Any]] = {
    "top_k": {"top_k": 0},
    "top_p": {"top_p": 1.0},
    "min_p": {"min_p": 0.0},
    "typ_p": {"typical_p": 1.0},
    "penalties": {"repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0},
}


def _samplers(body: NativeCompletionRequest) -> tuple[str, ...]:
    if body.samplers is None:
        return DEFAULT_SAMPLERS
    if isinstance(body.samplers, str):
        return tuple(_LETTERS[c] for c in body.samplers if c in _LETTERS)
    return tuple(SAMPLER_NAMES[n] for n in body.samplers)


def sampling(
    codec: PromptCodec, body: NativeCompletionRequest, chain: tuple[str, ...], d: SamplingParams
) -> SamplingParams:
    """`d` (llama-server's defaults, with the server's --temp/--seed) fill what the body leaves
    out; a sampler left out of `samplers` is switched off."""
    params = mapping.given_sampling(
        d,
        body,
        typical_p=d.typical_p if body.typical_p is None else body.typical_p,
        penalty_last_n=d.penalty_last_n if body.repeat_last_n is None else body.repeat_last_n,
        logit_bias=mapping.logit_bias(codec, _logit_bias(codec, body.logit_bias)),
        ignore_eos=body.ignore_eos,
        grammar=mapping.field_grammar(body.grammar, body.json_schema),
        n_probs=body.n_probs if body.n_probs > 0 else -1,
    )
    for name, change in _OFF.items():
        if name not in chain:
            params = dataclasses.replace(params, **change)
    return params


def _shown_budget(requested: int | None, cap: int) -> int:
    """`generation_settings.n_predict`: the request's, under the server's `-n` (-1: none)."""
    if requested is None or requested == -1:
        return cap
    return min(requested, cap) if cap > 0 else requested


def _slot(id_slot: int | None, backend: InferenceBackend) -> int:
    """llama-server's `id_slot`: the slot to run in (-1 or none: any); another number is a 400."""
    if id_slot is None or id_slot == -1:
        return -1
    total = backend.stats().slots_total
    if not 0 <= id_slot < total:
        raise bad_request(
            f"id_slot {id_slot} is not a slot (0 to {total - 1}, or -1 for any)", param="id_slot"
        )
    return id_slot


@router.post("/completion", tags=["llama.cpp"])
@router.post("/completions", include_in_schema=False)  # llama-server's: native too (OpenAI's is /v1's)
async def completion(body: NativeCompletionRequest, request: Request) -> Response:
    """llama-server's native completion (text, token ids or both; `stream` for SSE chunks)."""
    served = state_of(request).backend_for(body.model)
    codec = served[1].codec
    pieces = prompt_pieces(body.prompt)
    token_lists = [await asyncio.to_thread(mapping.mixed_tokens, codec, p) for p in pieces]
    texts = [prompt_text(codec, pc) for pc in pieces]
    return await run(request, body, served, token_lists, texts)


def prompt_text(codec: PromptCodec, pieces: Sequence[PromptPiece]) -> str:
    """A prompt of text and token ids as text, for the reply's `prompt`: each run of ids is
    detokenized whole, since a character's bytes may lie in several tokens."""
    text: list[str] = []
    for ids, run in itertools.groupby(pieces, key=lambda p: isinstance(p, int)):
        group = list(run)
        ints, strs = [p for p in group if isinstance(p, int)], [p for p in group if isinstance(p, str)]
        text.append(codec.detokenize(ints) if ids else "".join(strs))
    return "".join(text)


async def run(
    request: Request,
    body: NativeCompletionRequest,
    served: tuple[str, InferenceBackend],
    token_lists: list[list[int]],
    texts: list[str],
) -> Response:
    """Generate for each prompt with `body`'s settings; the native result(s) or stream."""
    state = state_of(request)
    model_id, backend = served
    codec = backend.codec
    arrival = time.monotonic()
    cfg = state.config
    if any(not t for t in token_lists):
        raise bad_request("the prompt is empty", param="prompt")
    chain = _samplers(body)
    params = sampling(codec, body, chain, state.sampling_defaults)
    stop = mapping.stop_strings(body.stop)
    requested = body.n_predict if body.n_predict is not None else body.max_tokens
    slot = _slot(body.id_slot, backend)
    sub = Submission(
        backend,
        token_lists,
        requested,
        backend.n_ctx_seq,  # no n_predict: what the context leaves, as llama-server
        params,
        stop,
        NATIVE,
        "cmpl",
        slot=slot,
        progress=body.stream and bool(body.return_progress),  # as llama-server: streams only
        lora=mapping.lora(body.lora),
        arrival=arrival,
    )
    spec = NativeSpec(
        model=model_id,
        codec=codec,
        sampling=params,
        n_predict=_shown_budget(requested, cfg.n_predict),
        stop=stop,
        samplers=chain,
        stream=body.stream,
        return_tokens=body.return_tokens,
        post_sampling_probs=body.post_sampling_probs,
        slot=slot,
    )
    _, gens = await submit(state, request, sub)
    if body.stream:
        stream = _stream(gens, spec, texts, cfg.request_timeout)
        return sse_response(with_keepalive(stream, cfg.sse_keepalive), gens)
    outs = await outcomes(state, request, gens, texts)
    results = [native_render.final(spec, i, o, texts[i]) for i, o in enumerate(outs)]
    return JSONResponse(results[0] if len(results) == 1 else results)


async def _stream(
    gens: list[Generation], spec: NativeSpec, prompts: list[str], timeout: float
) -> AsyncIterator[bytes]:
    """Each prompt's chunks as they come; a failure ends the stream with one error chunk."""
    outs: list[Outcome] = [g.new_outcome() for g in gens]
    try:
        async for index, event in merge([g.events() for g in gens]):
            out = outs[index]
            out.add(event)
            if event.progress is not None:
                yield sse(native_render.progress(spec, index, out, event.progress))
            if event.text or event.token_ids:
                lps = event.logprobs or []
                yield sse(native_render.partial(spec, index, out, event.text, event.token_ids, lps))
            if not event.finished:
                continue
            if (err := outcome_error(out, timeout)) is not None:
                yield sse(err.body())
                return
            yield sse(native_render.final(spec, index, out, prompts[index]))
    except Exception as exc:
        yield sse(failure(exc).body())
