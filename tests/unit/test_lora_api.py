"""LoRA adapters at the API and settings seams (no model): the flags, the per-request `lora` field
into `GenerateRequest`, `/lora-adapters`, and the server-wide scales a request resolves against."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_backend import FakeBackend
from test_llama_compat_api import run

from outpost.cli import build_parser
from outpost.envflags import use_environment
from outpost.messages import LoraAdapter, RequestRejected
from outpost.serving.lora_defaults import LoraDefaults
from outpost.settings import EngineSettings, HttpSettings


def _settings(argv: list[str], env: dict[str, str] | None = None) -> EngineSettings:
    parser = build_parser()
    use_environment(parser, ["serve", *argv], env or {})
    args: argparse.Namespace = parser.parse_args(["serve", *argv])
    return EngineSettings.from_args(args)


def test_lora_flags_as_llama_server_spells_them(tmp_path: Path) -> None:
    a, b, c = (tmp_path / f"{n}.gguf" for n in "abc")
    for p in (a, b, c):
        p.write_bytes(b"")
    s = _settings(["--lora", str(a), "--lora-scaled", str(b), "0.5", "--lora-scaled", f"{c}:2"])
    assert s.lora_adapters == ((str(a), 1.0), (str(b), 0.5), (str(c), 2.0))
    s = _settings(["--lora", f"{a},{b}", "--lora-init-without-apply"])
    assert s.lora_adapters == ((str(a), 0.0), (str(b), 0.0))
    s = _settings([], {"OUTPOST_LORA": str(a), "OUTPOST_LORA_SCALED": f"{b}:0.25,{c}:3"})
    assert s.lora_adapters == ((str(a), 1.0), (str(b), 0.25), (str(c), 3.0))


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--lora", "missing.gguf"], "file not found"),
        (["--lora-scaled", "X", "half"], "not a number"),
        (["--lora-scaled", "X"], "FILE SCALE or FILE:SCALE"),
    ],
)
def test_bad_lora_flags_are_one_line_errors(argv: list[str], words: str, tmp_path: Path) -> None:
    real = tmp_path / "x.gguf"
    real.write_bytes(b"")
    argv = [str(real) if w == "X" else w for w in argv]
    with pytest.raises(ValueError, match=words):
        _settings(argv)


def test_defaults_resolve_and_post_sets_unnamed_adapters_to_zero() -> None:
    lora = LoraDefaults([("a.gguf", 1.0), ("b.gguf", 0.5)])
    assert lora.resolve(None) == ((0, 1.0), (1, 0.5))
    assert lora.resolve(((1, 2.0), (1, 0.0))) == ()  # the last scale for an id wins; zeros go
    assert lora.resolve(()) == ()
    lora.set_scales(((1, 0.75),))
    assert lora.listing() == [LoraAdapter(0, "a.gguf", 0.0), LoraAdapter(1, "b.gguf", 0.75)]
    assert lora.resolve(None) == ((1, 0.75),)
    with pytest.raises(RequestRejected, match="no LoRA adapter has id 2") as refused:
        lora.resolve(((2, 1.0),))
    assert refused.value.param == "lora"


def _post(path: str, body: Any) -> tuple[FakeBackend, httpx.Response]:
    backend = FakeBackend("abc")

    async def go(client: httpx.AsyncClient) -> httpx.Response:
        return await client.post(path, json=body)

    return backend, run(go, {"m": backend}, HttpSettings())


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/completion", {"prompt": "hi", "n_predict": 2}),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    ],
)
def test_a_request_lora_list_reaches_the_engine_as_given(path: str, body: dict[str, Any]) -> None:
    backend, reply = _post(path, {**body, "lora": [{"id": 1, "scale": 0.5}, {"id": 0, "scale": 2}]})
    assert reply.status_code == 200, reply.text
    assert backend.submitted[-1].lora == ((1, 0.5), (0, 2.0))
    backend, reply = _post(path, {**body, "lora": []})  # llama-server: empty is the defaults
    assert reply.status_code == 200 and backend.submitted[-1].lora is None


@pytest.mark.parametrize(
    "lora",
    [[{"id": -1, "scale": 1}], [{"id": "x", "scale": 1}], [{"id": 0, "scale": "big"}], {"id": 0}],
)
def test_a_malformed_lora_list_is_a_400_naming_it(lora: Any) -> None:
    _, reply = _post("/completion", {"prompt": "hi", "n_predict": 2, "lora": lora})
    assert reply.status_code == 400
    assert reply.json()["error"]["param"].startswith("lora")


def test_lora_adapters_routes_without_adapters() -> None:
    backend = FakeBackend("abc")

    async def go(client: httpx.AsyncClient) -> list[httpx.Response]:
        return [
            await client.get("/lora-adapters"),
            await client.post("/lora-adapters", json=[{"id": 0, "scale": 1.0}]),
            await client.post("/lora-adapters", json={"id": 0}),
            await client.post("/lora-adapters", json=[]),
        ]

    listed, unknown, not_a_list, empty = run(go, {"m": backend}, HttpSettings())
    assert listed.status_code == 200 and listed.json() == []
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "lora"
    assert not_a_list.status_code == 400
    assert empty.status_code == 200 and empty.json() == {"success": True}
