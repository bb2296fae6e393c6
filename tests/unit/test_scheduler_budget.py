"""The prefill budget in the scheduler: it caps prompt tokens exactly in the steps where something
generates, uses all of itself there (a prompt never stalls), and leaves a prompt alone whole steps."""

from __future__ import annotations

from fake_runner import reference_tokens
from sched_harness import Harness

from outpost.scheduler import SchedulerConfig
from outpost.scheduler.output import SchedulerOutput


def prompt(n: int, base: int = 100) -> list[int]:
    return list(range(base, base + n))


def config(budget: int | None, n_slots: int = 3, n_batch: int = 64) -> SchedulerConfig:
    return SchedulerConfig(
        n_slots=n_slots, n_ctx=2048, n_ctx_seq=1024, step_token_budget=n_batch, prefill_budget=budget
    )


class StepLog:
    """For each step the harness runs: its output and the sequences that were generating in it."""

    def __init__(self, h: Harness) -> None:
        self.steps: list[tuple[SchedulerOutput, set[int]]] = []
        prepare = h.runner.prepare

        def recording(out: SchedulerOutput) -> None:
            prepare(out)  # updates which sequences generate (a new chain means a new request)
            self.steps.append((out, set(h.runner.generating)))

        h.runner.prepare = recording  # type: ignore[method-assign]

    def split(self) -> list[tuple[int, int, bool]]:
        """Per step: decode tokens, prompt tokens, and whether a prompt's last chunk was in it."""
        rows = []
        for out, generating in self.steps:
            decode = [c for c in out.chunks if c.seq_id in generating]
            reads = [c for c in out.chunks if c.seq_id not in generating]
            rows.append((len(decode), sum(len(c.tokens) for c in reads), any(c.sample for c in reads)))
        return rows


def test_the_cap_holds_exactly_while_something_generates_and_is_always_used() -> None:
    """A stream generates while two long prompts arrive; it ends half way through them. Every
    step that decodes reads exactly 8 prompt tokens (fewer only where a prompt's last chunk is),
    every step that does not reads a whole n_batch, and every answer is unchanged."""
    h = Harness(config(8))
    stream = h.add(prompt(4), max_tokens=25)
    h.step()
    log = StepLog(h)
    long_a, long_b = prompt(150, base=1000), prompt(100, base=3000)
    a, b = h.add(long_a, max_tokens=2), h.add(long_b, max_tokens=2)
    h.run()
    rows = log.split()
    reading = rows[: max(i for i, (_, _, last) in enumerate(rows) if last) + 1]  # until b's last chunk
    with_decode = [(read, last) for decode, read, last in reading if decode]
    alone = [(read, last) for decode, read, last in reading if not decode]
    assert with_decode and alone, "both kinds of step happened"
    assert all(read == 8 or last for read, last in with_decode), with_decode
    assert all(read == 64 or last for read, last in alone), alone
    assert sum(read for _, read, _ in rows) == len(long_a) + len(long_b)
    assert h.token_ids(stream) == reference_tokens(prompt(4), 25)
    assert h.token_ids(a) == reference_tokens(long_a, 2)
    assert h.token_ids(b) == reference_tokens(long_b, 2)


def test_a_prompt_with_nothing_generating_is_read_as_fast_as_with_no_budget() -> None:
    """TTFT does not change for a request alone: the same whole-n_batch chunks, the same steps."""
    runs = []
    for budget in (8, None):
        h = Harness(config(budget))
        rid = h.add(prompt(300), max_tokens=3)
        h.run()
        chunks = [[len(c.tokens) for c in out.chunks] for out in h.runner.steps]
        runs.append((chunks, h.first_event_step[rid], h.token_ids(rid)))
    assert runs[0] == runs[1]
    assert runs[0][0][:5] == [[64], [64], [64], [64], [44]]


def test_many_generating_streams_still_leave_the_prompt_its_tokens() -> None:
    """Seven streams decode in a 12-token step with a budget of 8: the prompt gets the 5 tokens
    left each step (n_batch bounds it before the budget does), never none."""
    h = Harness(config(8, n_slots=8, n_batch=12))
    streams = [h.add(prompt(3, base=200 + 10 * i), max_tokens=60) for i in range(7)]
    for _ in range(3):
        h.step()
    log = StepLog(h)
    long = prompt(40, base=5000)
    rid = h.add(long, max_tokens=1)
    while not h.events[rid]:
        h.step()
    reads = [(decode, read, last) for decode, read, last in log.split()]
    assert all(decode == 7 for decode, _, _ in reads)
    assert [read for _, read, _ in reads] == [5] * 8, "40 prompt tokens, 5 a step"
    h.run()
    for i, stream in enumerate(streams):
        assert h.token_ids(stream) == reference_tokens(prompt(3, base=200 + 10 * i), 60)
