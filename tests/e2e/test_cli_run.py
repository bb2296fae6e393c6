"""`outpost run` and `outpost models synth` as a user runs them: real processes, real terminal."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

OUTPOST = [sys.executable, "-m", "outpost.cli"]


def _outpost(*args: str, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*OUTPOST, *args],
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_single_turn_streams_an_answer_and_timings(tiny_model: Path) -> None:
    r = _outpost(
        "run",
        "-m",
        str(tiny_model),
        "-sys",
        "You are a helpful assistant",
        "-p",
        "Hello",
        "-n",
        "24",
        "-c",
        "2048",
        "--temp",
        "0",
        "--single-turn",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
    assert "prompt eval time" in r.stderr and "eval time" in r.stderr and "tokens per second" in r.stderr
    assert "is a tiny-shaped model with RANDOM WEIGHTS: its answers are noise" in r.stderr  # labelled
    again = _outpost(
        "run",
        "-m",
        str(tiny_model),
        "-sys",
        "You are a helpful assistant",
        "-p",
        "Hello",
        "-n",
        "24",
        "-c",
        "2048",
        "--temp",
        "0",
        "--single-turn",
    )
    assert again.stdout == r.stdout, "greedy decoding is deterministic"


def test_summarize_preset_reads_a_file(tiny_model: Path, tmp_path: Path) -> None:
    report = tmp_path / "report.txt"
    report.write_text("The quarterly report shows revenue grew while costs fell. " * 5)
    r = _outpost("run", "-m", str(tiny_model), "--preset", "summarize", "-f", str(report), "-n", "16")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()


def test_bad_input_exits_2_with_one_line(tiny_model: Path, tmp_path: Path) -> None:
    not_gguf = tmp_path / "notes.txt"
    not_gguf.write_text("hello")
    refusing_template = tmp_path / "refuse.jinja"
    refusing_template.write_text("{{ raise_exception('this template says no') }}")
    cases = [
        (["run", "-m", str(tmp_path / "missing.gguf"), "-p", "hi"], "not found"),
        (["run", "-m", str(not_gguf), "-p", "hi"], "not a GGUF"),
        (["run", "-m", str(tiny_model), "-c", "64", "-p", "word " * 600, "--single-turn"], "context"),
        (["run", "-m", str(tiny_model), "-n", "0", "-p", "hi"], "n-predict"),
        (["run", "-m", str(tiny_model), "-f", str(tmp_path / "nope.txt")], "cannot read"),
        (["run", "-m", str(tiny_model), "--chat-template", str(refusing_template), "-p", "hi"], "says no"),
        # serve's reading of --chat-template: inline jinja text, a built-in name, else an error
        (
            [
                "run",
                "-m",
                str(tiny_model),
                "--chat-template",
                "{{ raise_exception('inline no') }}",
                "-p",
                "hi",
            ],
            "inline no",
        ),
        (
            ["run", "-m", str(tiny_model), "--chat-template-file", str(refusing_template), "-p", "hi"],
            "says no",
        ),
        (["run", "-m", str(tiny_model), "--chat-template", "no-such-name", "-p", "hi"], "neither a built-in"),
        (["run", "-m", str(tiny_model), "--temp", "hot", "-p", "hi"], "invalid float"),
        (["models", "synth", "--shape", "gpt-9", "-o", str(tmp_path / "x.gguf")], "unknown shape"),
    ]
    for args, needle in cases:
        r = _outpost(*args)
        assert r.returncode == 2, (args, r.stderr)
        # A random-weight model is labelled as such before it loads; the error itself is one line.
        notices = [line for line in r.stderr.splitlines() if "RANDOM WEIGHTS" in line]
        assert len(notices) <= 1, r.stderr
        lines = [line for line in r.stderr.splitlines() if line.strip() and line not in notices]
        assert len(lines) == 1 and needle in lines[0], (args, r.stderr)
        assert "Traceback" not in r.stderr


def test_a_built_in_chat_template_by_name(tiny_model: Path) -> None:
    r = _outpost(
        "run", "-m", str(tiny_model), "--chat-template", "chatml", "-n", "4", "--single-turn", "-p", "hi"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()


def test_piped_stdin_is_the_prompt(tiny_model: Path) -> None:
    r = _outpost("run", "-m", str(tiny_model), "-n", "8", "--temp", "0", stdin="What is a river?\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()


def _read_until(fd: int, needle: bytes, timeout: float) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while needle not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                seen += os.read(fd, 4096)
            except OSError:
                break
    return seen


def test_interactive_chat_keeps_history_and_exits(tiny_model: Path) -> None:
    pid, fd = pty.fork()
    if pid == 0:  # child: the user's terminal session
        os.execv(sys.executable, [*OUTPOST, "run", "-m", str(tiny_model), "-n", "8", "--temp", "0"])
    try:
        assert b"> " in _read_until(fd, b"> ", 60)
        os.write(fd, b"first question\n")
        out = _read_until(fd, b"total time", 60)
        assert b"total time" in out
        os.write(fd, b"second question\n")
        out = _read_until(fd, b"[cached:", 60) + _read_until(fd, b"> ", 30)
        # The second turn re-sends the whole history; the cache serves the first turn.
        cached = int(out.split(b"[cached:")[-1].split(b"]")[0])
        assert cached > 10
        os.write(fd, b"/exit\n")
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        os.close(fd)
