"""`outpost run` on real weights as a user types it: the summarize preset on a real document, and a
second architecture (Gemma 3 270M base, gemma3, no chat template): plain completion through serve,
equal to llama-cpp-python's `Llama` greedy, and the clear error of the chat path without a template.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from llama_reference import Reference, first_difference
from real_server import serve

pytestmark = pytest.mark.real

OUTPOST = [sys.executable, "-m", "outpost.cli"]
DOCUMENT = Path(__file__).parent.parent / "data" / "lighthouse-report.txt"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*OUTPOST, "run", *args], capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL
    )


def test_the_summarize_preset_gives_a_shorter_text(real_smollm2: Path) -> None:
    document = DOCUMENT.read_text()
    # The preset as a user gets it (its system prompt, the "Summarize the following text:" prefix, 512
    # tokens: more than the document, temperature 0.8) with a fixed seed, so every run is the same
    # run. Greedy (--temp 0) would not do: this 135M model then repeats one sentence to the limit.
    r = _run("-m", str(real_smollm2), "--preset", "summarize", "-f", str(DOCUMENT), "-s", "1", "-t", "1")
    assert r.returncode == 0, r.stderr
    summary = r.stdout.strip()
    n_generated = int(r.stderr.split("eval time")[-1].split("/")[1].split("tokens")[0])
    assert n_generated < 512, "the model did not end its summary by itself"
    assert 0 < len(summary.split()) < len(document.split()), summary
    assert any(word in summary.lower() for word in ("lighthouse", "tower", "panel", "inspection")), summary


def test_gemma3_completes_text_as_llama_does(real_gemma3: Path) -> None:
    prompt = "The capital of France is Paris. The capital of Germany is"
    ref = Reference(real_gemma3, n_ctx=512)
    try:
        want = ref.greedy(ref.tokenize(prompt), 16)
    finally:
        ref.close()
    with serve(real_gemma3, "-np", "1", "-c", "1024", "--no-prefix-cache") as server:
        body = {"prompt": prompt, "temperature": 0, "max_tokens": 16}
        r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
        got = r.json()["choices"][0]["text"]
        assert got == want.text, first_difference(got, want.text)
        assert got.startswith(" Berlin."), got  # a base model continuing the pattern
        chat = httpx.post(
            f"{server.url}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}]},
            timeout=60,
        )
        assert chat.status_code == 400, chat.text
        assert "no chat template" in chat.json()["error"]["message"]


def test_gemma3_chat_in_the_terminal_says_there_is_no_template(real_gemma3: Path) -> None:
    r = _run("-m", str(real_gemma3), "-p", "hi", "--single-turn", "-n", "4")
    assert r.returncode == 2, r.stderr
    last = [line for line in r.stderr.splitlines() if line.strip()][-1]
    assert "Traceback" not in r.stderr
    assert "this model has no chat template; give one with --chat-template FILE" in last
