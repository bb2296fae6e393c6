"""llama-server habits on the API and its settings (issue 26), in-process: CORS's default and its
`localhost` value, any model name where one model is served (serve, or a gateway of one model),
--chat-template's name / text / file, and --name/--no-name switches from flags and variables."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_backend import FakeBackend

from outpost.api.app import create_app
from outpost.cli import build_parser
from outpost.envflags import use_environment
from outpost.settings import EngineSettings, HttpSettings
from outpost.settings.fields import chat_template_text

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def run(coro_fn: Any, backends: Any, config: HttpSettings, **kwargs: Any) -> Any:
    async def main() -> Any:
        app = create_app(backends, config, next(iter(backends)), **kwargs)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await coro_fn(client)

    return asyncio.run(main())


def _preflight(origin: str) -> dict[str, str]:
    return {"Origin": origin, "Access-Control-Request-Method": "POST"}


@pytest.mark.parametrize(
    ("origins", "allowed", "refused"),
    [
        ((), (), ("http://localhost:5173",)),  # an empty list: off, as none
        (("none",), (), ("http://localhost:5173",)),
        (
            ("localhost",),
            ("http://localhost:5173", "https://127.0.0.1", "http://[::1]:8080"),
            ("http://evil.com",),
        ),
        (
            ("localhost", "https://app.example.com"),
            ("http://localhost", "https://app.example.com"),
            ("https://app.example.com:444", "http://localhost.evil.com"),
        ),
    ],
)
def test_cors_origins(origins: tuple[str, ...], allowed: tuple[str, ...], refused: tuple[str, ...]) -> None:
    config = HttpSettings(cors_origins=origins)

    async def go(client: httpx.AsyncClient) -> list[httpx.Response]:
        return [
            await client.options("/v1/chat/completions", headers=_preflight(o)) for o in allowed + refused
        ]

    answers = run(go, {"m": FakeBackend()}, config)
    for origin, r in zip(allowed + refused, answers, strict=True):
        echoed = r.headers.get("access-control-allow-origin")
        if origin in allowed:
            assert r.status_code == 200 and echoed == origin, origin
        else:  # llama-server's answer when CORS is on: 200, no allow headers (the browser refuses)
            assert echoed is None and (not origins or origins == ("none",) or r.status_code == 200), origin


def test_cors_by_default_answers_any_origin_with_credentials_as_llama_server() -> None:
    assert HttpSettings().cors_origins == ("*",)

    async def go(client: httpx.AsyncClient) -> tuple[httpx.Response, httpx.Response]:
        pre = await client.options("/v1/chat/completions", headers=_preflight("https://x.example"))
        get = await client.get("/health", headers={"Origin": "https://x.example"})
        return pre, get

    pre, get = run(go, {"m": FakeBackend()}, HttpSettings())
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "https://x.example"
    assert pre.headers["access-control-allow-credentials"] == "true"
    assert "access-control-allow-origin" in get.headers


def test_one_model_served_answers_to_any_name() -> None:
    """serve, or a gateway whose workers serve one model: any `model` is it; the reply names it."""
    backend = FakeBackend("abc")

    async def go(client: httpx.AsyncClient) -> tuple[Any, Any]:
        chat = (await client.post("/v1/chat/completions", json={**CHAT, "model": "gpt-4o-mini"})).json()
        emb = (
            await client.post("/v1/embeddings", json={"input": "x", "model": "text-embedding-3-small"})
        ).json()
        return chat, emb

    chat, emb = run(go, {"only": backend}, HttpSettings())
    assert chat["model"] == "only" and chat["choices"][0]["message"]["content"] == "abc"
    assert emb["model"] == "only"


def test_embedding_model_answers_embeddings_whatever_the_name() -> None:
    backend = FakeBackend()

    async def go(client: httpx.AsyncClient) -> Any:
        return (await client.post("/v1/embeddings", json={"input": "x", "model": "ada"})).json()

    emb = run(go, {"chat": backend}, HttpSettings(), embedding_ids=("bge-small",))
    assert emb["model"] == "bge-small" and backend.embedded == [["x"]]


def test_chat_template_is_a_builtin_name_inline_text_or_a_file(tmp_path: Path) -> None:
    assert chat_template_text("chatml", None) is not None and "<|im_start|>" in (
        chat_template_text("chatml", None) or ""
    )
    inline = "{% for m in messages %}{{ m.content }}{% endfor %}"
    assert chat_template_text(inline, None) == inline
    path = tmp_path / "t.jinja"
    path.write_text("{{ messages }}")
    assert chat_template_text(str(path), None) == "{{ messages }}"  # a file, as before
    assert chat_template_text(None, str(path)) == "{{ messages }}"  # --chat-template-file
    with pytest.raises(ValueError, match="built-in template"):
        chat_template_text("no-such-template", None)
    assert EngineSettings(chat_template="llama3").template_text() == chat_template_text("llama3", None)


def _parse(argv: list[str], env: dict[str, str]) -> Any:
    parser = build_parser()
    use_environment(parser, argv, env)
    return parser.parse_args(argv)


def test_switches_and_llama_server_flags_parse_from_flags_and_variables() -> None:
    args = _parse(["serve", "--no-jinja", "--context-shift", "--alias", "a,b", "--host", "127.0.0.1,::1"], {})
    engine, http = EngineSettings.from_args(args), HttpSettings.from_args(args)
    assert engine.jinja is False and engine.context_shift is True
    assert engine.aliases == ("a", "b") and engine.served_model_id("/x/m.gguf") == "a"
    assert http.hosts == ("127.0.0.1", "::1")
    assert any("--no-jinja" in n for n in engine.notices())
    from_env = EngineSettings.from_args(
        _parse(["serve"], {"OUTPOST_JINJA": "0", "OUTPOST_SLOT_SAVE_PATH": "/tmp"})
    )
    assert from_env.jinja is False and from_env.slot_save_path == "/tmp"
    http = HttpSettings.from_args(
        _parse(["gateway", "--temp", "0.2", "-s", "3", "--no-slots", "--reasoning", "off"], {})
    )
    assert (http.temp, http.seed, http.slots, http.reasoning) == (0.2, 3, False, "off")
