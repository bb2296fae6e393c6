"""The arms: Outpost and llama-server, each without and with each speculation type, as commands.

Every arm gets the same model, threads, slots and KV cells; prompt caches are off on both
(`--no-prefix-cache`; `--no-cache-prompt -cram 0`), so every round evaluates its prompts anew.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks.harness.common import baseline_layout, llama_server_layout_args, weight_layout

SLOTS = 8
CTX_PER_SLOT = 2048
N_MAX = 16  # --spec-draft-n-max for the draft-model arms of both servers


@dataclass(frozen=True)
class Arm:
    server: str  # outpost or llama-server
    spec: str  # none, ngram-simple, ngram-mod, draft
    model: Path
    draft: Path | None = None

    @property
    def label(self) -> str:
        name = "outpost" if self.server == "outpost" else "llama-server"
        suffix = "" if self.spec == "none" else f" {self.spec}"
        target = " (f16 target)" if self.draft is not None or self.model.name.endswith("f16.gguf") else ""
        return f"{name}{suffix}{target}"

    def argv(self, port: int, threads: int, llama_server: str | None) -> list[str]:
        m, t, p = str(self.model), str(threads), str(port)
        ctx = str(SLOTS * CTX_PER_SLOT)
        if self.server == "outpost":
            argv = [sys.executable, "-m", "outpost.cli", "serve", "-m", m, "-t", t, "-np", str(SLOTS)]
            argv += ["-c", ctx, "--port", p, "--no-prefix-cache", "--spec-type", self.spec]
            if self.draft is not None:
                argv += ["-md", str(self.draft), "--spec-draft-n-max", str(N_MAX)]
            return argv
        assert llama_server is not None
        layout = llama_server_layout_args(baseline_layout(weight_layout(self.model, SLOTS), llama_server))
        argv = [llama_server, "-m", m, "-t", t, "-tb", t, "-np", str(SLOTS), "-c", ctx, "--port", p]
        argv += ["--host", "127.0.0.1", "--no-cache-prompt", "-cram", "0", *layout]
        if self.spec == "draft":
            assert self.draft is not None
            argv += ["-md", str(self.draft), "--spec-type", "draft-simple", "--spec-draft-n-max", str(N_MAX)]
            argv += ["-td", t, "-tbd", t]
        elif self.spec != "none":
            argv += ["--spec-type", self.spec]
        return argv
