"""The browser chat page at `/`: static files shipped in the package, served with strict headers.

Plain HTML, CSS and JavaScript (no build step, no CDN); markdown is rendered by two vendored,
pinned libraries, marked and DOMPurify (static/vendor/README.md says which versions, and how to
update them), the answer's HTML escaped and the result sanitised. The page holds no secrets, so its paths are
open like /health; everything it calls (/v1/models, /v1/chat/completions) still needs the API key,
which the page sends as an `Authorization` header, never in a URL. `install(app)` adds the routes
to any FastAPI app (the server's, and later the gateway's); `OPEN_PATHS` are the paths to exempt
from API-key checks.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response

# The page may load only its own files and talk only to its own origin: no inline script or style,
# no frames, no plugins, no form posts elsewhere.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "manifest-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    # Revalidate every load, so an upgraded server never runs an old app.js against a new API.
    "Cache-Control": "no-cache",
}
# URL path -> (file under static/, media type)
ASSETS = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/webui/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/webui/style.css": ("style.css", "text/css; charset=utf-8"),
    "/webui/icon.svg": ("icon.svg", "image/svg+xml"),
    "/webui/vendor/marked.umd.js": ("vendor/marked.umd.js", "text/javascript; charset=utf-8"),
    "/webui/vendor/purify.min.js": ("vendor/purify.min.js", "text/javascript; charset=utf-8"),
}
OPEN_PATHS: tuple[str, ...] = tuple(ASSETS)
# The page's system prompt until the user edits it (the text of index.html's #system; a unit test holds
# the two together): SmolLM2-135M-Instruct answers "Name the capital of France." with Paris under it
# (tests/real), and rambles or switches language with none, or with the same sentence ending in a period.
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant"


def _asset_route(body: bytes, media_type: str) -> Callable[[], Awaitable[Response]]:
    async def asset() -> Response:
        return Response(body, media_type=media_type, headers=SECURITY_HEADERS)

    return asset


def build_router() -> APIRouter:
    """GET routes for every asset; the files are read once, here."""
    router = APIRouter(include_in_schema=False)
    static = resources.files(__package__) / "static"
    for path, (name, media_type) in ASSETS.items():
        body = static.joinpath(*name.split("/")).read_bytes()
        router.add_api_route(path, _asset_route(body, media_type), methods=["GET"])
    return router


__all__ = ["ASSETS", "CSP", "DEFAULT_SYSTEM_PROMPT", "OPEN_PATHS", "SECURITY_HEADERS", "build_router"]
