"""POST /v1/embeddings: OpenAI's embeddings API over the backend's `embed()` (`compute`, which
llama-server's native `/embeddings` in api/llama/embeddings.py shares).

On `outpost serve` the embedder (mean pooling, L2-normalised) runs on a llama context of its own,
loaded on first use from `--embedding-model` or the served model's file, on the engine thread: it
never takes a generation slot and never blocks the event loop. On a gateway a worker of the named
model computes it (outpost/cluster/embed.py), and the broker's answers are a chat request's.
"""

from __future__ import annotations

import asyncio
import base64
import struct
from typing import Any

from fastapi import APIRouter, Request

from outpost.api.errors import ApiError, bad_request
from outpost.api.pipeline import mapping
from outpost.api.pipeline.generation import admission_error, timeout_error
from outpost.api.pipeline.schemas import EmbeddingRequest, Pieces
from outpost.api.state import state_of
from outpost.backend import PromptCodec
from outpost.messages import BackendUnavailable, EmbedInput, QueueFull

router = APIRouter()


def _encode(vector: list[float], fmt: str) -> list[float] | str:
    if fmt == "base64":  # little-endian float32, as OpenAI sends it
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return vector


@router.post("/v1/embeddings", tags=["openai"])
async def embeddings(body: EmbeddingRequest, request: Request) -> Any:
    """Sentence embeddings for a string or a list of strings (llama-server's `content`: its shape)."""
    model_id, vectors, n_tokens = await compute(body, request)
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


def _entry(codec: PromptCodec, pieces: Pieces) -> EmbedInput:
    if isinstance(pieces, str):
        return pieces
    ids = [p for p in pieces if isinstance(p, int)]
    return ids if len(ids) == len(pieces) else mapping.mixed_tokens(codec, pieces, "input")


async def compute(body: EmbeddingRequest, request: Request) -> tuple[str, list[list[float]], int]:
    """(the model id answered, one vector per input, tokens read) for either protocol's reply."""
    state = state_of(request)
    model_id, backend = state.backend_for(None)
    if state.embedding_ids:  # --embedding-model: it answers whatever the name
        model_id = state.embedding_ids[0]
    elif body.model:
        model_id, backend = state.backend_for(body.model)  # a gateway serves several models
    entries = [await asyncio.to_thread(_entry, backend.codec, p) for p in body.inputs()]
    if any(not e for e in entries):
        raise bad_request("Input content cannot be empty", param="input")
    try:
        vectors, n_tokens = await backend.embed(entries)
    except ValueError as exc:  # an input longer than the embedding context
        raise bad_request(str(exc), param="input") from exc
    except (QueueFull, BackendUnavailable) as exc:  # a gateway's broker: as for a chat request
        raise admission_error(exc) from exc
    except TimeoutError as exc:  # a gateway's deadline (serve has none for embeddings)
        raise timeout_error(state.config.request_timeout) from exc
    except RuntimeError as exc:
        raise ApiError(500, f"embedding failed: {exc}", type="server_error", code="engine_error") from exc
    return model_id, vectors, n_tokens
