"""Drives a Scheduler against a FakeRunner the way serving/engine_core.py does, checking invariants
every step.

Each step: schedule(now) -> runner.execute(out) (unless empty) -> update_from_output(out, res, now).
Checked on the way: slots never exceed n_slots; the batch stays within the budget; generating
sequences' single decode tokens come before any prompt chunk; the scheduler's view of every
sequence and of the cell count equals the simulated KV cache; at most one event per request per
update; nothing after a request's finished event.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from fake_runner import FakeRunner, piece

from outpost.messages import GenerateRequest, SamplingParams, TokenEvent
from outpost.scheduler import Scheduler, SchedulerConfig
from outpost.scheduler.output import RunnerOutput, SchedulerOutput


@dataclass
class Harness:
    config: SchedulerConfig
    runner: FakeRunner = field(default_factory=FakeRunner)
    now: float = 100.0
    dt: float = 0.01  # seconds per step
    sched: Scheduler = field(init=False)
    events: dict[str, list[TokenEvent]] = field(default_factory=dict)
    first_event_step: dict[str, int] = field(default_factory=dict)
    n_steps: int = 0

    def __post_init__(self) -> None:
        self.sched = Scheduler(self.config, piece)  # the runner's pieces, as assembly.Engine wires them
        if self.runner.n_batch is None:
            self.runner.n_batch = self.config.step_token_budget

    def add(
        self,
        prompt: Sequence[int],
        max_tokens: int = 8,
        request_id: str | None = None,
        **kwargs: object,
    ) -> str:
        req = GenerateRequest(list(prompt), max_tokens, arrival_time=self.now, **kwargs)  # type: ignore[arg-type]
        if request_id is not None:
            req.request_id = request_id
        self.sched.add_request(req)
        self.events[req.request_id] = []
        return req.request_id

    def step(self) -> list[TokenEvent]:
        out = self.sched.schedule(self.now)
        assert self.sched.slots_busy <= self.config.n_slots
        assert out.num_tokens <= self.config.step_token_budget
        cells = self.sched.kv_cells_used
        views = {i: self.sched.cached_tokens(i) for i in range(self.config.n_slots)}
        if out.is_empty:
            res = RunnerOutput()
        else:
            self.runner.prepare(out)
            self._check_view(out, cells, views)
            res = self.runner.decode(out)
        self.now += self.dt
        events = self.sched.update_from_output(out, res, self.now)
        self._record(events)
        self.n_steps += 1
        return events

    def _check_view(self, out: SchedulerOutput, cells: int, views: dict[int, tuple[int, ...]]) -> None:
        assert cells == self.runner.kv.used, f"scheduler counts {cells} cells, KV has {self.runner.kv.used}"
        for seq, view in views.items():
            assert list(view) == self.runner.kv.tokens(seq), f"seq {seq} view differs"
        decode_phase = True
        for chunk in out.chunks:
            is_decode = chunk.seq_id in self.runner.generating
            assert decode_phase or not is_decode, "a decode token after a prompt chunk"
            decode_phase = decode_phase and is_decode
            if is_decode:
                assert len(chunk.tokens) == 1 + chunk.n_draft and chunk.sample

    def _record(self, events: list[TokenEvent]) -> None:
        ids = [e.request_id for e in events]
        assert len(ids) == len(set(ids)), f"two events for one request in one update: {ids}"
        for event in events:
            history = self.events[event.request_id]
            assert not (history and history[-1].finished), f"event after the end: {event}"
            history.append(event)
            self.first_event_step.setdefault(event.request_id, self.n_steps)

    def run(self, max_steps: int = 5000) -> None:
        for _ in range(max_steps):
            if not self.sched.has_work():
                break
            self.step()
        assert not self.sched.has_work(), "scheduler did not drain"
        for rid, history in self.events.items():
            assert sum(e.finished for e in history) == 1, f"{rid}: {len(history)} events, not one finish"

    # ---- reading results ---------------------------------------------------------------------

    def final(self, rid: str) -> TokenEvent:
        last = self.events[rid][-1]
        assert last.finished
        return last

    def text(self, rid: str) -> str:
        return "".join(e.text for e in self.events[rid])

    def token_ids(self, rid: str) -> list[int]:
        return [t for e in self.events[rid] for t in e.token_ids]


def greedy(**kwargs: object) -> SamplingParams:
    return SamplingParams(temperature=0.0, **kwargs)  # type: ignore[arg-type]
