"""Embeddings through the backend, for every API that serves them: which model, and its refusals.

`embed` picks the backend (`--embedding-model` answers whatever the name; a gateway's named model;
else the one served), runs `InferenceBackend.embed` and maps its failures to ApiErrors: an input
longer than the embedding context 400, a full queue 429, an unreachable broker 503, a deadline 504.
"""

from __future__ import annotations

from outpost.api.errors import ApiError, bad_request
from outpost.api.pipeline.generation import admission_error, timeout_error
from outpost.api.state import ServerState
from outpost.messages import BackendUnavailable, QueueFull


async def embed(
    state: ServerState, model: str | None, texts: list[str | list[int]], param: str = "input"
) -> tuple[str, list[list[float]], int]:
    """(the model id that answered, one vector per text, tokens read)."""
    model_id, backend = state.backend_for(None)
    if state.embedding_ids:  # --embedding-model: it answers whatever the name
        model_id = state.embedding_ids[0]
    elif model:
        model_id, backend = state.backend_for(model)  # a gateway serves several models
    try:
        vectors, n_tokens = await backend.embed(texts)
    except ValueError as exc:  # an input longer than the embedding context
        raise bad_request(str(exc), param=param) from exc
    except (QueueFull, BackendUnavailable) as exc:  # a gateway's broker: as for a chat request
        raise admission_error(exc) from exc
    except TimeoutError as exc:  # a gateway's deadline (serve has none for embeddings)
        raise timeout_error(state.config.request_timeout) from exc
    except RuntimeError as exc:
        raise ApiError(500, f"embedding failed: {exc}", type="server_error", code="engine_error") from exc
    return model_id, vectors, n_tokens
