"""The chat page in a real browser (Debian's chromium driven by Playwright) against a real server.

The engine is paced (OUTPOST_DEBUG_STEP_DELAY_MS) so an answer with a large budget and no EOS is
still streaming whenever the test acts on it, however fast or slow the machine is; every wait is
bounded. A screenshot of the page is written to test-artifacts/ (or $OUTPOST_TEST_ARTIFACTS).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, Request, Route, expect, sync_playwright
from server_harness import Server

from outpost.api import webui

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless=new",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
STEP_DELAY_MS = "40"  # 25 tokens/s at most: a 1500-token answer streams for a minute or more
KEY = "sk-webui-e2e-0123456789"
WAIT_MS = 90_000  # a ceiling for every page wait, only reached when something is wrong (or on a crushed CPU)
expect.set_options(timeout=WAIT_MS)
ARTIFACTS = Path(os.environ.get("OUTPOST_TEST_ARTIFACTS", Path(__file__).parents[2] / "test-artifacts"))


def _serve(model: Path, *args: str, slots: int = 2) -> Server:
    pacing = {"OUTPOST_DEBUG_STEP_DELAY_MS": STEP_DELAY_MS}
    server = Server(model, "-np", str(slots), "-c", "4096", *args, env=pacing)
    server.wait_ready()
    return server


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not shutil.which(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: `make browser` (apt-get install chromium) installs it")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def server(tiny_model: Path) -> Iterator[Server]:
    with _serve(tiny_model) as srv:
        yield srv


@pytest.fixture(scope="module")
def keyed_server(tiny_model: Path) -> Iterator[Server]:
    with _serve(tiny_model, "--api-key", KEY, "--max-queue", "0", slots=1) as srv:
        yield srv


class Watched:
    """A page plus what it did: request URLs and console messages (CSP violations land there)."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.urls: list[str] = []
        self.console: list[str] = []
        page.on("request", lambda r: self.urls.append(r.url))
        page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))
        page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))

    def assert_clean(self) -> None:
        bad = [m for m in self.console if "Content Security Policy" in m or m.startswith("pageerror")]
        assert not bad, bad


@pytest.fixture
def page(browser: Browser) -> Iterator[Watched]:
    context = browser.new_context(viewport={"width": 1000, "height": 720})
    context.set_default_timeout(WAIT_MS)
    watched = Watched(context.new_page())
    yield watched
    context.close()


def _open(w: Watched, server: Server) -> Page:
    w.page.goto(server.url + "/")
    return w.page


def _settings(page: Page, **values: str) -> None:
    page.click("#settings-toggle")
    for name, value in values.items():
        page.fill(f"#{name}", value)


def _send(page: Page, text: str) -> None:
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")


def _no_eos(route: Route, request: Request) -> None:
    """Ask the server to ignore EOS (llama-server's field; the page has no such setting)."""
    body = json.loads(request.post_data or "{}")
    route.continue_(post_data=json.dumps({**body, "ignore_eos": True}))


def _reply_text(page: Page) -> str:
    return str(page.locator(".msg.assistant .body").last.text_content())


def test_answer_streams_then_stop_frees_the_slot(page: Watched, server: Server) -> None:
    p = _open(page, server)
    expect(p.locator("#model")).to_have_text(server.health()["model"])
    _settings(p, max_tokens="1500", temperature="0")
    p.route("**/v1/chat/completions", _no_eos)
    _send(p, "Tell me a long story.")

    streaming = p.locator(".msg.assistant.streaming .body")
    expect(streaming).not_to_have_text("")
    first = len(_reply_text(p))
    p.wait_for_function(  # more text arrives while the answer is still open: it streams
        "n => document.querySelector('.msg.assistant.streaming .body')?.textContent.length > n", arg=first
    )
    expect(p.locator("#speed")).to_contain_text("tok/s")
    assert server.health()["slots_busy"] == 1

    p.click("#stop")
    expect(p.locator("#send")).to_be_visible()
    expect(p.locator(".msg.assistant .meta").last).to_contain_text("stopped")
    server.wait_idle(timeout=20)  # the aborted fetch closed the connection; the server freed the slot
    stopped = _reply_text(p)
    assert len(stopped) > first
    time.sleep(0.3)  # a poll interval: nothing may arrive after the stop
    assert _reply_text(p) == stopped
    page.assert_clean()


