"""A resumed request (a cluster worker took over a stream): its text goes on exactly as if never cut.

The old worker delivered the first k tokens and the text its TextStream released for them; the new
one gets prompt + those k tokens with `n_resumed = k`. What the client sees in the end, the old
delivered text plus the new run's, must equal one uninterrupted run at every cut point, also when
a stop string or a UTF-8 character is split across it; max_tokens stays the answer's whole budget.
"""

from __future__ import annotations

import pytest
from fake_runner import EOG
from sched_harness import Harness, greedy

from outpost.messages import FinishReason, GenerateRequest, RequestRejected
from outpost.scheduler import Scheduler, SchedulerConfig

PROMPT = [100, 101, 102]
# Token ids of fake_runner.VOCAB: 1.. letters, 40 "S", 41 "T", 42 "O", 43 "P", 44 "ST", 45 "OP",
# 30/31 "é" split as c3|a9, 32/33 "€" split as e2|82ac, 34/35 "😀" split as f09f|9880.
CASES = {
    "stop string split over tokens": ([1, 2, 40, 41, 42, 43, 3, 4], ("STOP",)),
    "stop string split over two pieces": ([1, 44, 45, 3, 4, 5], ("STOP",)),
    "a partial stop that does not complete": ([1, 40, 41, 42, 3, 4, 5, 6], ("STOP",)),
    "multibyte characters split over tokens": ([1, 30, 31, 32, 33, 34, 35, 2], ()),
    "both at once": ([30, 31, 40, 32, 33, 41, 42, 43, 5], ("S€TOP",)),
}


def config() -> SchedulerConfig:
    return SchedulerConfig(n_slots=2, n_ctx=512, n_ctx_seq=256, step_token_budget=16)


def uninterrupted(outputs: list[int], stop: tuple[str, ...], max_tokens: int) -> Harness:
    h = Harness(config())
    h.runner.script(PROMPT, outputs)
    h.add(PROMPT, max_tokens, request_id="full", stop=stop, sampling=greedy())
    h.run()
    return h


def resumed(outputs: list[int], stop: tuple[str, ...], max_tokens: int, sent: list[int]) -> Harness:
    """A fresh engine (another worker) running the rest of the request."""
    h = Harness(config())
    h.runner.script(PROMPT, outputs)
    h.add(PROMPT + sent, max_tokens, request_id="rest", stop=stop, sampling=greedy(), n_resumed=len(sent))
    h.run()
    return h


@pytest.mark.parametrize("case", list(CASES))
def test_every_cut_point_gives_the_uninterrupted_text(case: str) -> None:
    outputs, stop = CASES[case]
    max_tokens = len(outputs)
    full = uninterrupted(outputs, stop, max_tokens)
    n_events = len(full.events["full"])
    for k in range(1, n_events):
        before = full.events["full"][:k]  # one token per event while generating
        if before[-1].finished:
            break
        sent = [t for e in before for t in e.token_ids]
        shown = "".join(e.text for e in before)
        rest = resumed(outputs, stop, max_tokens, sent)
        assert shown + rest.text("rest") == full.text("full"), f"cut after {k} tokens"
        assert sent + rest.token_ids("rest") == full.token_ids("full"), f"cut after {k} tokens"
        assert rest.final("rest").finish_reason == full.final("full").finish_reason


def test_the_cases_really_split_something() -> None:
    """Guards the cases above: a fresh text stream would show other text at some cut."""
    for outputs, stop in CASES.values():
        full = uninterrupted(outputs, stop, len(outputs))
        naive = []
        for k in range(1, len(full.events["full"])):
            before = full.events["full"][:k]
            sent = [t for e in before for t in e.token_ids]
            h = Harness(config())
            h.runner.script(PROMPT, outputs)
            h.add(PROMPT + sent, len(outputs) - k, request_id="rest", stop=stop, sampling=greedy())
            h.run()
            naive.append("".join(e.text for e in before) + h.text("rest"))
        assert any(text != full.text("full") for text in naive), outputs


