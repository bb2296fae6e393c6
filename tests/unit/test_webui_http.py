"""The chat page's HTTP side with no model: open paths, security headers, --no-webui, and a page
that loads nothing it does not ship (no inline code, no other origin)."""

from __future__ import annotations

import re
from pathlib import Path

from fastapi.testclient import TestClient

from outpost.api import webui
from outpost.api.app import create_app
from outpost.settings import HttpSettings

KEY = "sk-webui-unit"


def _client(tmp_path: Path, **options: object) -> TestClient:
    config = HttpSettings.model_validate(options)
    return TestClient(create_app({}, config, "m"))  # no backend: no route here reaches one


def test_page_and_assets_are_open_with_strict_headers_but_the_api_is_not(tmp_path: Path) -> None:
    with _client(tmp_path, api_keys=(KEY,)) as c:
        for path, (_, media_type) in webui.ASSETS.items():
            r = c.get(path)
            assert r.status_code == 200, (path, r.text)
            assert r.headers["content-type"] == media_type
            assert r.headers["content-security-policy"] == webui.CSP
            assert r.headers["x-content-type-options"] == "nosniff"
            assert r.headers["x-frame-options"] == "DENY"
            assert KEY not in r.text
        assert c.get("/v1/models").status_code == 401
        assert c.post("/v1/chat/completions", json={"messages": []}).status_code == 401
        assert c.get("/webui/other.js").status_code == 401, "only the shipped files are open"


def test_csp_allows_only_this_origin_and_no_inline_code() -> None:
    directives = dict(d.strip().split(" ", 1) for d in webui.CSP.split(";"))
    assert directives["default-src"] == "'none'"
    assert directives["frame-ancestors"] == "'none'"
    for name in ("script-src", "style-src", "connect-src"):
        assert directives[name] == "'self'", name
    assert "unsafe" not in webui.CSP


def test_the_page_references_only_shipped_files_and_has_no_inline_code(tmp_path: Path) -> None:
    with _client(tmp_path) as c:
        html = c.get("/").text
    refs = set(re.findall(r'(?:src|href)="([^"]+)"', html))
    assert refs and refs <= set(webui.ASSETS), refs - set(webui.ASSETS)
    assert not re.search(r"<script(?![^>]*\bsrc=)", html), "inline <script>"
    assert "<style" not in html and " style=" not in html and not re.search(r"\son\w+=", html)


def test_no_webui_turns_the_page_off(tmp_path: Path) -> None:
    with _client(tmp_path, webui=False) as c:
        for path in webui.ASSETS:
            r = c.get(path)
            assert r.status_code == 404, path
            assert "content-security-policy" not in r.headers


def test_markdown_libraries_are_vendored_pinned_and_served(tmp_path: Path) -> None:
    """marked and DOMPurify ship in the package (no CDN) at the versions static/vendor/README.md pins."""
    with _client(tmp_path) as c:
        html = c.get("/").text
        marked = c.get("/webui/vendor/marked.umd.js").text
        purify = c.get("/webui/vendor/purify.min.js").text
    assert "marked v18.2.1" in marked[:200] and "DOMPurify 3.4.18" in purify[:300]
    order = [
        html.index(f'src="/webui/{name}"')
        for name in ("vendor/marked.umd.js", "vendor/purify.min.js", "app.js")
    ]
    assert order == sorted(order), "the libraries load before the page's script (defer keeps the order)"


def test_the_page_ships_the_default_system_prompt(tmp_path: Path) -> None:
    with _client(tmp_path) as c:
        html = c.get("/").text
    textarea = re.search(r'<textarea id="system"[^>]*>([^<]*)</textarea>', html)
    assert textarea is not None and textarea.group(1) == webui.DEFAULT_SYSTEM_PROMPT
