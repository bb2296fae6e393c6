"""The image as SageMaker runs it: `IMAGE serve`, the model from /opt/ml/model, /ping and /invocations,
SIGTERM drains and exits 0, a non-root process, HEALTHCHECK kept. Real podman, real HTTP."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from podman_harness import FIGURES, podman

from benchmarks.harness.ports import free_port
from outpost.models import write_synthetic_model

pytestmark = pytest.mark.deploy
# OUTPOST_GRACE_PERIOD inside the container: a bound, far beyond what the drained request needs even
# on a loaded 2-core machine (~2 tokens/s measured while other builds ran).
GRACE = 600
DRAINED_TOKENS = 128  # more than any CPU decodes between reading the first chunk and the signal


@dataclass
class Container:
    name: str
    url: str
    started: float


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SageMaker's layout: the GGUF (135M shape, q4_0) in a directory mounted at /opt/ml/model."""
    root = tmp_path_factory.mktemp("opt-ml-model")
    write_synthetic_model("smollm2-135m", root / "model.gguf", quant="q4_0", seed=1)
    root.chmod(0o755)  # the container's user (uid 10001) reads it
    (root / "model.gguf").chmod(0o644)
    return root


def _wait_ping(c: Container, limit_s: float = 300) -> float:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(c.url + "/ping", timeout=2).status_code == 200:
                return time.monotonic() - c.started
        except httpx.TransportError:
            pass
        state = podman("inspect", "--format", "{{.State.Running}}", c.name, check=False).stdout.strip()
        assert state == "true", podman("logs", c.name, check=False).stderr[-3000:]
        time.sleep(0.2)
    raise AssertionError(f"/ping not 200 within {limit_s} s: " + podman("logs", c.name).stderr[-3000:])


@pytest.fixture(scope="module")
def served(image: str, model_dir: Path) -> Iterator[Container]:
    """`IMAGE serve` with nothing else but the port (host networking: no port mapping needed here)."""
    name = f"outpost-test-{os.getpid()}"
    port = free_port()
    started = time.monotonic()
    podman(
        "run", "-d", "--name", name, "--network=host",
        "-v", f"{model_dir}:/opt/ml/model:ro",
        "-e", f"OUTPOST_PORT={port}", "-e", f"OUTPOST_GRACE_PERIOD={GRACE}",
        image, "serve",
    )  # fmt: skip
    c = Container(name, f"http://127.0.0.1:{port}", started)
    try:
        FIGURES["cold start (podman run -> /ping 200, 135M q4_0)"] = f"{_wait_ping(c):.1f} s"
        yield c
    finally:
        podman("rm", "-f", "-t", "0", name, check=False)


def test_image_config_is_the_sagemaker_contract(image: str) -> None:
    info = json.loads(podman("image", "inspect", image).stdout)[0]
    cfg = info["Config"]
    assert cfg["Entrypoint"] == ["outpost"] and cfg["Cmd"] == ["serve"]
    assert "8080/tcp" in cfg["ExposedPorts"] and "OUTPOST_PORT=8080" in cfg["Env"]
    assert "OUTPOST_HOST=0.0.0.0" in cfg["Env"]
    assert cfg["StopSignal"] == "SIGTERM" and cfg["User"] == "10001:10001"
    # podman shows the docker-format HEALTHCHECK beside the OCI config (docker: inside it)
    health = info.get("Healthcheck") or cfg["Healthcheck"]
    assert health["Test"][0] == "CMD" and "/ping" in health["Test"][-1]


def test_no_compiler_and_a_portable_llama_cpp(image: str) -> None:
    out = podman(
        "run", "--rm", "--entrypoint", "sh", image, "-c",
        "command -v gcc cc g++ cmake || true; cat /opt/outpost/LLAMA_CPP_CMAKE_ARGS",
    ).stdout  # fmt: skip
    assert "gcc" not in out and "cmake " not in out.split("\n")[0]
    assert "-DGGML_NATIVE=OFF" in out and "-DGGML_OPENMP=ON" in out


