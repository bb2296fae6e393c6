"""The CPU build a process loads, with real llama.cpp: a child process pointed at a folder of builds
(OUTPOST_CPU_BUILDS_DIR) loads the one chosen for this CPU, the model's facts name it, and an override
the CPU cannot run stops the process with a clear message instead of SIGILL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import llama_cpp

from outpost.engine.config import EngineConfig
from outpost.engine.cpu_builds import BUILDS, cpu_features
from outpost.engine.lib import CPU_BUILD
from outpost.engine.model import LoadedModel

# This environment's llama-cpp-python library, installed as a "build" of the name this CPU gets.
WHEEL_LIBS = Path(llama_cpp.__file__).parent / "lib"
CHILD = """
import json, os, sys
from outpost.engine.lib import CPU_BUILD
from outpost.engine.config import EngineConfig
from outpost.engine.model import LoadedModel
with LoadedModel(EngineConfig(model_path=sys.argv[1], n_ctx=256, n_seq_max=1)) as model:
    facts = model.describe()
print(json.dumps({"build": CPU_BUILD.name, "path": os.environ.get("LLAMA_CPP_LIB_PATH"),
                  "facts": facts["cpu_build"]}))
"""


def _build_for_this_cpu() -> str:
    return next(name for name, needs in BUILDS.items() if set(needs) <= cpu_features())


def test_this_process_says_which_library_it_loaded(tiny_model: Path) -> None:
    with LoadedModel(EngineConfig(model_path=str(tiny_model), n_ctx=256, n_seq_max=1)) as model:
        assert model.describe()["cpu_build"] == CPU_BUILD.describe()
    assert CPU_BUILD.describe().startswith("cpu build: ")


def test_a_child_loads_the_build_chosen_for_this_cpu(tiny_model: Path, tmp_path: Path) -> None:
    name = _build_for_this_cpu()
    (tmp_path / name).symlink_to(WHEEL_LIBS, target_is_directory=True)
    env = {**os.environ, "OUTPOST_CPU_BUILDS_DIR": str(tmp_path)}
    env.pop("LLAMA_CPP_LIB_PATH", None)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(tiny_model)], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["build"] == name and result["path"] == str(tmp_path / name)
    assert result["facts"].startswith(f"cpu build: {name} (the CPU has ")


def test_an_override_this_cpu_cannot_run_exits_with_the_reason(tmp_path: Path) -> None:
    lacking = next((name for name, needs in BUILDS.items() if not set(needs) <= cpu_features()), None)
    assert lacking is not None  # no CPU has both arm64 and x86 features
    (tmp_path / lacking).symlink_to(WHEEL_LIBS, target_is_directory=True)
    env = {**os.environ, "OUTPOST_CPU_BUILDS_DIR": str(tmp_path), "OUTPOST_CPU_BUILD": lacking}
    env.pop("LLAMA_CPP_LIB_PATH", None)
    out = subprocess.run(
        [sys.executable, "-m", "outpost.cli", "serve", "-m", "/nowhere.gguf"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 1
    assert f"outpost: OUTPOST_CPU_BUILD={lacking}: this CPU lacks" in out.stderr
    assert "Traceback" not in out.stderr
