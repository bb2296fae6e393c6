"""Request bodies -> `GenerateRequest`: prompt tokens, token budget, sampler settings, stop strings.

The server's defaults are llama-server's (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05).
Every check that depends on the model (context length, token ids, chat template) happens here,
so the engine only ever sees requests it can serve.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from outpost.api.errors import ApiError, bad_request, context_length_exceeded
from outpost.api.pipeline.schemas import LoraField, ResponseFormat, SamplingFields
from outpost.backend import PromptCodec
from outpost.messages import ChatTemplateError, LoraScales, SamplingParams, SpecRequest, context_exceeded

DEFAULTS = SamplingParams()  # llama-server's defaults live in the dataclass


MAX_N = 16  # choices per request: each is a request of its own, sharing the prompt's KV
PROMPT_FIELDS = frozenset({"messages", "prompt", "inputs", "input"})
BUDGET_FIELDS = frozenset({"max_tokens", "max_completion_tokens", "n_predict", "max_new_tokens"})


@dataclasses.dataclass(frozen=True)
class Names:
    """What a protocol calls the prompt and the output budget: the fields its errors name."""

    prompt: str = "messages"
    max_tokens: str = "max_tokens"

    def rename(self, param: str | None) -> str | None:
        """Another protocol's (or the engine's) name for the prompt or the budget -> this one's."""
        if param in PROMPT_FIELDS:
            return self.prompt
        return self.max_tokens if param in BUDGET_FIELDS else param


def context_refusal(names: Names, n_prompt: int, max_tokens: int | None, n_ctx_seq: int) -> ApiError | None:
    """The 400 for a prompt (+ max_tokens) beyond `n_ctx_seq`, naming the protocol's fields, or None."""
    exceeded = context_exceeded(n_prompt, max_tokens, n_ctx_seq, names.max_tokens, names.prompt)
    if exceeded is None:
        return None
    return context_length_exceeded(str(exceeded), exceeded.param, (exceeded.n_prompt, exceeded.n_ctx))


def check_n(n: int | None, most: int = MAX_N) -> int:
    """The number of choices asked for (1 to MAX_N; to `most` on an API that answers with fewer)."""
    if n is None:
        return 1
    if not 1 <= n <= MAX_N:
        raise bad_request(f"n={n} is out of range: ask for 1 to {MAX_N} choices", param="n")
    if n > most:
        raise bad_request(f"n={n}: this API answers with {most} output per request", param="n")
    return n


def choice_sampling(params: SamplingParams, index: int) -> SamplingParams:
    """Choice `index`'s sampler: a fixed seed moves on by the index, so the choices differ
    (and stay reproducible) as OpenAI's do."""
    if index == 0 or params.seed is None:
        return params
    return dataclasses.replace(params, seed=(params.seed + index) & 0xFFFFFFFF)


