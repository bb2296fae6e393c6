"""Commands that need no model never load llama.cpp's library; the API layer imports no engine code."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _modules_after(code: str) -> set[str]:
    probe = f"import sys\n{code}\nprint('\\n'.join(sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    return set(out.stdout.split())


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "--help"],
        ["pull", "--help"],
        ["models", "list"],
        ["ps", "--url", "http://127.0.0.1:9"],
        ["--help"],
    ],
)
def test_model_free_commands_do_not_load_llama_cpp(argv: list[str]) -> None:
    code = (
        "import contextlib, io\n"
        "from outpost import cli\n"
        "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
        f"    cli.main({argv!r})"
    )
    loaded = _modules_after(code)
    assert "llama_cpp" not in loaded
    assert not any(m.startswith("outpost.engine.lib") for m in loaded)


def test_the_api_layer_imports_no_engine_code() -> None:
    loaded = _modules_after("import outpost.api, outpost.api.app, outpost.api.server, outpost.backend")
    assert "llama_cpp" not in loaded
    engine = (
        "outpost.engine",
        "outpost.serving",
        "outpost.cluster",
    )
    assert not {m for m in loaded if m.startswith(engine)}


def test_the_settings_import_no_engine_api_or_cluster_code() -> None:
    loaded = _modules_after("import outpost.settings")
    layers = (
        "outpost.engine",
        "outpost.serving.assembly",
        "outpost.serving.local_backend",
        "outpost.api",
        "outpost.cluster",
    )
    assert not {m for m in loaded if m.startswith(layers)}
