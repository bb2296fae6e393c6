"""Each image's CPU builds, chosen at start: the arm64 image under qemu-user as Graviton2 (neoverse-n1)
and as a CPU with SVE and i8mm (Graviton3's 256-bit vectors), the amd64 image natively. Each answers
SageMaker's /invocations with the real SmolLM2-135M, greedy: "Paris" for the capital of France, and
exits 0 on SIGTERM.

Emulation proves that the right build is picked and runs without an illegal instruction, not its
speed: generations are kept short, the kernel probe (it would measure the emulator) is off.
OUTPOST_TEST_IMAGE_ARM64 names the arm64 image (make test-deploy builds it with ARCH=arm64);
otherwise this module builds it with deploy/image.sh.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from podman_harness import FIGURES, built_image, podman

from benchmarks.harness.ports import free_port
from outpost.engine.cpu_builds import BUILDS, cpu_features

pytestmark = pytest.mark.deploy
HELPFUL = {"role": "system", "content": "You are a helpful assistant"}
FRANCE = {
    # tests/real's question: its answer has no near-tie another CPU's rounding could break (test_chat_real)
    "messages": [HELPFUL, {"role": "user", "content": "Name the capital of France."}],
    "max_tokens": 8,  # "The capital of France is Paris." is 7 tokens
    "temperature": 0,
}
# qemu-user: SmolLM2-135M loads and answers in minutes, not seconds, on a loaded 2-core machine (SVE is
# emulated slowest: 36 s to /ping, 269 s for the 8 tokens measured with a load average of 9).
EMULATED_LIMIT_S = 1500


@pytest.fixture(scope="module")
def arm64_image() -> str:
    return built_image("OUTPOST_TEST_IMAGE_ARM64", "arm64 image", arch="arm64")


@pytest.fixture(scope="module")
def real_model_dir(real_smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SageMaker's /opt/ml/model holding the real SmolLM2-135M-Instruct (q4_1)."""
    root = tmp_path_factory.mktemp("opt-ml-model-real")
    shutil.copyfile(real_smollm2, root / "model.gguf")
    root.chmod(0o755)
    (root / "model.gguf").chmod(0o644)
    return root


