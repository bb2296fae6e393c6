"""OUTPOST_* variables as flag defaults (outpost/envflags.py), through the real `outpost` parser."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from outpost.cli import build_parser
from outpost.envflags import env_name, subparsers, use_environment
from outpost.models.store import gguf_in_dir, resolve_model_arg, sagemaker_model


def _parse(argv: list[str], env: dict[str, str]) -> argparse.Namespace:
    parser = build_parser()
    use_environment(parser, argv, env)
    return parser.parse_args(argv)


def test_every_serve_flag_has_a_variable_named_from_its_long_flag() -> None:
    serve = subparsers(build_parser())["serve"]
    names = {env_name(a) for a in serve._actions} - {None}
    assert {"OUTPOST_API_KEY_FILE", "OUTPOST_ALIAS", "OUTPOST_MODEL", "OUTPOST_PARALLEL"} <= names
    assert {"OUTPOST_NO_PREFIX_CACHE", "OUTPOST_KV_UNIFIED", "OUTPOST_GRACE_PERIOD"} <= names
    long_flags = [a for a in serve._actions if any(s.startswith("--") for s in a.option_strings)]
    assert len(names) == len(long_flags) - 1  # all but --help


def test_variables_become_defaults_with_types_lists_and_switches() -> None:
    env = {
        "OUTPOST_ALIAS": "my-model",
        "OUTPOST_API_KEY_FILE": "/run/secrets/keys",
        "OUTPOST_PARALLEL": "2",
        "OUTPOST_GRACE_PERIOD": "7.5",
        "OUTPOST_API_KEY": "k1, k2,",
        "OUTPOST_LOG_PROMPTS": "yes",
        "OUTPOST_NO_PREFIX_CACHE": "1",
        "OUTPOST_KV_UNIFIED": "off",
        "OUTPOST_HOST": "0.0.0.0",
    }
    args = _parse(["serve"], env)
    assert args.model_id == "my-model" and args.api_key_file == "/run/secrets/keys"
    assert args.parallel == 2 and args.grace_period == 7.5 and args.api_keys == ["k1", "k2"]
    assert args.log_prompts is True and args.prefix_cache is False and args.kv_unified == "off"
    assert args.host == "0.0.0.0"


def test_flags_beat_variables_and_switches_turned_off_keep_defaults() -> None:
    env = {"OUTPOST_PARALLEL": "2", "OUTPOST_NO_PREFIX_CACHE": "0", "OUTPOST_LOG_PROMPTS": "false"}
    args = _parse(["serve", "-np", "8"], env)
    assert args.parallel == 8 and args.prefix_cache is None and args.log_prompts is False


def test_documented_names_keep_working_and_own_names_win() -> None:
    args = _parse(["serve"], {"OUTPOST_MODEL_PATH": "a.gguf", "OUTPOST_API_KEYS": "x,y"})
    assert args.model == "a.gguf" and args.api_keys == ["x", "y"]
    args = _parse(["serve"], {"OUTPOST_MODEL_PATH": "a.gguf", "OUTPOST_MODEL": "b.gguf"})
    assert args.model == "b.gguf"


def test_other_commands_ignore_the_variables() -> None:
    args = _parse(["run"], {"OUTPOST_THREADS": "not-a-number", "OUTPOST_MODEL": "x.gguf"})
    assert args.threads is None and args.model is None


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OUTPOST_PARALLEL": "many"}, "OUTPOST_PARALLEL='many' is not a valid parallel"),
        ({"OUTPOST_KV_UNIFIED": "maybe"}, "OUTPOST_KV_UNIFIED='maybe': choose one of auto, on, off"),
        ({"OUTPOST_LOG_PROMPTS": "sure"}, "OUTPOST_LOG_PROMPTS='sure': use 1/true"),
    ],
)
def test_bad_values_are_one_line_usage_errors(
    env: dict[str, str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        _parse(["serve"], env)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_help_lists_the_variables(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parse(["serve", "--help"], {})
    out = " ".join(capsys.readouterr().out.split())
    for name in (
        "[env: OUTPOST_API_KEY_FILE]",
        "[env: OUTPOST_ALIAS]",
        "[env: OUTPOST_MODEL, OUTPOST_MODEL_PATH]",
    ):
        assert name in out


def test_gguf_in_dir_finds_the_model_or_the_first_shard(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "m.gguf").write_bytes(b"GGUF")
    assert gguf_in_dir(tmp_path) == tmp_path / "sub" / "m.gguf"
    assert resolve_model_arg(str(tmp_path)) == str(tmp_path / "sub" / "m.gguf")
    split = tmp_path / "split"
    split.mkdir()
    for i in (1, 2):
        (split / f"big-0000{i}-of-00002.gguf").write_bytes(b"GGUF")
    assert gguf_in_dir(split) == split / "big-00001-of-00002.gguf"
    with pytest.raises(ValueError, match=r"several \.gguf files"):
        gguf_in_dir(tmp_path)


def test_sagemaker_model_dir(tmp_path: Path) -> None:
    assert sagemaker_model(str(tmp_path / "missing")) is None
    assert sagemaker_model(str(tmp_path)) is None
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    assert sagemaker_model(str(tmp_path)) == str(tmp_path / "model.gguf")
