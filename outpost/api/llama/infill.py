"""llama-server's `POST /infill`: fill-in-the-middle code completion.

The prompt is built as llama-server's `format_prompt_infill` builds it (tools/server/server-common):
`[BOS] [FIM_REP "myproject\n"] ([FIM_SEP filename"\n"] text)* [FIM_SEP "filename\n"] FIM_PRE prefix
prompt FIM_SUF suffix FIM_MID`; a model without FIM_SEP gets llama-server's "--- snippet ---" line
before each extra chunk instead. `input_prefix` and `input_suffix` may mix text and token ids, as
there; `prompt` must be text (llama-server's 400). Two differences: BOS comes first (llama-server
puts the extra chunks before it), and nothing is cut to fit a batch. The rest (sampling, reply,
stream) is `/completion`'s. A model without the FIM tokens is llama-server's 501 "Infill is not
supported by this model".
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import Field

from outpost.api.errors import ApiError, bad_request
from outpost.api.llama import completion
from outpost.api.llama.schemas import NativeCompletionRequest, PromptPiece
from outpost.api.pipeline.mapping import mixed_tokens
from outpost.api.pipeline.schemas import Body
from outpost.api.state import state_of
from outpost.backend import PromptCodec
from outpost.messages import FimTokens

router = APIRouter()


class ExtraChunk(Body):
    text: str
    filename: str = "tmp"


class InfillRequest(NativeCompletionRequest):
    input_prefix: str | list[PromptPiece] = ""
    input_suffix: str | list[PromptPiece] = ""
    input_extra: list[ExtraChunk] = Field(default_factory=list)


# llama-server's separator before an extra chunk where the model has no FIM_SEP token.
SNIPPET_LINE = "\n\n--- snippet ---\n\n"


def not_supported(message: str) -> ApiError:
    """llama-server's ERROR_TYPE_NOT_SUPPORTED: a 501."""
    return ApiError(501, message, type="not_supported_error", code="not_supported")


def infill_tokens(codec: PromptCodec, fim: FimTokens, body: InfillRequest) -> list[int]:
    def tok(text: str) -> list[int]:
        return codec.tokenize(text, add_special=False, parse_special=False) if text else []

    def mixed(value: str | list[PromptPiece], param: str) -> list[int]:
        return mixed_tokens(codec, _pieces(value), param, special=False)

    extra: list[int] = []
    if fim.rep >= 0:
        extra += [fim.rep, *tok("myproject\n")]
    for chunk in body.input_extra:
        extra += [fim.sep, *tok(chunk.filename + "\n")] if fim.sep >= 0 else tok(SNIPPET_LINE)
        extra += tok(chunk.text)
    if fim.sep >= 0:
        extra += [fim.sep, *tok("filename\n")]
    prompt = tok(body.prompt) if isinstance(body.prompt, str) else []
    prefix = [fim.pre, *mixed(body.input_prefix, "input_prefix"), *prompt]
    suffix = [fim.suf, *mixed(body.input_suffix, "input_suffix")]
    bos = [codec.bos_token] if codec.bos_token >= 0 else []
    return [*bos, *extra, *prefix, *suffix, fim.mid]


@router.post("/infill", tags=["llama.cpp"])
async def infill(body: InfillRequest, request: Request) -> Response:
    """Code between `input_prefix` and `input_suffix` (with `input_extra` files as context)."""
    served = state_of(request).backend_for(body.model)
    codec = served[1].codec
    if missing := codec.fim_tokens.missing():
        raise not_supported(f"Infill is not supported by this model: {' '.join(missing)}")
    if not isinstance(body.prompt, str):
        raise bad_request('"prompt" must be a string', param="prompt")
    tokens = await asyncio.to_thread(infill_tokens, codec, codec.fim_tokens, body)
    text = completion.prompt_text(codec, _pieces(body.input_prefix)) + body.prompt
    return await completion.run(request, body, served, [tokens], [text])


def _pieces(value: str | list[PromptPiece]) -> list[PromptPiece]:
    return [value] if isinstance(value, str) else value
