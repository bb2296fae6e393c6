"""The chat page's markdown, code copying, conversations, regenerate/edit and phone layout, in a real
Chromium against a real server. The answers are scripted (the page's fetch of /v1/chat/completions
is answered with canned SSE events), so what is checked never depends on model output.
Screenshots go to test-artifacts/ (or $OUTPOST_TEST_ARTIFACTS)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, Route, expect
from test_webui import (  # noqa: F401  (the browser and server fixtures come with them)
    ARTIFACTS,
    WAIT_MS,
    Watched,
    _chunk,
    _open,
    _send,
    browser,
    server,
)

from outpost.api import webui

SYSTEM = {"role": "system", "content": webui.DEFAULT_SYSTEM_PROMPT}
ANSWER = (
    "Here is code:\n\n```python\nprint('hi')\n```\n\n- one\n- two\n\n"
    'Some **bold** text. <script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'
)


def _sse(text: str) -> str:
    events = [_chunk({"role": "assistant", "content": ""}), _chunk({"content": text}), _chunk({}, "stop")]
    return "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"


def _script(p: Page, answers: list[str]) -> list[dict[str, object]]:
    """Answer the page's chat requests with `answers` in turn; returns the request bodies."""
    bodies: list[dict[str, object]] = []

    def fulfil(route: Route) -> None:
        bodies.append(json.loads(route.request.post_data or "{}"))
        text = answers[min(len(bodies), len(answers)) - 1]
        route.fulfill(status=200, headers={"content-type": "text/event-stream"}, body=_sse(text))

    p.route("**/v1/chat/completions", fulfil)
    return bodies


@pytest.fixture
def page(browser: Browser) -> Iterator[Watched]:  # noqa: F811
    context = browser.new_context(viewport={"width": 1000, "height": 720})
    context.grant_permissions(["clipboard-read", "clipboard-write"])
    context.set_default_timeout(WAIT_MS)
    watched = Watched(context.new_page())
    yield watched
    context.close()


def test_markdown_is_rendered_sanitised_and_code_can_be_copied(page: Watched, server) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    p = _open(page, server)
    _script(p, [ANSWER])
    _send(p, "Show me")
    body = p.locator(".msg.assistant .body").last
    expect(body.locator("pre code")).to_have_text("print('hi')\n")
    expect(body.locator("li")).to_have_count(2)
    expect(body.locator("strong")).to_have_text("bold")
    expect(body).to_contain_text("<script>window.pwned = 1</script>")  # shown as text ...
    assert body.locator("script, img").count() == 0  # ... never made into elements
    assert p.evaluate("window.pwned") is None
    font = body.locator("pre code").evaluate("n => getComputedStyle(n).fontFamily")
    assert "monospace" in font, font
    body.locator("pre .copy").click()
    expect(body.locator("pre .copy")).to_have_text("Copied")
    assert p.evaluate("navigator.clipboard.readText()") == "print('hi')\n"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    p.screenshot(path=str(ARTIFACTS / "webui-markdown.png"))
    page.assert_clean()


def test_conversations_survive_a_reload_and_can_be_switched(page: Watched, server) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    p = _open(page, server)
    _script(p, ["First answer", "Second answer"])
    _send(p, "First question")
    expect(p.locator(".msg.assistant .body").last).to_have_text("First answer")
    p.click("#new-chat")
    expect(p.locator(".msg")).to_have_count(0)
    _send(p, "Second question")
    expect(p.locator(".msg.assistant .body").last).to_have_text("Second answer")

    p.reload()
    expect(p.locator(".msg.assistant .body")).to_have_text(["Second answer"])
    p.click("#chats-toggle")
    titles = p.locator("#chat-list .open-chat")
    expect(titles).to_have_text(["Second question", "First question"])
    titles.nth(1).click()
    expect(p.locator(".msg .body")).to_have_text(["First question", "First answer"])
    p.locator("#chat-list li").nth(0).locator(".delete-chat").click()  # drop the second one
    expect(titles).to_have_text(["First question"])
    p.reload()
    expect(p.locator(".msg .body")).to_have_text(["First question", "First answer"])
    p.screenshot(path=str(ARTIFACTS / "webui-conversations.png"))
    page.assert_clean()


