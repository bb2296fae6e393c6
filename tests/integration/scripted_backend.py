"""The real `LocalBackend` over the real EngineCore and Scheduler, with a scripted runner (no model).

For the worker over a real broker where the real TextStream matters (stop strings and UTF-8
held back across a resume point): output i of a request is a piece of text the test chose, and a
test may hold the engine before a given output. `tests/fake_backend.py` is the backend fake; this
fakes only the runner under the real backend.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

from fake_backend import FakeCodec

from outpost.scheduler import Scheduler, SchedulerConfig
from outpost.scheduler.output import RunnerOutput, SampledToken, SchedulerOutput
from outpost.serving.engine_core import EngineClient, EngineCore
from outpost.serving.local_backend import LocalBackend

EOG = 0
FIRST_OUTPUT = 1000  # output i of a request is token FIRST_OUTPUT + i


class ScriptedRunner:
    """Output i of every request (whose prompt has `prompt_len` tokens) renders as `outputs[i]`; EOG after.

    With `hold_at`, the step that would sample output `hold_at` waits for `release` (the engine is
    held, the outputs before it sent): a worker can be killed at that exact point.
    """

    def __init__(self, prompt_len: int, outputs: list[bytes], hold_at: int | None = None) -> None:
        self.prompt_len = prompt_len
        self.outputs = outputs
        self.hold_at = hold_at
        self.holding = threading.Event()
        self.release = threading.Event()

    def piece(self, token: int) -> bytes:
        i = token - FIRST_OUTPUT
        return self.outputs[i] if 0 <= i < len(self.outputs) else b""

    def warmup(self) -> None:
        pass

    def close(self) -> None:
        pass

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        sampled = {}
        for chunk in out.chunks:
            if not chunk.sample:
                continue
            i = chunk.start_pos + len(chunk.tokens) - self.prompt_len  # the output this samples
            if self.hold_at is not None and i >= self.hold_at:
                self.holding.set()
                assert self.release.wait(60), "a test held the engine for too long"
            token = FIRST_OUTPUT + i if i < len(self.outputs) else EOG
            sampled[chunk.seq_id] = SampledToken(token, self.piece(token), token == EOG)
        return RunnerOutput(sampled=sampled)


class ScriptedEngine:
    """What `LocalBackend` reads of `outpost.serving.assembly.Engine`, over the real core and scheduler."""

    def __init__(self, runner: ScriptedRunner, slots: int = 1) -> None:
        config = SchedulerConfig(n_slots=slots, n_ctx=512, n_ctx_seq=256, max_queue=4, step_token_budget=64)
        self.runner = runner
        self.scheduler_config = config
        self.n_ctx_seq = config.n_ctx_seq
        self.codec = FakeCodec()
        self.prefill_budget = SimpleNamespace(tokens=0)
        self.model = SimpleNamespace(config=SimpleNamespace(model_path="", n_threads=1))
        self.core = EngineCore(Scheduler(config, runner.piece), runner, step_delay=0.0)
        self.client = EngineClient(self.core)

    def close(self) -> None:
        self.runner.release.set()
        self.core.stop()


def scripted_backend(runner: ScriptedRunner, slots: int = 1) -> LocalBackend:
    return LocalBackend(ScriptedEngine(runner, slots))  # type: ignore[arg-type]
