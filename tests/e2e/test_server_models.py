"""Several models on one real `outpost serve`, as llama-server's router mode and Ollama serve them:
`--models-dir` names each GGUF by its stem, a request loads its model, `--models-max 1` unloads the
other, GET /models says each one's state, POST /models/unload frees one; `--sleep-idle-seconds`
unloads an idle model and the next request reloads it while /health, /props and /metrics answer.
Driven with the `openai` and `ollama` clients and raw HTTP."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import openai
import pytest
from server_harness import OUTPOST, Server, assert_openai_error, start

HI = [{"role": "user", "content": "Say hi"}]


@pytest.fixture(scope="module")
def models_dir(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from outpost.models import write_synthetic_model

    root = tmp_path_factory.mktemp("models-dir")
    shutil.copyfile(tiny_model, root / "chat.gguf")
    write_synthetic_model("tiny", root / "other.gguf", quant="f16", seed=1)
    (root / "notes.txt").write_text("not a model")
    return root


@pytest.fixture(scope="module")
def router(models_dir: Path) -> Iterator[Server]:
    args = ["--models-dir", str(models_dir), "--models-max", "1", "-np", "1", "-c", "512"]
    with start(None, *args, "--default-max-tokens", "4") as srv:
        yield srv


def states(server: Server) -> dict[str, str]:
    r = httpx.get(f"{server.url}/models", timeout=10)
    assert r.status_code == 200, r.text
    return {card["id"]: card["status"]["value"] for card in r.json()["data"]}


def wait_for(server: Server, want: dict[str, str], timeout: float = 120) -> None:
    """Bounded poll of GET /models for what a background load or an idle timer does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if states(server) == want:
            return
        time.sleep(0.1)
    raise AssertionError(f"GET /models never showed {want}: {states(server)}\n{server.stderr()[-3000:]}")


def chat(server: Server, model: str) -> Any:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", timeout=120)
    return client.chat.completions.create(model=model, messages=HI, max_tokens=4)  # type: ignore[arg-type]


def test_each_model_loads_on_its_first_request_and_models_max_unloads_the_other(router: Server) -> None:
    assert states(router) == {"chat": "unloaded", "other": "unloaded"}
    assert router.health()["status"] == "ok"
    assert "ready: serving 2 models (chat, other)" in router.stderr()
    assert chat(router, "chat").choices[0].finish_reason in ("stop", "length")
    assert states(router) == {"chat": "loaded", "other": "unloaded"}
    assert chat(router, "other").usage.completion_tokens >= 1
    assert states(router) == {"chat": "unloaded", "other": "loaded"}  # --models-max 1


def test_an_unknown_model_is_a_404_naming_the_served_ones(router: Server) -> None:
    r = httpx.post(f"{router.url}/v1/chat/completions", json={"model": "nope", "messages": HI}, timeout=30)
    err = assert_openai_error(r, 404, "model_not_found")
    assert "'chat'" in err["message"] and "'other'" in err["message"]


def test_load_and_unload_by_hand_and_ollama_sees_what_is_loaded(router: Server) -> None:
    r = httpx.post(f"{router.url}/models/load", json={"model": "chat"}, timeout=30)
    if r.status_code == 400:  # loaded by an earlier test in this module
        assert "already running" in r.json()["error"]["message"]
    else:
        assert r.json() == {"success": True}
    wait_for(router, {"chat": "loaded", "other": "unloaded"})
    client = ollama.Client(host=router.url, timeout=120)
    assert [m.model for m in client.ps().models] == ["chat"]
    assert {m.model for m in client.list().models} >= {"chat", "other"}
    assert client.generate("chat", keep_alive=0).done_reason == "unload"  # `ollama stop chat`
    assert states(router)["chat"] == "unloaded" and client.ps().models == []
    r = httpx.post(f"{router.url}/models/unload", json={"model": "chat"}, timeout=30)
    assert r.status_code == 400 and "not running" in r.json()["error"]["message"]


def test_outpost_ps_and_stop_on_the_command_line(router: Server) -> None:
    chat(router, "other")
    ps = subprocess.run([*OUTPOST, "ps", "--url", router.url], capture_output=True, text=True, timeout=60)
    assert ps.returncode == 0, ps.stderr
    rows = [line.split() for line in ps.stdout.splitlines()]
    assert rows[0] == ["NAME", "STATUS", "UNLOADS"]
    assert ["chat", "unloaded"] in rows and ["other", "loaded", "never"] in rows
    stop = [*OUTPOST, "stop", "other", "--url", router.url]
    done = subprocess.run(stop, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "unloaded other", done.stderr
    assert states(router)["other"] == "unloaded"
    again = subprocess.run(stop, capture_output=True, text=True, timeout=60)
    assert again.returncode == 1 and "not running" in again.stderr and "Traceback" not in again.stderr


def test_an_idle_model_sleeps_and_the_next_request_wakes_it(tiny_model: Path) -> None:
    with start(tiny_model, "--sleep-idle-seconds", "1", "-np", "1", "-c", "512") as srv:
        name = tiny_model.stem
        wait_for(srv, {name: "unloaded"}, timeout=60)  # loaded at start, asleep once idle
        assert httpx.get(f"{srv.url}/health", timeout=10).status_code == 200
        assert httpx.get(f"{srv.url}/props", timeout=10).status_code == 200
        assert httpx.get(f"{srv.url}/metrics", timeout=10).status_code == 200
        assert chat(srv, name).usage.completion_tokens >= 1  # woken by the request
        assert srv.stderr().count(f"loaded model {name}") == 2  # at start, then woken
