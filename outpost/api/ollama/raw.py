"""`/api/generate` with `"raw": true`: the prompt as written, no chat template, and Ollama's `context`.

The prompt's tokens (after the `context` tokens of an earlier reply, when sent) go through the same
`submit` as every route; the answer is read by the chat reader with thinking and tools off, so the
text comes back as it was generated. The reply's `context` is the prompt's tokens and the answer's,
for the next raw request to continue from.
"""

from __future__ import annotations

import asyncio
import time

from fastapi import Request

from outpost.api.ollama.translate import GenerateBody, chat_request
from outpost.api.pipeline import mapping
from outpost.api.pipeline.chat_plan import ChatPlan
from outpost.api.pipeline.chat_run import ChatRun
from outpost.api.pipeline.submit import Submission, submit
from outpost.api.state import ServerState
from outpost.backend import PromptCodec

NAMES = mapping.Names("prompt", "num_predict")


def _tokens(codec: PromptCodec, body: GenerateBody) -> list[int]:
    context = list(body.context or [])
    mapping.check_token_ids(codec, context, "context")
    # A BOS starts a conversation, not its continuation.
    return context + codec.tokenize(body.prompt or "", add_special=not context)


async def start_raw(state: ServerState, body: GenerateBody, request: Request) -> ChatRun:
    """Submit `body`'s prompt as it is; refusals are ApiErrors before any reply byte."""
    arrival = time.monotonic()
    # The sampler's fields are validated as on any chat request; its messages are not used.
    fields = chat_request(body, [{"role": "user", "content": ""}])
    model_id, backend = state.backend_for(body.model)
    tokens = await asyncio.to_thread(_tokens, backend.codec, body)
    sampling = mapping.sampling_params(backend.codec, fields, -1, state.sampling_defaults)
    stops = mapping.stop_strings(fields.stop)
    sub = Submission(
        backend,
        [tokens],
        fields.max_tokens,
        state.config.default_max_tokens,
        sampling,
        stops,
        NAMES,
        "ollama",
        arrival=arrival,
    )
    rid, gens = await submit(state, request, sub)
    plan = ChatPlan(prompt=body.prompt or "", think=False)
    return ChatRun(model_id, backend, plan, gens[0], rid, plan.prompt, stops, gens)