def test_ping_and_the_model_from_opt_ml_model(served: Container) -> None:
    assert httpx.get(served.url + "/ping", timeout=10).status_code == 200
    models = httpx.get(served.url + "/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == ["model"]


def test_runs_as_non_root_with_threads_for_every_cpu(served: Container) -> None:
    # threads default to the CPUs the process may use: inside the container, every vCPU of the host
    threads = podman(
        "exec", served.name, "python3", "-c",
        "from outpost.engine.config import EngineConfig as E; "
        "print(E(model_path='/opt/ml/model/model.gguf').n_threads)",
    ).stdout.strip()  # fmt: skip
    assert threads == str(len(os.sched_getaffinity(0)))
    status = podman("exec", served.name, "cat", "/proc/1/status").stdout
    uid = next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:"))
    assert uid == "10001"
    cmdline = podman("exec", served.name, "cat", "/proc/1/cmdline").stdout.split("\0")
    assert "serve" in cmdline  # the server itself is PID 1 (no shell in between: it gets SIGTERM)
    # HEALTHCHECK works (kept by --format docker) and says healthy once /ping is 200.
    assert podman("healthcheck", "run", served.name, check=False).returncode == 0


def test_invocations_tgi_openai_and_sse(served: Container) -> None:
    tgi = {"inputs": "Hello", "parameters": {"max_new_tokens": 8, "do_sample": False}}
    r = httpx.post(served.url + "/invocations", json=tgi, timeout=120)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    assert isinstance(r.json()[0]["generated_text"], str)

    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "temperature": 0}
    r = httpx.post(served.url + "/invocations", json=chat, timeout=120)
    assert r.status_code == 200 and r.json()["object"] == "chat.completion"
    assert r.json()["usage"]["completion_tokens"] >= 1

    stream = {**chat, "stream": True}
    headers = {"Accept": "text/event-stream"}
    with httpx.stream("POST", served.url + "/invocations", json=stream, headers=headers, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and len(events) >= 2

    r = httpx.post(served.url + "/invocations", json={"nothing": 1}, timeout=30)
    assert r.status_code == 400 and "error" in r.json()


def test_sigterm_drains_the_request_and_exits_0(served: Container) -> None:
    body = {
        "messages": [{"role": "user", "content": "Count"}],
        "max_tokens": DRAINED_TOKENS,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    usage = None
    events = []
    with httpx.stream("POST", served.url + "/invocations", json=body, timeout=GRACE) as r:
        lines = r.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        signalled = time.monotonic()
        podman("kill", "--signal", "TERM", served.name)  # while the stream is in flight
        events = [first, *(line for line in lines if line.startswith("data: "))]
    assert events[-1] == "data: [DONE]"
    usage = json.loads(events[-2][6:])["usage"]
    assert usage["completion_tokens"] == DRAINED_TOKENS  # drained, not cut off
    code = podman("wait", served.name, timeout=GRACE + 30).stdout.strip()
    took = time.monotonic() - signalled
    assert code == "0" and took < GRACE
    logs = podman("logs", served.name).stderr
    assert "finishing 1 in flight" in logs and "Traceback" not in logs  # it was in flight at SIGTERM
    FIGURES[f"SIGTERM with a {DRAINED_TOKENS}-token stream in flight -> exit 0"] = f"{took:.1f} s"


def test_serve_m_and_env_configuration(image: str, model_dir: Path) -> None:
    """`IMAGE serve -m PATH` with flags given as OUTPOST_* variables (the container way)."""
    name = f"outpost-test-m-{os.getpid()}"
    port = free_port()
    started = time.monotonic()
    podman(
        "run", "-d", "--name", name, "--network=host", "-v", f"{model_dir}:/models/m:ro",
        "-e", f"OUTPOST_PORT={port}", "-e", "OUTPOST_ALIAS=tiny-chat", "-e", "OUTPOST_API_KEYS=k1,k2",
        image, "serve", "-m", "/models/m/model.gguf", "-np", "2",
    )  # fmt: skip
    c = Container(name, f"http://127.0.0.1:{port}", started)
    try:
        _wait_ping(c)
        assert httpx.get(c.url + "/v1/models", timeout=10).status_code == 401
        r = httpx.get(c.url + "/v1/models", headers={"Authorization": "Bearer k2"}, timeout=10)
        assert [m["id"] for m in r.json()["data"]] == ["tiny-chat"]
    finally:
        podman("rm", "-f", "-t", "0", name, check=False)


def test_other_subcommands_run_through_the_entrypoint(image: str) -> None:
    out = podman("run", "--rm", image, "serve", "--help")
    assert out.returncode == 0 and "[env: OUTPOST_API_KEY_FILE]" in " ".join(out.stdout.split())
