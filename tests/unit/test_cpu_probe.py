"""Weight layout choice: AMX's tile path is probed once per machine and cached; the choice maps to
llama.cpp's extra buffer types and the micro-batch size. No real probe runs here."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from outpost.engine import config as engine_config
from outpost.engine import cpu_probe
from outpost.engine.config import EngineConfig


@pytest.mark.parametrize(
    ("repack", "amx", "tiles", "slots", "layout"),
    [
        ("auto", False, False, 8, "repacked"),
        ("auto", True, True, 8, "repacked"),
        ("auto", True, False, 1, "amx-gemv"),
        ("auto", True, False, 2, "amx-gemv"),
        ("auto", True, False, 4, "repacked-no-amx"),
        ("off", True, False, 1, "plain"),
        ("on", True, False, 1, "repacked"),
    ],
)
def test_layout_choice(
    monkeypatch: pytest.MonkeyPatch, repack: str, amx: bool, tiles: bool, slots: int, layout: str
) -> None:
    monkeypatch.setattr(cpu_probe, "cpu_has_amx", lambda: amx)
    monkeypatch.setattr(cpu_probe, "amx_tiles_work", lambda: tiles)
    assert cpu_probe.choose_layout(repack, slots) == layout  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("layout", "extra_bufts", "ubatch", "unified"),
    [
        # auto: a KV stream per slot, except with AMX's one-token layout
        ("repacked", True, 256, False),
        ("plain", False, 256, False),
        ("amx-gemv", True, 1, True),
        ("repacked-no-amx", False, 256, False),
    ],
)
def test_layout_sets_buffers_micro_batch_and_kv_streams(
    monkeypatch: pytest.MonkeyPatch,
    tiny_model: Path,
    layout: str,
    extra_bufts: bool,
    ubatch: int,
    unified: bool,
) -> None:
    monkeypatch.setattr(engine_config, "choose_layout", lambda repack, n_slots, gpu_layers=0: layout)
    cfg = EngineConfig(model_path=str(tiny_model), n_batch=256, n_ubatch=512)
    assert (cfg.use_extra_bufts, cfg.effective_n_ubatch) == (extra_bufts, ubatch)
    assert cfg.effective_kv_unified == unified
    assert cfg.use_repack_overrides == (layout == "repacked-no-amx")
    gpu_cfg = EngineConfig(model_path=str(tiny_model), n_gpu_layers=-1)
    assert not gpu_cfg.use_repack_overrides  # the overrides would pin offloaded weights to the CPU
    for asked in ("on", "off"):
        asked_cfg = EngineConfig(model_path=str(tiny_model), kv_unified=asked)
        # llama.cpp crashes with AMX weights and a stream per slot: one pool there, whatever asked
        assert asked_cfg.effective_kv_unified == (asked == "on" or layout == "amx-gemv")
        one_slot = EngineConfig(model_path=str(tiny_model), kv_unified=asked, n_seq_max=1)
        assert one_slot.effective_kv_unified  # one slot: nothing to separate


def test_probe_runs_once_per_machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OUTPOST_HOME", str(tmp_path))
    runs: list[int] = []

    def fake_probe() -> bool:
        runs.append(1)
        return False

    monkeypatch.setattr(cpu_probe, "_run_probe", fake_probe)
    cpu_probe.amx_tiles_work.cache_clear()
    try:
        assert cpu_probe.amx_tiles_work() is False
        cpu_probe.amx_tiles_work.cache_clear()  # a new process: reads the file, no new probe
        assert cpu_probe.amx_tiles_work() is False
        assert len(runs) == 1
        saved = tmp_path / "probe" / "amx.json"
        saved.write_text(json.dumps({"key": "another machine", "tiles_work": True}))
        cpu_probe.amx_tiles_work.cache_clear()
        assert cpu_probe.amx_tiles_work() is False and len(runs) == 2  # other key: probed again
    finally:
        cpu_probe.amx_tiles_work.cache_clear()


def test_a_rebuilt_library_is_probed_again(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The same llama-cpp-python version compiled with other flags (AMX tiles fault without -fno-dse
    under gcc 12) must not reuse the old answer: the key holds the CPU libraries' size and date."""
    monkeypatch.setenv("OUTPOST_HOME", str(tmp_path / "home"))
    libs = tmp_path / "libs"
    libs.mkdir()
    (libs / "libggml-cpu.so").write_bytes(b"built without -fno-dse")
    (libs / "libggml-base.so").write_bytes(b"not a CPU kernel library")
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(libs))
    answers = iter([False, True])
    monkeypatch.setattr(cpu_probe, "_run_probe", lambda: next(answers))
    cpu_probe.amx_tiles_work.cache_clear()
    try:
        assert "libggml-cpu.so:22:" in cpu_probe.library_identity()
        assert "libggml-base" not in cpu_probe.library_identity()
        assert cpu_probe.amx_tiles_work() is False
        (libs / "libggml-cpu.so").write_bytes(b"built with -fno-dse")
        cpu_probe.amx_tiles_work.cache_clear()
        assert cpu_probe.amx_tiles_work() is True  # probed again, not the cached False
    finally:
        cpu_probe.amx_tiles_work.cache_clear()