def render_dicts(codec: PromptCodec, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    """The chat template on message dicts; `kwargs`: add_generation_prompt, tools, template variables."""
    try:
        return codec.render_chat(messages, **kwargs)
    except ChatTemplateError:
        raise
    except Exception as exc:  # a template's own jinja code failing on these messages
        raise bad_request(f"the chat template failed on these messages: {exc}", param="messages") from exc


def prompt_tokens(codec: PromptCodec, prompt: str | list[int]) -> list[int]:
    if isinstance(prompt, str):
        return codec.tokenize_prompt(prompt)
    check_token_ids(codec, prompt, "prompt")
    return list(prompt)


def check_token_ids(codec: PromptCodec, tokens: Sequence[int], param: str) -> None:
    n_vocab = codec.n_vocab
    if (bad := next((t for t in tokens if not 0 <= t < n_vocab), None)) is not None:
        raise bad_request(f"token id {bad} is out of range: the vocabulary has {n_vocab} tokens", param=param)


def mixed_tokens(
    codec: PromptCodec, pieces: Sequence[str | int], param: str = "prompt", special: bool = True
) -> list[int]:
    """Text pieces tokenized (BOS only before the first, as llama-server's tokenize_mixed), ids kept.
    special=False: no BOS and special tokens read as text (tokenize_mixed(..., false, false))."""
    out: list[int] = []
    ids = [p for p in pieces if isinstance(p, int)]
    check_token_ids(codec, ids, param)
    for i, piece in enumerate(pieces):
        if isinstance(piece, int):
            out.append(piece)
        elif not special:
            out += codec.tokenize(piece, add_special=False, parse_special=False) if piece else []
        elif i == 0:
            out += codec.tokenize_prompt(piece)
        else:
            out += codec.tokenize(piece, add_special=False)
    return out


def resolve_max_tokens(
    n_prompt: int, requested: int | None, n_ctx_seq: int, default: int, names: Names = Names()
) -> int:
    """The output budget; prompt + explicit max_tokens beyond the context is a 400."""
    explicit = None if requested is None or requested == -1 else requested
    if (refused := context_refusal(names, n_prompt, explicit, n_ctx_seq)) is not None:
        raise refused
    param = names.max_tokens
    room = n_ctx_seq - n_prompt
    if requested is None or requested == -1:
        return min(default, room) if requested is None else room
    if requested < 1:
        raise bad_request(
            f"{param} must be at least 1 (or -1 for as many as the context allows)", param=param
        )
    return requested


def stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else stop
    return tuple(s for s in items if s)


def logit_bias(codec: PromptCodec, bias: dict[str, float] | None) -> tuple[tuple[int, float], ...]:
    if not bias:
        return ()
    n_vocab = codec.n_vocab
    out: list[tuple[int, float]] = []
    for key, value in bias.items():
        try:
            token = int(key)
        except ValueError:
            raise bad_request(f"logit_bias keys must be token ids, got {key!r}", param="logit_bias") from None
        if not 0 <= token < n_vocab:
            raise bad_request(
                f"logit_bias token id {token} is out of range [0, {n_vocab})", param="logit_bias"
            )
        out.append((token, -math.inf if value <= -100.0 else value))
    return tuple(out)


def grammar_for(fmt: ResponseFormat | None) -> str | None:
    """GBNF text enforcing `response_format`; an unusable schema is a 400."""
    if fmt is None or fmt.type == "text":
        return None
    from outpost import grammar

    schema = fmt.json_schema.json_schema if fmt.json_schema is not None else fmt.inline_schema
    if fmt.type == "json_schema" and schema is None:
        raise bad_request("response_format json_schema needs json_schema.schema", param="response_format")
    return str(grammar.JSON_GRAMMAR) if schema is None else schema_grammar(schema, "response_format")


def gbnf(text: str, param: str = "grammar") -> str:
    """`text` if llama.cpp's grammar parser accepts it; a 400 naming the problem otherwise."""
    from outpost.grammar.gbnf import GrammarSyntaxError, check_gbnf

    try:
        check_gbnf(text)
    except GrammarSyntaxError as exc:
        raise bad_request(f"invalid grammar: {exc}", param=param) from exc
    return text


def schema_grammar(schema: dict[str, Any], param: str = "json_schema") -> str:
    from outpost import grammar

    try:
        return str(grammar.json_schema_to_grammar(schema))
    except ValueError as exc:
        raise bad_request(f"invalid JSON schema: {exc}", param=param) from exc


def field_grammar(grammar: str | None, schema: dict[str, Any] | None) -> str | None:
    """llama.cpp's top-level `grammar` / `json_schema` (one or the other, as llama-server says)."""
    if grammar is not None and schema is not None:
        raise bad_request('either "json_schema" or "grammar" can be given, not both', param="grammar")
    if schema is not None:
        return schema_grammar(schema)
    return gbnf(grammar) if grammar is not None else None


def body_grammar(body: SamplingFields) -> str | None:
    """The grammar of `response_format`, else of the top-level `grammar` / `json_schema`."""
    from_format = grammar_for(body.response_format)
    fields = field_grammar(body.grammar, body.json_schema)
    if from_format is not None and fields is not None:
        raise bad_request("give response_format or grammar/json_schema, not both", param="response_format")
    return from_format or fields


def server_defaults(temp: float | None, seed: int | None) -> SamplingParams:
    """llama-server's defaults with the server's --temp and --seed over them."""
    return dataclasses.replace(
        DEFAULTS, temperature=DEFAULTS.temperature if temp is None else temp, seed=seed
    )


def sampling_params(
    codec: PromptCodec, body: SamplingFields, n_probs: int = -1, defaults: SamplingParams = DEFAULTS
) -> SamplingParams:
    """`defaults` (`server_defaults`) fill what the request leaves out."""
    return given_sampling(
        defaults,
        body,
        logit_bias=logit_bias(codec, body.logit_bias),
        ignore_eos=bool(body.ignore_eos),
        grammar=body_grammar(body),
        n_probs=n_probs,
    )


def given_sampling(d: SamplingParams, body: Any, **fields: Any) -> SamplingParams:
    """`fields` and the sampler settings every protocol's body spells alike (OpenAI's
    `SamplingFields`, llama-server's native body), `d`'s where `body` leaves one out."""
    return SamplingParams(
        temperature=d.temperature if body.temperature is None else body.temperature,
        top_k=d.top_k if body.top_k is None else max(0, body.top_k),
        top_p=d.top_p if body.top_p is None else body.top_p,
        min_p=d.min_p if body.min_p is None else body.min_p,
        repeat_penalty=d.repeat_penalty if body.repeat_penalty is None else body.repeat_penalty,
        presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
        seed=d.seed if body.seed is None or body.seed == -1 else body.seed & 0xFFFFFFFF,
        **fields,
    )


def lora(entries: Sequence[LoraField] | None) -> LoraScales | None:
    """llama-server's per-request `lora` as (id, scale) pairs; None (absent or empty, as there):
    the server's default scales. Ids are checked by the backend, which knows its adapters."""
    return tuple((e.id, e.scale) for e in entries) if entries else None


def speculative(body: SamplingFields) -> SpecRequest | None:
    """The request's speculative decoding settings (its object, then the flat keys), or None."""
    obj = body.speculative
    kind = body.spec_type or (obj.type if obj else None)
    n_max = body.spec_n_max if body.spec_n_max is not None else (obj.n_max if obj else None)
    n_min = body.spec_n_min if body.spec_n_min is not None else (obj.n_min if obj else None)
    if kind is None and n_max is None and n_min is None:
        return None
    if n_max is not None and n_min is not None and n_min > n_max:
        raise bad_request(
            f"speculative.n_min ({n_min}) exceeds speculative.n_max ({n_max})", param="speculative"
        )
    return SpecRequest(kind, n_max, n_min)