@contextmanager
def _served(
    image: str, model_dir: Path, env: dict[str, str], limit_s: float
) -> Iterator[tuple[str, str, str]]:
    """`IMAGE serve` on the model with one slot and a small context; (url, its log, the container's
    name) once it is ready."""
    name = f"outpost-test-cpu-{os.getpid()}-{time.monotonic_ns()}"
    port = free_port()
    env_args = [arg for key, value in env.items() for arg in ("-e", f"{key}={value}")]
    podman(
        "run", "-d", "--name", name, "--network=host", "-v", f"{model_dir}:/opt/ml/model:ro",
        "-e", f"OUTPOST_PORT={port}", "-e", "OUTPOST_KERNEL_PROBE=off", *env_args,
        image, "serve", "-np", "1", "-c", "512", "-t", "2",
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    try:
        while True:
            logs = podman("logs", name, check=False).stderr
            # /ping turns 200 before the ready line is logged (the server's next tick), and podman's
            # log lags the process: wait for both, so the test reads the line it asserts on.
            if "ready:" in logs and _pings(url):
                break
            state = podman("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", name).stdout
            assert state.startswith("running"), f"{state}: {logs[-3000:]}"  # SIGILL: exited 132
            assert time.monotonic() - started < limit_s, f"not ready within {limit_s} s: {logs[-3000:]}"
            time.sleep(1)
        FIGURES[f"{image} {env}: podman run -> ready and /ping 200"] = f"{time.monotonic() - started:.0f} s"
        yield url, podman("logs", name).stderr, name
    finally:
        podman("rm", "-f", "-t", "0", name, check=False)


def _pings(url: str) -> bool:
    try:
        return httpx.get(url + "/ping", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def _answers_paris(url: str, timeout: float) -> str:
    r = httpx.post(url + "/invocations", json=FRANCE, timeout=timeout)
    assert r.status_code == 200, r.text
    text = r.json()["choices"][0]["message"]["content"]
    assert "Paris" in text, text
    return str(text)


def cpu_model() -> str:
    """lscpu's words for this host's CPU: which one a figure came from."""
    lines = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    named = ("Model name", "CPU family", "Model")
    return ", ".join(f"{key.lower()} {fields[key].strip()}" for key in named if key in fields)


def _ready_build(logs: str) -> str:
    ready = [line for line in logs.splitlines() if "ready:" in line]
    assert ready, logs[-3000:]
    found = re.search(r"cpu build: (\S+) \(([^)]*)\)", ready[-1])
    assert found, ready[-1]
    return found.group(1)


@pytest.mark.timeout(2 * EMULATED_LIMIT_S)  # measured: 5 min for SVE+i8mm on a loaded 2-core machine
@pytest.mark.parametrize(
    ("qemu_cpu", "build"),
    [("neoverse-n1", "arm64-n1"), ("max,sve-default-vector-length=32", "arm64-sve-i8mm")],
)
def test_arm64_image_under_qemu_picks_the_build_and_answers(
    arm64_image: str, real_model_dir: Path, qemu_cpu: str, build: str
) -> None:
    uname = podman("run", "--rm", "-e", f"QEMU_CPU={qemu_cpu}", "--entrypoint", "uname", arm64_image, "-m")
    assert uname.stdout.strip() == "aarch64"
    env = {"QEMU_CPU": qemu_cpu}
    with _served(arm64_image, real_model_dir, env, EMULATED_LIMIT_S) as (url, logs, name):
        assert _ready_build(logs) == build
        assert httpx.get(url + "/ping", timeout=30).status_code == 200
        started = time.monotonic()
        _answers_paris(url, timeout=EMULATED_LIMIT_S)
        FIGURES[f"arm64 {build} under qemu: the 8-token answer"] = f"{time.monotonic() - started:.0f} s"
        podman("stop", "-t", "120", name, timeout=300)  # SIGTERM, nothing in flight: drains at once
        code = podman("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip()
        assert code == "0", podman("logs", name, check=False).stderr[-3000:]


def test_arm64_image_is_the_same_contract(arm64_image: str) -> None:
    """SageMaker's config as the amd64 image's, uid 10001, and every role through the entrypoint."""
    info = json.loads(podman("image", "inspect", arm64_image).stdout)[0]
    cfg = info["Config"]
    assert info["Architecture"] == "arm64" and cfg["User"] == "10001:10001"
    assert cfg["Entrypoint"] == ["outpost"] and cfg["Cmd"] == ["serve"] and cfg["StopSignal"] == "SIGTERM"
    assert "/ping" in (info.get("Healthcheck") or cfg["Healthcheck"])["Test"][-1]
    uid = podman("run", "--rm", "--entrypoint", "id", arm64_image, "-u").stdout.strip()
    assert uid == "10001"
    for role in ("gateway", "worker"):
        out = podman("run", "--rm", arm64_image, role, "--help", check=False, timeout=600)
        assert out.returncode == 0 and "--broker" in out.stdout, out.stderr[-2000:]


def test_arm64_override_that_would_sigill_is_refused(arm64_image: str) -> None:
    """OUTPOST_CPU_BUILD=arm64-sve-i8mm on an N1: a clear error and exit 1, not SIGILL mid-request."""
    out = podman(
        "run", "--rm", "-e", "QEMU_CPU=neoverse-n1", "-e", "OUTPOST_CPU_BUILD=arm64-sve-i8mm",
        arm64_image, "serve", "-m", "/nowhere.gguf",
        check=False, timeout=600,
    )  # fmt: skip
    assert out.returncode == 1, out.stderr[-2000:]
    assert "OUTPOST_CPU_BUILD=arm64-sve-i8mm: this CPU lacks" in out.stderr and "sve" in out.stderr


@pytest.mark.parametrize(("override", "build"), [(None, "amd64-avx512"), ("amd64-v3", "amd64-v3")])
def test_amd64_image_natively(image: str, real_model_dir: Path, override: str | None, build: str) -> None:
    """The amd64 image on this host: the AVX-512 build where the CPU has it (else skipped: which ran is
    reported), and amd64-v3 by OUTPOST_CPU_BUILD on any x86-64-v3 host."""
    features = cpu_features()
    if not set(BUILDS[build]) <= features:
        pytest.skip(f"this host lacks {sorted(set(BUILDS[build]) - features)} for {build}")
    env = {"OUTPOST_CPU_BUILD": override} if override else {}
    with _served(image, real_model_dir, env, 600) as (url, logs, _):
        assert _ready_build(logs) == build
        if override:
            assert f"cpu build: {build} (OUTPOST_CPU_BUILD)" in logs
        _answers_paris(url, timeout=300)
        FIGURES[f"amd64 natively: {build}"] = f"ran on {cpu_model()}"