def test_the_installed_bindings_libraries_are_found_without_llama_cpp_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Read beside the bindings without importing them (a command that needs no model loads none)."""
    monkeypatch.delenv("LLAMA_CPP_LIB_PATH", raising=False)
    code = (
        "import sys; from outpost.engine import cpu_probe; "
        "print(cpu_probe.library_identity()); print('llama_cpp' in sys.modules)"
    )
    env = {k: v for k, v in os.environ.items() if k != "LLAMA_CPP_LIB_PATH"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    identity, imported = out.stdout.split()
    assert "libggml-cpu" in identity and "libllama" in identity
    assert imported == "False"


def test_run_and_serve_flags_reach_the_engine_config(tmp_path: Path) -> None:
    """-fa and --repack, as llama-server users type them, end up in the EngineConfig both commands load."""
    from outpost.cli import build_parser
    from outpost.commands.engine import engine_config
    from outpost.run import _engine_config
    from outpost.settings import EngineSettings

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    parser = build_parser()
    serve_args = parser.parse_args(["serve", "-m", str(model), "-fa", "off", "--repack", "off", "-kvu", "on"])
    engine = engine_config(EngineSettings.from_args(serve_args), str(model))
    assert (engine.flash_attn, engine.repack, engine.weight_layout) == ("off", "off", "plain")
    assert engine.effective_kv_unified
    defaults = engine_config(EngineSettings(), str(model))
    assert (defaults.flash_attn, defaults.repack, defaults.kv_unified) == ("auto", "auto", "auto")
    run_args = parser.parse_args(["run", "-m", str(model), "--flash-attn", "on", "--repack", "off"])
    run_engine = _engine_config(run_args, 0)
    assert (run_engine.flash_attn, run_engine.weight_layout) == ("on", "plain")
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["serve", "-fa", "maybe"])
    assert exit_info.value.code == 2


def test_run_takes_its_engine_flags_from_serves_settings(tmp_path: Path) -> None:
    """-c, -t, -ngl, -sm, -fa, --repack and the chat template flags of `outpost run` are serve's
    (EngineSettings): the same spellings and help, read the same way, into the same EngineConfig."""
    from outpost.cli import RUN_ENGINE_FIELDS, build_parser
    from outpost.run import _engine_config
    from outpost.settings import EngineSettings

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    parser = build_parser()
    run_args = parser.parse_args(
        ["run", "-m", str(model), "-c", "4096", "-t", "3", "-sm", "row", "--chat-template", "chatml"]
    )
    engine = _engine_config(run_args, 4096)
    assert (engine.n_ctx, engine.n_threads, engine.n_seq_max, engine.split_mode) == (4096, 3, 1, "row")
    assert engine.chat_template is not None and "<|im_start|>" in engine.chat_template
    assert set(RUN_ENGINE_FIELDS) <= set(EngineSettings.flags())
    helps = {a.dest: a.help for a in _subparser(parser, "run")._actions}
    serve_helps = {a.dest: a.help for a in _subparser(parser, "serve")._actions}
    for name in RUN_ENGINE_FIELDS:  # serve's help plus its [env: ...] note, which run does not read
        assert serve_helps[name].startswith(helps[name]) and "[env:" not in helps[name]
    bad = parser.parse_args(["run", "-m", str(model), "-t", "0"])
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        _engine_config(bad, 0)


def _subparser(parser: object, name: str) -> argparse.ArgumentParser:
    from outpost.envflags import subparsers

    return subparsers(parser)[name]  # type: ignore[arg-type]


@pytest.mark.parametrize(("machine", "expected"), [("x86_64", True), ("aarch64", False)])
def test_amx_is_read_on_x86_only(monkeypatch: pytest.MonkeyPatch, machine: str, expected: bool) -> None:
    """Under qemu-user an arm64 process reads the x86 host's /proc/cpuinfo: its AMX flags are not ours."""
    monkeypatch.setattr(cpu_probe, "_cpuinfo", lambda: "flags\t\t: fpu avx2 amx_tile amx_int8\n")
    monkeypatch.setattr(cpu_probe.platform, "machine", lambda: machine)
    assert cpu_probe.cpu_has_amx() is expected
