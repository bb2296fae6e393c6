"""llama-server's `POST /infill`: fill-in-the-middle code completion.

The prompt is built as llama-server's `format_prompt_infill` builds it (tools/server/utils):
`[BOS] [FIM_REP repo] ([FIM_SEP file] text)* [FIM_SEP file] FIM_PRE prefix+prompt FIM_SUF suffix
FIM_MID`, the extra chunks (`input_extra`) only where the model has FIM_REP/FIM_SEP tokens. The
rest (sampling, reply, stream) is `/completion`'s. A model without the FIM tokens is llama-server's
501 "Infill is not supported by this model".
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import Field

from outpost.api.errors import ApiError
from outpost.api.llama import completion
from outpost.api.llama.schemas import NativeCompletionRequest
from outpost.api.pipeline.schemas import Body
from outpost.api.state import state_of
from outpost.backend import PromptCodec
from outpost.messages import FimTokens

router = APIRouter()


class ExtraChunk(Body):
    text: str
    filename: str = "tmp"


class InfillRequest(NativeCompletionRequest):
    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: list[ExtraChunk] = Field(default_factory=list)


def not_supported(message: str) -> ApiError:
    """llama-server's ERROR_TYPE_NOT_SUPPORTED: a 501."""
    return ApiError(501, message, type="not_supported_error", code="not_supported")


def infill_tokens(codec: PromptCodec, fim: FimTokens, body: InfillRequest) -> list[int]:
    def tok(text: str) -> list[int]:
        return codec.tokenize(text, add_special=False, parse_special=False) if text else []

    extra: list[int] = []
    if fim.rep >= 0:
        extra += [fim.rep, *tok("myproject\n")]
    for chunk in body.input_extra:
        if fim.sep >= 0:
            extra += [fim.sep, *tok(chunk.filename)]
        extra += tok(chunk.text)
    if fim.sep >= 0:
        extra += [fim.sep, *tok("filename\n")]
    prompt = body.prompt if isinstance(body.prompt, str) else ""
    prefix = [fim.pre, *tok(body.input_prefix), *tok(prompt)]
    suffix = [fim.suf, *tok(body.input_suffix)]
    bos = [codec.bos_token] if codec.bos_token >= 0 else []
    return [*bos, *extra, *prefix, *suffix, fim.mid]


@router.post("/infill", tags=["llama.cpp"])
async def infill(body: InfillRequest, request: Request) -> Response:
    """Code between `input_prefix` and `input_suffix` (with `input_extra` files as context)."""
    served = state_of(request).backend_for(body.model)
    codec = served[1].codec
    if missing := codec.fim_tokens.missing():
        raise not_supported(f"Infill is not supported by this model: {' '.join(missing)}")
    tokens = await asyncio.to_thread(infill_tokens, codec, codec.fim_tokens, body)
    text = body.input_prefix + (body.prompt if isinstance(body.prompt, str) else "")
    return await completion.run(request, body, served, [tokens], [text])