def test_stop_split_across_the_resume_point_is_seen() -> None:
    outputs = [1, 2, 40, 41, 42, 43, 3]  # "abSTOPc"
    rest = resumed(outputs, ("STOP",), 20, sent=[1, 2, 40, 41])  # "ab" shown, "ST" held back
    assert rest.text("rest") == ""
    assert rest.token_ids("rest") == [42, 43]
    assert rest.final("rest").finish_reason is FinishReason.STOP


def test_a_character_split_across_the_resume_point_comes_out_whole() -> None:
    rest = resumed([1, 32, 33, 2], (), 4, sent=[1, 32])  # "a" shown, e2 held back
    assert rest.text("rest") == "€b"
    assert "\ufffd" not in rest.text("rest")


def test_max_tokens_is_the_whole_answer_and_timings_are_this_run() -> None:
    outputs = [1, 2, 3, 4, 5, 6, 7, 8]
    rest = resumed(outputs, (), 6, sent=[1, 2, 3, 4])
    final = rest.final("rest")
    assert rest.token_ids("rest") == [5, 6]  # 4 sent + 2 = max_tokens 6
    assert final.finish_reason is FinishReason.LENGTH
    assert final.timings is not None
    assert final.timings.predicted_n == 2  # sampled here
    assert final.timings.prompt_n == len(PROMPT) + 4  # the sent tokens were evaluated again


def test_eog_after_a_resume_flushes_the_held_text() -> None:
    rest = resumed([1, 40, 41, EOG], ("STOP",), 10, sent=[1, 40, 41])  # "a" shown, "ST" held
    assert rest.text("rest") == "ST"
    assert rest.final("rest").finish_reason is FinishReason.STOP


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "n_resumed", "match"),
    [
        ([5, 6], 10, 2, "below the prompt"),
        ([5, 6, 7], 2, 2, "no work"),
        ([5, 6, 7], 10, -1, "below the prompt"),
    ],
)
def test_impossible_resumes_are_rejected(
    prompt: list[int], max_tokens: int, n_resumed: int, match: str
) -> None:
    sched = Scheduler(config(), lambda t: b"x")
    with pytest.raises(RequestRejected, match=match):
        sched.add_request(GenerateRequest(prompt, max_tokens, n_resumed=n_resumed))
    assert sched.queue_depth == 0


def test_a_scheduler_without_pieces_refuses_to_resume() -> None:
    sched = Scheduler(config())
    with pytest.raises(RequestRejected, match="no token pieces"):
        sched.add_request(GenerateRequest([5, 6, 7], 10, n_resumed=1))
    sched.add_request(GenerateRequest([5, 6, 7], 10))  # a fresh request needs none
    assert sched.queue_depth == 1


def test_a_resumed_request_takes_the_next_free_slot_before_the_waiting_ones() -> None:
    """Interrupted first: a stream that lost its worker is queued ahead of every request that has
    not started (in arrival order among the resumed), behind none but the running ones."""
    h = Harness(SchedulerConfig(n_slots=1, n_ctx=512, n_ctx_seq=512, step_token_budget=64))
    running = h.add([100, 101, 102], max_tokens=3, request_id="running")
    h.step()  # it holds the only slot
    fresh = [h.add([110 + i, 120, 121], max_tokens=2, request_id=f"fresh{i}") for i in range(3)]
    sent = [1, 2]
    h.add([130, 131, 132, *sent], max_tokens=6, request_id="resumed", n_resumed=len(sent))
    h.add([140, 141, 142, 3], max_tokens=6, request_id="resumed-later", n_resumed=1)
    h.run()
    order = sorted(h.first_event_step, key=h.first_event_step.__getitem__)
    assert order == [running, "resumed", "resumed-later", *fresh]
    assert len(h.token_ids("resumed")) == 6 - len(sent), "its budget counts what it had sent"
