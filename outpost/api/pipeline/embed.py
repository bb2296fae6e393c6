"""Embeddings through the backend, for every API that serves them: which model, and its refusals.

`embed` picks the backend (`--embedding-model` answers whatever the name; a gateway's named model;
else the one served), turns each input (text, token ids, or both mixed) into what the backend embeds,
runs `InferenceBackend.embed` and maps its failures to ApiErrors: an empty input or one longer than
the embedding context 400, a full queue 429, an unreachable broker 503, a deadline 504.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from outpost.api.errors import ApiError, bad_request
from outpost.api.pipeline import mapping
from outpost.api.pipeline.generation import admission_error, timeout_error
from outpost.api.pipeline.schemas import Pieces
from outpost.api.state import ServerState
from outpost.backend import PromptCodec
from outpost.messages import BackendUnavailable, EmbedInput, QueueFull


def _entry(codec: PromptCodec, pieces: Pieces, param: str) -> EmbedInput:
    if isinstance(pieces, str):
        return pieces
    ids = [p for p in pieces if isinstance(p, int)]
    return ids if len(ids) == len(pieces) else mapping.mixed_tokens(codec, pieces, param)


async def embed(
    state: ServerState, model: str | None, inputs: Sequence[Pieces], param: str = "input"
) -> tuple[str, list[list[float]], int]:
    """(the model id that answered, one vector per input, tokens read)."""
    model_id, backend = state.backend_for(None)
    if state.embedding_ids:  # --embedding-model: it answers whatever the name
        model_id = state.embedding_ids[0]
    elif model:
        model_id, backend = state.backend_for(model)  # a gateway serves several models
    entries = [await asyncio.to_thread(_entry, backend.codec, p, param) for p in inputs]
    if any(not e for e in entries):
        raise bad_request("Input content cannot be empty", param=param)
    try:
        vectors, n_tokens = await backend.embed(entries)
    except ValueError as exc:  # an input longer than the embedding context
        raise bad_request(str(exc), param=param) from exc
    except (QueueFull, BackendUnavailable) as exc:  # a gateway's broker: as for a chat request
        raise admission_error(exc) from exc
    except TimeoutError as exc:  # a gateway's deadline (serve has none for embeddings)
        raise timeout_error(state.config.request_timeout) from exc
    except RuntimeError as exc:
        raise ApiError(500, f"embedding failed: {exc}", type="server_error", code="engine_error") from exc
    return model_id, vectors, n_tokens
