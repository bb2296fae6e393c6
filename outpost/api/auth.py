"""API-key authentication as ASGI middleware: `Authorization: Bearer KEY` or `x-api-key: KEY`.

Keys are compared in constant time against every configured key; they are never logged. Paths in
`open_paths` (health, ping, metrics by default) and CORS preflights need no key.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from outpost.api.errors import ApiError, Envelopes


def presented_key(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """The key a request carries, from `Authorization: Bearer` or `x-api-key`."""
    for name, value in headers:
        lname = name.lower()
        if lname == b"authorization":
            scheme, _, token = value.strip().partition(b" ")
            if scheme.lower() == b"bearer" and token.strip():
                return token.strip()
        elif lname == b"x-api-key" and value.strip():
            return value.strip()
    return None


def key_matches(key: bytes | None, accepted: tuple[bytes, ...]) -> bool:
    """Constant-time comparison against every accepted key (no early exit)."""
    if key is None:
        return False
    found = False
    for candidate in accepted:
        found |= hmac.compare_digest(key, candidate)
    return found


class ApiKeyMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        keys: tuple[str, ...],
        open_paths: tuple[str, ...],
        envelopes: Envelopes | None = None,
    ) -> None:
        self.app = app
        self.envelopes = envelopes or Envelopes()
        self.keys = tuple(k.encode() for k in keys)
        self.open_paths = frozenset(open_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or not self.keys
            or scope["path"] in self.open_paths
            or scope.get("method") == "OPTIONS"
        ):
            await self.app(scope, receive, send)
            return
        key = presented_key(scope.get("headers", []))
        if key_matches(key, self.keys):
            await self.app(scope, receive, send)
            return
        message = "missing API key" if key is None else "invalid API key"
        err = ApiError(
            401,
            f"{message}: send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
        await self.envelopes.response(scope["path"], err)(scope, receive, send)
