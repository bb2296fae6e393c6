"""Request-body limit as ASGI middleware: more than `max_body` bytes is a 413, before any parsing.

The body is read here (counting bytes, never more than the limit plus one chunk) and replayed to
the app, after which the app's `receive` is the server's own, so disconnects still reach routes.
Bodies are JSON whatever the Content-Type says (`curl -d` sends form encoding), as llama-server
takes them: a non-JSON Content-Type is rewritten to application/json.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from outpost.api.errors import ApiError, Envelopes

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def _too_large(limit: int) -> ApiError:
    return ApiError(
        413, f"the request body is over the server's limit of {limit} bytes", code="body_too_large"
    )


def _declared_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _json_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    kept = [(n, v) for n, v in headers if n.lower() != b"content-type"]
    current = next((v for n, v in headers if n.lower() == b"content-type"), b"")
    base = current.split(b";")[0].strip().lower()
    if base == b"application/json" or base.endswith(b"+json"):
        return headers
    return [*kept, (b"content-type", b"application/json")]


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_body: int, envelopes: Envelopes | None = None) -> None:
        self.app = app
        self.max_body = max_body
        self.envelopes = envelopes or Envelopes()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        declared = _declared_length(scope.get("headers", []))
        if declared is not None and declared > self.max_body:
            await self.envelopes.response(scope["path"], _too_large(self.max_body))(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                await self.envelopes.response(scope["path"], _too_large(self.max_body))(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body: list[Message] = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replay() -> Message:
            return body.pop() if body else await receive()

        scope = dict(scope, headers=_json_headers(list(scope.get("headers", []))))
        await self.app(scope, replay, send)
