"""llama-server's native embeddings: `POST /embeddings` and `/embedding` (no /v1).

The inputs are /v1/embeddings' (`input` or `content`: text, token ids, both mixed, `{"content"}`
objects, or a list of those); the reply is llama-server's native one, a bare list of
`{"index", "embedding": [[...]]}` (a pooled vector, in a list as llama-server sends it).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from outpost.api.openai.embeddings import native
from outpost.api.pipeline.embed import embed
from outpost.api.pipeline.schemas import EmbeddingRequest
from outpost.api.state import state_of

router = APIRouter()


@router.post("/embeddings", tags=["llama.cpp"])
@router.post("/embedding", include_in_schema=False)
async def embeddings(body: EmbeddingRequest, request: Request) -> list[dict[str, Any]]:
    """One pooled, L2-normalised vector per input, in llama-server's native shape."""
    _, vectors, _ = await embed(state_of(request), body.model, body.inputs())
    return native(vectors)