def test_regenerate_and_edit(page: Watched, server) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    p = _open(page, server)
    bodies = _script(p, ["One", "Two", "Three"])
    _send(p, "Question")
    expect(p.locator(".msg.assistant .body").last).to_have_text("One")
    p.click(".msg.assistant .regenerate")
    expect(p.locator(".msg .body")).to_have_text(["Question", "Two"])
    assert bodies[0]["messages"] == bodies[1]["messages"] == [SYSTEM, {"role": "user", "content": "Question"}]

    p.click(".msg.user .edit")
    expect(p.locator(".msg")).to_have_count(0)
    assert p.input_value("#prompt") == "Question"
    p.fill("#prompt", "Better question")
    p.press("#prompt", "Enter")
    expect(p.locator(".msg .body")).to_have_text(["Better question", "Three"])
    assert bodies[2]["messages"] == [SYSTEM, {"role": "user", "content": "Better question"}]
    page.assert_clean()


def test_the_system_prompt_has_a_default_is_sent_first_and_is_kept(page: Watched, server) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    p = _open(page, server)
    bodies = _script(p, ["One", "Two", "Three"])
    assert p.input_value("#system") == webui.DEFAULT_SYSTEM_PROMPT  # a first visit: nothing saved yet
    _send(p, "Question")
    expect(p.locator(".msg.assistant .body").last).to_have_text("One")
    assert bodies[0]["messages"] == [SYSTEM, {"role": "user", "content": "Question"}]

    p.click("#settings-toggle")
    p.fill("#system", "Answer in one word.")
    p.reload()  # an edited prompt is the user's from now on, in this browser
    assert p.input_value("#system") == "Answer in one word."
    _send(p, "Another")
    expect(p.locator(".msg.assistant .body").last).to_have_text("Two")
    assert bodies[1]["messages"][0] == {"role": "system", "content": "Answer in one word."}
    assert [m["role"] for m in bodies[1]["messages"]] == ["system", "user", "assistant", "user"]

    p.click("#settings-toggle")
    p.fill("#system", "")
    p.reload()  # emptied is a choice too: the default does not come back
    assert p.input_value("#system") == ""
    _send(p, "Last")
    expect(p.locator(".msg.assistant .body").last).to_have_text("Three")
    assert [m["role"] for m in bodies[2]["messages"]] == ["user", "assistant", "user", "assistant", "user"]
    page.assert_clean()


def test_the_header_does_not_wrap_at_phone_width(browser: Browser, server) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    context = browser.new_context(viewport={"width": 375, "height": 740}, device_scale_factor=2)
    try:
        p = context.new_page()
        long_id = "a-rather-long-model-name-Q4_K_M.gguf"
        models = {"object": "list", "data": [{"id": long_id, "object": "model", "owned_by": "outpost"}]}
        p.route("**/v1/models", lambda route: route.fulfill(json=models))
        p.goto(server.url + "/")
        expect(p.locator("#model")).to_have_text(long_id)
        tops = p.locator(".bar button, .bar .brand img").evaluate_all(
            "nodes => nodes.map(n => Math.round(n.getBoundingClientRect().top))"
        )
        assert len(tops) >= 4 and max(tops) - min(tops) <= 6, tops  # one row
        assert p.locator(".bar").evaluate("n => n.getBoundingClientRect().height") < 60
        assert p.evaluate("document.documentElement.scrollWidth") <= 375  # nothing sticks out
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        p.screenshot(path=str(ARTIFACTS / "webui-phone.png"))
    finally:
        context.close()
