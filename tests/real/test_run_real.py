"""`outpost run` on real weights as a user types it: the summarize preset on a real document (a
property over seeds, since sampled text differs between CPUs), and a second architecture (Gemma 3
270M base, gemma3, no chat template): plain completion through serve, equal to llama-cpp-python's
`Llama` greedy, and the clear error of the chat path without a template.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from e2e.server_harness import TIMEOUT_SCALE
from llama_reference import Reference, first_difference
from real_server import serve

from outpost.run import RepeatGuard

# The smallest top-2 logit gap an asserted fixed text must keep at every step (test_chat_real's).
MARGIN = 1.3

pytestmark = pytest.mark.real

OUTPOST = [sys.executable, "-m", "outpost.cli"]
DOCUMENT = Path(__file__).parent.parent / "data" / "lighthouse-report.txt"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*OUTPOST, "run", *args],
        capture_output=True,
        text=True,
        timeout=300 * TIMEOUT_SCALE,
        stdin=subprocess.DEVNULL,
    )


def _summarize(model: Path, *flags: str) -> tuple[str, int, bool]:
    """`outpost run --preset summarize` on the document: the summary, the tokens it sampled, and
    whether the repeat guard stopped it."""
    r = _run("-m", str(model), "--preset", "summarize", "-f", str(DOCUMENT), "-t", "1", *flags)
    assert r.returncode == 0, r.stderr
    n_generated = int(r.stderr.split("eval time")[-1].split("/")[1].split("tokens")[0])
    return r.stdout.strip(), n_generated, "[the answer repeats itself: stopped]" in r.stderr


def test_the_summarize_preset_ends_its_summaries_and_names_the_subject(real_smollm2: Path) -> None:
    """A property of the preset, not of one seed's text: sampled text depends on the CPU's kernels
    (on a Zen 4 seed 1 once looped on ", 2019" to the limit; here it ends after ~250 tokens). Over
    several seeds and greedy, each summary ends by itself or at the repeat guard before the 512-token
    limit and names the report's subject; most are shorter than the report (measured over 48 seeds
    with benchmarks/summarize_seeds.py on an Intel Xeon: all ended by themselves, all named it, two
    were longer than the report; at --temp 0.2 a third of them loop, docs/serve.md)."""
    runs = [("-s", "1"), ("-s", "2"), ("-s", "3"), ("--temp", "0")]
    with ThreadPoolExecutor(2) as pool:  # one thread each: two at a time on a 2-core machine
        results = list(pool.map(lambda flags: _summarize(real_smollm2, *flags), runs))
    words = len(DOCUMENT.read_text().split())
    for flags, (summary, n_generated, looped) in zip(runs, results, strict=True):
        assert n_generated < 512, f"{flags}: the summary ran to its limit: {summary[-200:]!r}"
        assert summary, flags
        if looped:  # stopped by the guard: what it showed is the summary up to the loop
            assert n_generated >= RepeatGuard.MIN_SPAN, flags
        assert any(w in summary.lower() for w in ("lighthouse", "tower", "panel", "inspection")), summary
    assert statistics.median(len(s.split()) for s, _, _ in results) < words


def test_gemma3_completes_text_as_llama_does(real_gemma3: Path) -> None:
    prompt = "The capital of France is Paris. The capital of Germany is"
    ref = Reference(real_gemma3, n_ctx=512)
    try:
        tokens = ref.tokenize(prompt)
        want = ref.greedy(tokens, 16)
        # " Berlin." below holds on any CPU's rounding only if no step of it is a near-tie (the rest
        # of the text is compared with this machine's own reference, which holds anywhere).
        gaps, text = [], ""
        for k, token in enumerate(want.tokens):
            top2 = np.sort(ref.next_logits(tokens + want.tokens[:k]))[-2:]
            gaps.append(float(top2[1] - top2[0]))
            text += ref.token_text(token)
            if text.startswith(" Berlin."):
                break
    finally:
        ref.close()
    assert min(gaps) > MARGIN, [round(g, 2) for g in gaps]
    with serve(real_gemma3, "-np", "1", "-c", "1024", "--no-prefix-cache") as server:
        body = {"prompt": prompt, "temperature": 0, "max_tokens": 16}
        r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=300 * TIMEOUT_SCALE)
        assert r.status_code == 200, r.text
        got = r.json()["choices"][0]["text"]
        assert got == want.text, first_difference(got, want.text)
        assert got.startswith(" Berlin."), got  # a base model continuing the pattern
        chat = httpx.post(
            f"{server.url}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}]},
            timeout=60 * TIMEOUT_SCALE,
        )
        assert chat.status_code == 400, chat.text
        assert "no chat template" in chat.json()["error"]["message"]


def test_gemma3_chat_in_the_terminal_says_there_is_no_template(real_gemma3: Path) -> None:
    r = _run("-m", str(real_gemma3), "-p", "hi", "--single-turn", "-n", "4")
    assert r.returncode == 2, r.stderr
    last = [line for line in r.stderr.splitlines() if line.strip()][-1]
    assert "Traceback" not in r.stderr
    assert "this model has no chat template; give one with --chat-template FILE" in last
