"""The settings blocks (outpost/settings) through the real `outpost` parser: every field of a block is
the same flag, with the same help, in every command that takes the block, and its OUTPOST_* variable
gives the value the flag gives."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from outpost.cli import build_parser
from outpost.envflags import env_name, subparsers, use_environment
from outpost.settings import COMMANDS, Block, EngineSettings, GatewaySettings, HttpSettings
from outpost.settings.fields import Flag

PAIRS = [(command, block) for command, blocks in COMMANDS.items() for block in blocks]


def _action(command: str, dest: str) -> argparse.Action:
    parser = subparsers(build_parser())[command]
    return next(a for a in parser._actions if a.dest == dest)


def _raw(flag: Flag, action: argparse.Action) -> str | None:
    """A value the flag accepts (None for a switch), or "" when it refuses every sample."""
    if flag.action in ("store_true", "store_false", "switch"):
        return None
    if flag.choices:
        return flag.choices[-1]
    for raw in ("7", "a, b"):
        try:
            if action.type is None or (callable(action.type) and action.type(raw) is not None):
                return raw
        except (argparse.ArgumentTypeError, ValueError):
            continue
    return ""


def _parse(argv: list[str], env: dict[str, str]) -> argparse.Namespace:
    parser = build_parser()
    use_environment(parser, argv, env)
    return parser.parse_args(argv)


@pytest.mark.parametrize(("command", "block"), PAIRS, ids=[f"{c}-{b.__name__}" for c, b in PAIRS])
def test_each_field_is_its_flag_help_and_variable_in_each_command(command: str, block: type[Block]) -> None:
    flags = block.flags()
    assert flags, block
    for dest, flag in flags.items():
        action = _action(command, dest)
        long = next(n for n in flag.names if n.startswith("--"))
        variable = env_name(action)
        assert variable == "OUTPOST_" + long[2:].upper().replace("-", "_")
        switch = flag.action == "switch"  # argparse negates its long names only (-bs has no --no-s)
        negated = tuple(f"--no-{n[2:]}" for n in flag.names if n.startswith("--")) if switch else ()
        assert sorted(action.option_strings) == sorted((*flag.names, *negated))
        assert action.help is not None and action.help.startswith(flag.help)
        assert f"[env: {variable}" in action.help and flag.help.strip()
        raw = _raw(flag, action)
        if raw == "":  # a flag refused outright (the gateway's -c): refused from the variable too
            continue
        given = [long] if raw is None else [long, raw]
        from_flag = getattr(_parse([command, *given], {}), dest)
        from_env = getattr(_parse([command], {variable: "1" if raw is None else raw}), dest)
        assert from_flag is not None and from_env == from_flag, (command, dest)
        assert getattr(_parse([command], {variable: ""}), dest) is None  # empty: unset


def test_a_block_shared_by_two_commands_reads_the_same_there() -> None:
    """The same block in two commands: identical flags and help lines, checked across commands."""
    for block in (EngineSettings, HttpSettings):
        users = [c for c, blocks in COMMANDS.items() if block in blocks]
        assert len(users) == 2
        seen = [{d: (_action(c, d).option_strings, _action(c, d).help) for d in block.flags()} for c in users]
        assert seen[0] == seen[1]


def test_help_is_generated_with_the_variables(capsys: pytest.CaptureFixture[str]) -> None:
    for command, needles in {
        "serve": ["-np PARALLEL, --parallel PARALLEL", "[env: OUTPOST_SSE_KEEPALIVE]", "beyond the slots"],
        "worker": ["-sm {none,layer,row,tensor}", "[env: OUTPOST_BROKER, OUTPOST_BROKER_URL]", "--worker-id"],
        "gateway": ["--reasoning-format", "--no-webui", "per model in the broker", "-c CTX_SIZE"],
    }.items():
        with pytest.raises(SystemExit):
            _parse([command, "--help"], {})
        out = " ".join(capsys.readouterr().out.split())
        for needle in needles:
            assert needle in out, (command, needle)


def test_blocks_build_from_arguments_with_defaults_for_what_is_not_given(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("k2\n")
    args = _parse(
        ["serve", "-np", "2", "--api-key", "k1", "--cors-origins", "a, b"],
        {"OUTPOST_API_KEY_FILE": str(keys), "OUTPOST_NO_WEBUI": "1"},
    )
    engine, http = EngineSettings.from_args(args), HttpSettings.from_args(args)
    assert engine.parallel == 2 and engine.ctx_size == "auto" and engine.batch_size == 512
    assert http.api_keys == ("k1", "k2") and http.cors_origins == ("a", "b") and http.webui is False
    assert http.max_body == 4 * 1024 * 1024 and http.port == 8080


def test_max_queue_means_one_thing_per_command() -> None:
    assert _parse(["serve"], {"OUTPOST_MAX_QUEUE": "5"}).max_queue == 5
    assert GatewaySettings.from_args(_parse(["gateway"], {})).max_queue == 1024
    serve_help, gateway_help = _action("serve", "max_queue").help, _action("gateway", "max_queue").help
    assert serve_help and "default 64" in serve_help and gateway_help and "default 1024" in gateway_help


@pytest.mark.parametrize(
    ("argv", "env"), [(["gateway", "-c", "4096"], {}), (["gateway"], {"OUTPOST_CTX_SIZE": "4096"})]
)
def test_gateway_ctx_size_is_refused_on_one_line(
    argv: list[str], env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        _parse(argv, env)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "positions per request from its workers' heartbeats" in err and err.count("\n") == 1


def test_worker_gains_split_mode_and_serve_keeps_its_spellings() -> None:
    args = _parse(["worker", "-sm", "row", "-np", "3", "-kvu", "on", "-fa", "off"], {})
    engine = EngineSettings.from_args(args)
    assert (engine.split_mode, engine.parallel, engine.kv_unified, engine.flash_attn) == (
        "row",
        3,
        "on",
        "off",
    )
    args = _parse(["serve", "-a", "x", "-c", "64", "-t", "1", "-ngl", "0", "-b", "8", "-ub", "8"], {})
    engine = EngineSettings.from_args(args)
    assert (engine.model_id, engine.ctx_size, engine.threads, engine.batch_size) == ("x", 64, 1, 8)
    # llama-server's four split modes, tensor (llama.cpp's experimental tensor parallelism) too
    assert EngineSettings.from_args(_parse(["serve", "-sm", "tensor"], {})).split_mode == "tensor"


@pytest.mark.parametrize(
    ("argv", "env", "asked"),
    [
        ([], {}, "auto"),
        (["-bs"], {}, "on"),
        (["--backend-sampling"], {}, "on"),
        (["--no-backend-sampling"], {}, "off"),
        ([], {"OUTPOST_BACKEND_SAMPLING": "0"}, "off"),
    ],
)
def test_backend_sampling_is_llama_servers_bare_switch(
    tiny_model: Path, argv: list[str], env: dict[str, str], asked: str
) -> None:
    """-bs bare turns it on, --no-backend-sampling off; by default on with GPU layers only."""
    from outpost.commands.engine import engine_config

    settings = EngineSettings.from_args(_parse(["serve", *argv], env))
    config = engine_config(settings, str(tiny_model))
    assert config.backend_sampling == asked
    on_gpu = config.model_copy(update={"n_gpu_layers": -1})
    assert (config.effective_backend_sampling, on_gpu.effective_backend_sampling) == {
        "auto": (False, True),
        "on": (True, True),
        "off": (False, False),
    }[asked]
