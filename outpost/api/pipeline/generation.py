"""Running one `GenerateRequest` for an HTTP request: admission, events, metrics, cancellation.

`Generation.start()` awaits the backend's admission (`InferenceBackend.submit`, which raises
before accepting), so a full queue, a rejected request or an unreachable backend becomes a
429/400/503 before any byte of the reply is sent; `events()` then streams `TokenEvent`s. Closing or cancelling
the stream aborts the request in the backend (EventStream.aclose does that). Non-streaming
routes run `until_disconnect()` so a client that hangs up frees its slot within one engine step,
during prefill too. The one error mapping of every protocol is here: `admission_error` (a refusal
before accepting), `outcome_error` (how a generation finished) and `failure` (what reading one
raised); each protocol only frames the resulting ApiError in its own envelope.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from starlette.requests import Request

from outpost.api.errors import ApiError, context_length_exceeded, from_engine_rejection, queue_full
from outpost.api.metrics import Metrics, RequestObserver
from outpost.api.pipeline.mapping import Names, context_refusal
from outpost.backend import EventStream, InferenceBackend
from outpost.messages import (
    BackendUnavailable,
    ContextExceeded,
    FinishReason,
    GenerateRequest,
    QueueFull,
    RequestRejected,
    Timings,
    TokenEvent,
    TokenLogprob,
)

T = TypeVar("T")
_log = logging.getLogger("outpost.api")


CLIENT_CLOSED = 499  # nginx's status for "the client closed the connection first"


@dataclass
class Outcome:
    """A finished generation, gathered from its events."""

    request_id: str
    n_prompt: int
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish: FinishReason = FinishReason.ABORT
    timings: Timings = field(default_factory=Timings)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    error: str | None = None
    error_param: str | None = None
    error_counts: tuple[int, int] | None = None
    error_retry_after: float | None = None
    max_tokens: int | None = None  # what the request asked for: a refusal's words repeat it
    names: Names = field(default_factory=Names)  # the protocol's field names, for its errors
    slot: int = -1  # the slot whose KV the request ended in

    def add(self, event: TokenEvent) -> None:
        self.token_ids += event.token_ids
        self.text += event.text
        if event.logprobs:
            self.logprobs += event.logprobs
        if event.finished:
            self.finish = event.finish_reason or FinishReason.STOP
            self.timings = event.timings or self.timings
            self.error = event.error
            self.error_param = event.error_param
            self.error_counts = event.error_counts
            self.error_retry_after = event.error_retry_after
            self.slot = event.slot


def admission_error(
    exc: BaseException, names: Names | None = None, max_tokens: int | None = None
) -> ApiError:
    """The reply to a backend's refusal before accepting (429, 400 in the protocol's names, 503)."""
    if isinstance(exc, ContextExceeded) and names is not None:
        refused = context_refusal(names, exc.n_prompt, max_tokens, exc.n_ctx)
        if refused is not None:
            return refused
    if isinstance(exc, QueueFull):
        return queue_full(str(exc) or "the server is busy; retry later")
    if isinstance(exc, RequestRejected):
        return from_engine_rejection(exc)
    if isinstance(exc, BackendUnavailable):
        return ApiError(
            503, str(exc), code="unavailable", headers={"Retry-After": str(max(1, round(exc.retry_after)))}
        )
    if isinstance(exc, RuntimeError):
        return ApiError(503, f"the engine is not accepting requests: {exc}", code="unavailable")
    raise exc


def timeout_error(timeout: float) -> ApiError:
    return ApiError(
        504,
        f"the request did not finish within the server's request timeout ({timeout:g} s)",
        type="timeout",
        code="timeout",
    )


def finish_error(finish: FinishReason | None, message: str | None, timeout: float) -> ApiError | None:
    """The error a finish deserves (timeout 504, engine error 500, abort 503), or None for stop/length."""
    if finish is FinishReason.TIMEOUT:
        return timeout_error(timeout)
    if finish is FinishReason.ERROR:
        return ApiError(
            500, message or "the engine failed this request", type="server_error", code="engine_error"
        )
    if finish is FinishReason.ABORT:
        return ApiError(503, message or "the request was aborted: the server is stopping", code="aborted")
    return None


def failure(exc: Exception) -> ApiError:
    """What a reply says when reading a generation raised: an ApiError as it is; anything else (an
    engine or server bug, not a failure the engine reported) is logged with its traceback and is a
    500, which each protocol frames in its envelope (a stream: its error event)."""
    if isinstance(exc, ApiError):
        return exc
    _log.error("a generation failed", exc_info=exc)
    return ApiError(500, "internal server error; see the server log", type="server_error")


def outcome_error(outcome: Outcome, timeout: float) -> ApiError | None:
    """The one error mapping of a finished (or finishing) generation, whatever the protocol.

    An ERROR with a `param` is the request's fault (a cluster worker's context could not hold it):
    the 400 serve gives before accepting it, in the protocol's field names."""
    if outcome.finish is FinishReason.ERROR and outcome.error_param is not None:
        return _refused(outcome)
    if outcome.finish is FinishReason.ERROR and outcome.error_retry_after is not None:
        return admission_error(BackendUnavailable(outcome.error or "retry later", outcome.error_retry_after))
    return finish_error(outcome.finish, outcome.error, timeout)


