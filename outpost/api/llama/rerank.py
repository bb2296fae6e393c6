"""llama-server's reranking: `POST /rerank`, `/reranking`, `/v1/rerank`, `/v1/reranking`.

HTTP -> `InferenceBackend.rerank(query, documents)` (the server's rank-pooling model, `--reranking` /
`--rerank-model`) -> llama-server's reply, in the shape the request asks for as llama-server tells
them apart: Jina/Cohere's (`documents`) or Hugging Face TEI's (`texts`). Results are sorted by
score, highest first, and cut to `top_n`.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import Field, StrictBool, StrictStr

from outpost.api.errors import bad_request
from outpost.api.llama.infill import not_supported
from outpost.api.pipeline.schemas import Body
from outpost.api.state import state_of
from outpost.messages import NotSupported

router = APIRouter()


class TextDocument(Body):
    text: StrictStr


class RerankRequest(Body):
    model: str | None = None
    query: StrictStr
    documents: list[StrictStr | TextDocument] | None = None
    texts: list[StrictStr] | None = None  # Hugging Face TEI's name (and reply shape)
    top_n: int | None = Field(default=None, ge=0)
    return_documents: StrictBool = False
    return_text: StrictBool = False


def _texts(body: RerankRequest) -> list[str]:
    docs = body.documents if body.documents is not None else body.texts
    if not docs:
        raise bad_request('"documents" must be a non-empty string array', "documents")
    return [d if isinstance(d, str) else d.text for d in docs]


@router.post("/rerank", tags=["llama.cpp"])
@router.post("/reranking", include_in_schema=False)
@router.post("/v1/rerank", tags=["llama.cpp"])
@router.post("/v1/reranking", include_in_schema=False)
async def rerank(body: RerankRequest, request: Request) -> Any:
    """Scores each document's relevance to `query` with the server's reranker."""
    docs = _texts(body)
    model_id, backend = state_of(request).backend_for(None)
    try:
        scores, n_tokens = await backend.rerank(body.query, docs)
    except NotSupported as exc:
        raise not_supported(str(exc)) from None
    except ValueError as exc:
        raise bad_request(str(exc), "documents") from None
    tei = body.documents is None
    order = sorted(range(len(docs)), key=lambda i: -scores[i])  # stable: ties keep input order
    results: list[dict[str, Any]] = []
    for i in order[: len(docs) if body.top_n is None else body.top_n]:
        item: dict[str, Any] = {"index": i, "score" if tei else "relevance_score": scores[i]}
        if tei and body.return_text:
            item["text"] = docs[i]
        elif not tei and body.return_documents:
            item["document"] = {"text": docs[i]}
        results.append(item)
    if tei:
        return results
    usage = {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
    return {"model": body.model or model_id, "object": "list", "usage": usage, "results": results}