def test_full_answer_shows_timings_and_survives_a_reload(page: Watched, server: Server) -> None:
    p = _open(page, server)
    _settings(p, max_tokens="12", system="You are terse.")
    p.route("**/v1/chat/completions", _no_eos)  # twelve tokens, whatever the random weights say
    _send(p, "Hello there")
    meta = p.locator(".msg.assistant .meta").last
    expect(meta).to_contain_text("tok/s")
    expect(meta).to_contain_text("prompt")
    assert p.locator(".msg.user .body").last.text_content() == "Hello there"
    answer = _reply_text(p)
    assert answer

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "webui-chat.png"
    p.screenshot(path=str(shot))
    assert shot.stat().st_size > 10_000
    background = "getComputedStyle(document.documentElement).backgroundColor"
    light = p.evaluate(background)
    p.emulate_media(color_scheme="dark")  # prefers-color-scheme picks the palette
    assert p.evaluate(background) != light
    p.screenshot(path=str(ARTIFACTS / "webui-chat-dark.png"))
    p.emulate_media(color_scheme="light")

    p.reload()  # the conversation and the settings live in the browser
    expect(p.locator(".msg.assistant .body").last).to_have_text(answer)
    assert p.input_value("#system") == "You are terse."
    p.click("#new-chat")
    expect(p.locator(".msg")).to_have_count(0)
    page.assert_clean()


def test_context_overflow_shows_the_servers_message(page: Watched, server: Server) -> None:
    p = _open(page, server)
    _settings(p, max_tokens="100000")
    _send(p, "Hi")
    error = p.locator("#error")
    expect(error).to_contain_text("Bad request (400)")
    expect(error).to_contain_text("context holds")
    expect(p.locator(".msg")).to_have_count(0)  # the turn is taken back ...
    assert p.input_value("#prompt") == "Hi"  # ... and its text is ready to resend
    page.assert_clean()


def test_api_key_is_asked_for_and_never_in_a_url_or_the_log(page: Watched, keyed_server: Server) -> None:
    p = _open(page, keyed_server)
    error = p.locator("#error")
    expect(error).to_contain_text("Unauthorized (401)")
    expect(p.locator("#api-key")).to_be_visible()  # asked for, since the server wants one

    p.fill("#api-key", "sk-wrong")
    p.locator("#api-key").blur()  # a change: the page tries /v1/models again with it
    expect(error).to_contain_text("invalid API key")
    _send(p, "Hi")
    expect(error).to_contain_text("Unauthorized (401): invalid API key")

    p.fill("#api-key", KEY)
    p.locator("#api-key").blur()
    expect(p.locator("#model")).to_have_text(keyed_server.health()["model"])
    expect(error).to_be_hidden()
    p.fill("#max_tokens", "6")  # the settings panel is open: the page opened it for the key
    _send(p, "Hi")
    expect(p.locator(".msg.assistant .meta").last).to_contain_text("prompt")  # the final timings
    assert p.evaluate("sessionStorage.getItem('outpost.apiKey')") == KEY
    assert p.evaluate("localStorage.getItem('outpost.apiKey')") is None

    assert page.urls and not any(KEY in u or "sk-wrong" in u for u in page.urls), page.urls
    keyed_server.wait_idle(timeout=30)
    assert KEY not in keyed_server.stderr() and "sk-wrong" not in keyed_server.stderr()
    page.assert_clean()


