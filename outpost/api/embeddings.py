"""POST /v1/embeddings: OpenAI's embeddings API over the engine's `Embedder`.

The embedder (mean pooling, L2-normalised) runs on a llama context of its own, loaded on first
use from `--embedding-model` or the served model's file, in a worker thread behind a lock: it never
takes a generation slot and never blocks the event loop.
"""

from __future__ import annotations

import base64
import struct
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request

from outpost.api import mapping
from outpost.api.errors import ApiError, bad_request
from outpost.api.handlers import state_of
from outpost.api.schemas import EmbeddingRequest

router = APIRouter()


def _encode(vector: list[float], fmt: str) -> list[float] | str:
    if fmt == "base64":  # little-endian float32, as OpenAI sends it
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return vector


@router.post("/v1/embeddings", tags=["openai"])
@router.post("/embeddings", include_in_schema=False)
async def embeddings(body: EmbeddingRequest, request: Request) -> dict[str, Any]:
    """Sentence embeddings for a string or a list of strings."""
    state = state_of(request)
    backend = state.ready_backend()
    extra = [Path(state.config.embedding_model).stem] if state.config.embedding_model else []
    mapping.check_model(body.model, state.model_id, also=extra)
    texts = [body.input] if isinstance(body.input, str) else list(body.input)
    try:
        vectors, n_tokens = await backend.embed(texts)
    except ValueError as exc:  # an input longer than the embedding context
        raise bad_request(str(exc), param="input") from exc
    except RuntimeError as exc:
        raise ApiError(500, f"embedding failed: {exc}", type="server_error", code="engine_error") from exc
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": _encode(v, body.encoding_format)}
            for i, v in enumerate(vectors)
        ],
        "model": body.model or state.model_id,
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
    }
