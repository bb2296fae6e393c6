"""One HTTP request's record: what routes learn about it (ids, tokens, timings, text) for the access log
and the request's trace span. The request-log middleware creates it; routes fill it in through `record_of`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from outpost.api.pipeline.generation import Outcome
from outpost.messages import Timings

RECORD_KEY = "outpost.record"


@dataclass
class RequestRecord:
    """What the access log says about one request; routes fill it in."""

    id: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    finish_reason: str | None = None
    timings: dict[str, Any] | None = None
    prompt: str | None = None
    completion: str | None = None
    cancelled: bool = False  # the client went away before the reply ended (its generations aborted)
    # (timings, wall-clock ns when it finished) per generation: what tracing lays its spans out from.
    finished: list[tuple[Timings, int]] = field(default_factory=list)

    def add_outcome(self, out: Outcome, prompt: str | None, log_prompts: bool) -> None:
        self.prompt_tokens += out.n_prompt
        self.completion_tokens += len(out.token_ids)
        self.cached_tokens += out.timings.cache_n
        self.finish_reason = out.finish.value
        self.timings = out.timings.as_dict()
        self.finished.append((out.timings, time.time_ns()))
        if log_prompts:
            self.prompt = prompt
            self.completion = (self.completion or "") + out.text


def record_of(request: Request) -> RequestRecord:
    record = request.scope.get(RECORD_KEY)
    if not isinstance(record, RequestRecord):
        record = RequestRecord()
        request.scope[RECORD_KEY] = record
    return record
