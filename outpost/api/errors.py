"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with the right HTTP status.

`ApiError` is what route code raises; `install_error_handlers` maps everything else that can
escape a route (validation errors, malformed JSON, engine admission errors, unknown paths) to the
same shape, so bad input is always a 4xx and never a 500.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from outpost.messages import ChatTemplateError, ContextExceeded, QueueFull, RequestRejected

_log = logging.getLogger("outpost.api")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
    504: "timeout",
}


class ApiError(Exception):
    """An error reply: status, message, and OpenAI's type/param/code."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        """`extra`: more fields of the error object (llama-server's n_prompt_tokens, n_ctx)."""
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        self.param = param
        self.code = code
        self.headers = headers or {}
        self.extra = extra or {}

    def worded(self) -> str:
        """The message naming `param` (as `param: message`) unless it does already: for an envelope
        with no `param` of its own (Anthropic's, Ollama's, a Responses stream's failure)."""
        if self.param is None or self.param.split(".")[-1] in self.message:
            return self.message
        return f"{self.param}: {self.message}"

    def body(self) -> dict[str, Any]:
        error = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        return {"error": {**error, **self.extra}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


Envelope = Callable[[ApiError], Response]


class Envelopes:
    """Each API's error envelope by path prefix, OpenAI's elsewhere: for the replies middleware
    gives before any route runs (a missing key, a body over the limit, a draining server)."""

    def __init__(self, by_prefix: Mapping[str, Envelope] | None = None) -> None:
        self.by_prefix = dict(by_prefix or {})

    def response(self, path: str, err: ApiError) -> Response:
        for prefix, envelope in self.by_prefix.items():
            if path.startswith(prefix):
                return envelope(err)
        return err.response()


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def context_length_exceeded(
    message: str, param: str | None = "messages", counts: tuple[int, int] | None = None
) -> ApiError:
    """OpenAI's code with llama-server's type and, where known, its n_prompt_tokens and n_ctx."""
    extra = {} if counts is None else {"n_prompt_tokens": counts[0], "n_ctx": counts[1]}
    return ApiError(
        400,
        message,
        type="exceed_context_size_error",
        param=param,
        code="context_length_exceeded",
        extra=extra,
    )


def queue_full(message: str) -> ApiError:
    return ApiError(429, message, code="queue_full", headers={"Retry-After": "1"})


def not_ready(status: str) -> ApiError:
    if status == "draining":
        return ApiError(503, "the server is shutting down; retry on another instance", code="draining")
    return ApiError(
        503, "the model is still loading; retry shortly", code="loading", headers={"Retry-After": "1"}
    )


def from_engine_rejection(exc: RequestRejected) -> ApiError:
    text = str(exc)
    if isinstance(exc, ContextExceeded):
        return context_length_exceeded(text, exc.param, (exc.n_prompt, exc.n_ctx))
    if "tokens" in text and ("position" in text or "context" in text):
        return context_length_exceeded(text)
    return bad_request(text, exc.param)


def _describe_validation(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = list(exc.errors())
    if not errors:
        return "invalid request body", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "")
        return f"the request body is not valid JSON: {detail}".rstrip(": "), None
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    prefix = f"{param}: " if param and not msg.startswith(param.split(".")[-1]) else ""
    return f"{prefix}{msg}{more}", param


def _http_error(exc: StarletteHTTPException) -> ApiError:
    messages = {404: "no such endpoint", 405: "method not allowed on this endpoint"}
    starlettes = exc.detail in (None, "Not Found", "Method Not Allowed")  # its words, not a route's
    message = messages.get(exc.status_code) if starlettes else None
    return ApiError(exc.status_code, message or str(exc.detail), headers=dict(exc.headers or {}))


def _handler(to_error: Callable[[Any], ApiError]) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
    """An exception handler replying with the ApiError `to_error` makes of the exception."""

    async def handle(_: Request, exc: Exception) -> JSONResponse:
        return to_error(exc).response()

    return handle


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    _log.error("unhandled error on %s", request.url.path, exc_info=exc)
    return ApiError(500, "internal server error; see the server log", type="server_error").response()


def install_error_handlers(app: FastAPI) -> None:
    to_error: dict[type[Exception], Callable[[Any], ApiError]] = {
        ApiError: lambda exc: exc,
        RequestValidationError: lambda exc: bad_request(*_describe_validation(exc)),
        StarletteHTTPException: _http_error,
        QueueFull: lambda exc: queue_full(str(exc) or "the server is busy; retry later"),
        RequestRejected: from_engine_rejection,
        ChatTemplateError: lambda exc: bad_request(
            f"the chat template rejected these messages: {exc}", param="messages"
        ),
    }
    for kind, convert in to_error.items():
        app.add_exception_handler(kind, _handler(convert))
    app.add_exception_handler(Exception, _on_unexpected)
