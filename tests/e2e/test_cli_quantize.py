"""`outpost quantize IN OUT TYPE` as a user runs it: real llama.cpp quantizer, then the result runs."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

from outpost.models.gguf_info import read_gguf_info

OUTPOST = [sys.executable, "-m", "outpost.cli"]
ISSUE_TYPES = "q4_0 q4_1 q5_0 q5_1 q8_0 q2_K q3_K_M q4_K_S q4_K_M q5_K_M q6_K".split()


def _outpost(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*OUTPOST, *args], capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL
    )


def _one_error_line(r: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def test_quantize_f16_to_q8_0_then_run(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "out" / "tiny-q8_0.gguf"
    r = _outpost("quantize", str(tiny_model), str(out), "Q8_0", "--threads", "2")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(out)
    info = read_gguf_info(out)
    assert info.file_type == "Q8_0" and info.parameters == read_gguf_info(tiny_model).parameters
    assert out.stat().st_size < tiny_model.stat().st_size * 0.6  # 8.5 bits vs 16 per weight
    n_tensors = 39  # tiny: token_embd + 4 x 9 per block + 2 norms
    assert "quantize q8_0" in r.stderr and f"{n_tensors}/{n_tensors}" in r.stderr  # the per-tensor bar
    assert [p.name for p in out.parent.iterdir()] == [out.name]  # no temporary file left
    run = _outpost("run", "-m", str(out), "-p", "hi", "-n", "4", "--single-turn")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip()


def test_refuses_to_overwrite_its_input(tiny_model: Path, tmp_path: Path) -> None:
    before = hashlib.sha256(tiny_model.read_bytes()).hexdigest()
    same = tiny_model.parent / "." / tiny_model.name
    for target in (str(tiny_model), str(same)):
        r = _outpost("quantize", str(tiny_model), target, "q4_0")
        assert r.returncode == 2
        assert "refusing to overwrite the input" in _one_error_line(r)
    link = tmp_path / "link.gguf"
    link.hardlink_to(tiny_model)
    r = _outpost("quantize", str(tiny_model), str(link), "q4_0")
    assert r.returncode == 2 and "refusing" in _one_error_line(r)
    assert hashlib.sha256(tiny_model.read_bytes()).hexdigest() == before


def test_unknown_type_lists_the_valid_ones(tiny_model: Path, tmp_path: Path) -> None:
    r = _outpost("quantize", str(tiny_model), str(tmp_path / "x.gguf"), "q4_weird")
    assert r.returncode == 2
    line = _one_error_line(r)
    assert "unknown quant type 'q4_weird'" in line
    assert all(t in line for t in ISSUE_TYPES), line
    assert not (tmp_path / "x.gguf").exists()


def test_failures_leave_no_output(tmp_path: Path) -> None:
    missing = _outpost("quantize", str(tmp_path / "missing.gguf"), str(tmp_path / "x.gguf"), "q8_0")
    assert missing.returncode == 2 and "no such model file" in _one_error_line(missing)
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"not a gguf at all" * 100)
    out = tmp_path / "out.gguf"
    r = _outpost("quantize", str(garbage), str(out), "q8_0")
    assert r.returncode == 1 and "failed to quantize" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["garbage.gguf"]