def _refused(out: Outcome) -> ApiError:
    if out.error_counts is not None:
        n_prompt, n_ctx = out.error_counts
        if (again := context_refusal(out.names, n_prompt, out.max_tokens, n_ctx)) is not None:
            return again
    message = out.error or "the request does not fit the context"
    return context_length_exceeded(message, out.names.rename(out.error_param), out.error_counts)


class Generation:
    """One request in the backend, seen from the HTTP side."""

    def __init__(
        self,
        backend: InferenceBackend,
        request: GenerateRequest,
        metrics: Metrics,
        names: Names | None = None,
    ) -> None:
        self.request = request
        self.names = names or Names()
        self._backend = backend
        self._observer = RequestObserver(metrics, request.arrival_time, len(request.prompt_tokens))
        self._stream: EventStream | None = None

    async def start(self) -> None:
        """Submit the request; raises ApiError (429/400/503) if the backend refuses it."""
        try:
            self._stream = await self._backend.submit(self.request)
        except (QueueFull, RequestRejected, RuntimeError) as exc:
            raise admission_error(exc, self.names, self.request.max_tokens) from exc

    async def events(self) -> AsyncIterator[TokenEvent]:
        """The request's events; leaving early aborts the request."""
        assert self._stream is not None, "call start() first"
        stream = self._stream
        try:
            async for event in stream:
                self._observer.on_event(event)
                yield event
                if event.finished:
                    return
        finally:
            await stream.aclose()

    async def cancel(self) -> None:
        """Abort a started generation whose events() is never iterated."""
        if self._stream is not None:
            await self._stream.aclose()

    async def collect(self) -> Outcome:
        out = self.new_outcome()
        async for event in self.events():
            out.add(event)
        return out

    def new_outcome(self) -> Outcome:
        request = self.request
        return Outcome(
            request.request_id, len(request.prompt_tokens), max_tokens=request.max_tokens, names=self.names
        )


async def start_all(generations: list[Generation]) -> None:
    """Start several generations; if one is refused, abort the ones already started."""
    started: list[Generation] = []
    try:
        for gen in generations:
            await gen.start()
            started.append(gen)
    except BaseException:
        for gen in started:
            await gen.cancel()
        raise


async def _wait_disconnect(receive: Callable[[], Awaitable[dict[str, Any]]]) -> None:
    while True:
        message = await receive()
        if message.get("type") == "http.disconnect":
            return


async def until_disconnect(receive: Callable[[], Awaitable[Any]], work: Awaitable[T]) -> T:
    """Await `work`, cancelling it (which aborts its generations) if the client disconnects first
    (a 499); what it raises is an ApiError (`failure`)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(receive))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task not in done:
        raise ApiError(CLIENT_CLOSED, "the client closed the connection", code="client_closed")
    try:
        return task.result()
    except ApiError:
        raise
    except Exception as exc:
        raise failure(exc) from exc


async def wait_outcomes(request: Request, gens: list[Generation]) -> list[Outcome]:
    """Every generation's outcome; a client that hangs up first aborts them all (a 499)."""

    async def collect_all() -> list[Outcome]:
        return list(await asyncio.gather(*(g.collect() for g in gens)))

    return await until_disconnect(request.receive, collect_all())
