"""Loads llama.cpp's shared libraries first in a process that will load a model.

`outpost.cli` imports this before anything else. On a CUDA build on an NVIDIA H200 host (an Intel
Xeon), llama.cpp segfaulted in its model load when `numpy.linalg`, `sentencepiece` or `gguf` had
been imported earlier in the process, and loaded when its libraries came first (as
llama-cpp-python's own `import llama_cpp` does): docs/deploy.md. The commands that load no model
(`bench`, `pull`, `models`, `gateway`) do not load llama.cpp at all.
"""

from __future__ import annotations

import sys

from outpost.envflags import MODEL_COMMANDS, subcommand

if subcommand(sys.argv[1:]) in MODEL_COMMANDS:
    from outpost.engine.cpu_builds import CpuBuildError

    try:
        import outpost.engine.lib  # noqa: F401  (chooses the CPU build, loads libllama and ggml)
    except CpuBuildError as e:  # OUTPOST_CPU_BUILD names a build that is absent or would SIGILL
        sys.exit(f"outpost: {e}")
