"""POST /v1/embeddings: OpenAI's embeddings API over the pipeline's `embed()` (llama-server's
native `/embeddings` in api/llama/embeddings.py shares `native`).

On `outpost serve` the embedder (mean pooling, L2-normalised) runs on a llama context of its own,
loaded on first use from `--embedding-model` or the served model's file, on the engine thread: it
never takes a generation slot and never blocks the event loop. On a gateway a worker of the named
model computes it (outpost/cluster/embed.py), and the broker's answers are a chat request's.
"""

from __future__ import annotations

import base64
import struct
from typing import Any

from fastapi import APIRouter, Request

from outpost.api.pipeline.embed import embed
from outpost.api.pipeline.schemas import EmbeddingRequest
from outpost.api.state import state_of

router = APIRouter()


def _encode(vector: list[float], fmt: str) -> list[float] | str:
    if fmt == "base64":  # little-endian float32, as OpenAI sends it
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return vector


@router.post("/v1/embeddings", tags=["openai"])
async def embeddings(body: EmbeddingRequest, request: Request) -> Any:
    """Sentence embeddings for a string or a list of strings (llama-server's `content`: its shape)."""
    model_id, vectors, n_tokens = await embed(state_of(request), body.model, body.inputs())
    if body.input is None:  # llama-server answers its `content` field natively on /v1 too
        return native(vectors)
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": _encode(v, body.encoding_format)}
            for i, v in enumerate(vectors)
        ],
        "model": model_id,
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
    }


def native(vectors: list[list[float]]) -> list[dict[str, Any]]:
    """llama-server's native reply: per input its index and its pooled vector, in a list of one."""
    return [{"index": i, "embedding": [v]} for i, v in enumerate(vectors)]
