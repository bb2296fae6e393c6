"""POST /v1/embeddings: OpenAI's embeddings API over the backend's `embed()`.

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

from outpost.api.errors import ApiError, bad_request
from outpost.api.pipeline.generation import admission_error, timeout_error
from outpost.api.pipeline.schemas import EmbeddingRequest
from outpost.api.state import state_of
from outpost.messages import BackendUnavailable, QueueFull

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
    model_id, backend = state.backend_for(None)
    if state.embedding_ids:  # --embedding-model: it answers whatever the name
        model_id = state.embedding_ids[0]
    elif body.model:
        model_id, backend = state.backend_for(body.model)  # a gateway serves several models
    texts = body.inputs()
    try:
        vectors, n_tokens = await backend.embed(texts)
    except ValueError as exc:  # an input longer than the embedding context
        raise bad_request(str(exc), param="input") from exc
    except (QueueFull, BackendUnavailable) as exc:  # a gateway's broker: as for a chat request
        raise admission_error(exc) from exc
    except TimeoutError as exc:  # a gateway's deadline (serve has none for embeddings)
        raise timeout_error(state.config.request_timeout) from exc
    except RuntimeError as exc:
        raise ApiError(500, f"embedding failed: {exc}", type="server_error", code="engine_error") from exc
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": _encode(v, body.encoding_format)}
            for i, v in enumerate(vectors)
        ],
        "model": model_id,
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
    }