def _enter_key(p: Page, server: Server) -> None:
    expect(p.locator("#error")).to_contain_text("Unauthorized (401)")
    p.fill("#api-key", KEY)
    p.locator("#api-key").blur()
    expect(p.locator("#model")).to_have_text(server.health()["model"])


def test_a_busy_server_is_shown_as_busy(page: Watched, keyed_server: Server) -> None:
    hold = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1500, "ignore_eos": True}
    auth = {"Authorization": f"Bearer {KEY}"}
    with (
        keyed_server.client(headers=auth) as c,
        c.stream("POST", "/v1/chat/completions", json={**hold, "stream": True}) as held,
    ):
        assert held.status_code == 200
        for _ in range(200):  # bounded: the one slot is taken once the first token is out
            if keyed_server.health()["slots_busy"] == 1:
                break
            time.sleep(0.05)
        assert keyed_server.health()["slots_busy"] == 1
        p = _open(page, keyed_server)
        _enter_key(p, keyed_server)
        _send(p, "Hi")
        expect(p.locator("#error")).to_contain_text("Server busy (429)")
    keyed_server.wait_idle(timeout=20)
    page.assert_clean()


def _chunk(delta: dict[str, str], finish: str | None = None) -> dict[str, object]:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": [choice]}


def _canned(p: Page, events: list[object]) -> None:
    """The chat endpoint answers with these SSE events instead of the model (the page parses them)."""
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    headers = {"content-type": "text/event-stream"}
    p.route("**/v1/chat/completions", lambda route: route.fulfill(status=200, headers=headers, body=body))


def test_reasoning_is_a_collapsed_block_and_a_stream_error_is_shown(page: Watched, server: Server) -> None:
    p = _open(page, server)
    final = _chunk({}, "stop")
    final["timings"] = {"predicted_n": 5, "predicted_per_second": 42.0, "prompt_n": 3, "prompt_ms": 7.0}
    parts = [{"reasoning_content": "Two and "}, {"reasoning_content": "two..."}, {"content": "It is"}]
    _canned(
        p,
        [
            _chunk({"role": "assistant", "content": ""}),
            *map(_chunk, parts),
            _chunk({"content": " 4."}),
            final,
        ],
    )
    _send(p, "2+2?")
    reply = p.locator(".msg.assistant").last
    expect(reply.locator(".body")).to_have_text("It is 4.")
    expect(reply.locator(".meta")).to_contain_text("5 tokens · 42.0 tok/s")
    thoughts = reply.locator("details.reasoning .thoughts")
    expect(thoughts).to_have_text("Two and two...")
    expect(thoughts).to_be_hidden()  # collapsed until asked for
    reply.locator("details.reasoning summary").click()
    expect(thoughts).to_be_visible()

    p.unroute("**/v1/chat/completions")
    err = {"message": "the request timed out after 2 s", "type": "timeout_error", "param": None, "code": None}
    _canned(p, [_chunk({"role": "assistant", "content": ""}), _chunk({"content": "Partial"}), {"error": err}])
    _send(p, "again")
    expect(p.locator("#error")).to_have_text("the request timed out after 2 s")
    expect(p.locator(".msg.assistant .body").last).to_have_text("Partial")
    expect(p.locator(".msg.assistant .meta").last).to_contain_text("error")
    page.assert_clean()


def test_page_headers_and_no_webui(tiny_model: Path, server: Server) -> None:
    for path in webui.ASSETS:
        r = httpx.get(server.url + path, timeout=10)
        assert r.status_code == 200
        assert r.headers["content-security-policy"] == webui.CSP
        assert r.headers["x-content-type-options"] == "nosniff"
    with _serve(tiny_model, "--no-webui") as off:
        r = httpx.get(off.url + "/", timeout=10)
        assert r.status_code == 404 and r.json()["error"]["message"] == "no such endpoint"
        assert httpx.get(off.url + "/webui/app.js", timeout=10).status_code == 404
        assert httpx.get(off.url + "/health", timeout=10).status_code == 200
