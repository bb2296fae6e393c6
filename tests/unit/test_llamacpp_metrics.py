"""llama-server's `llamacpp:*` series summed from finished requests' timings, as a scrape reads them."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from outpost.api.llama.metrics import LlamaCppCollector, LlamaCppTotals
from outpost.backend import BackendStats
from outpost.messages import Timings


def _scrape(totals: LlamaCppTotals) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(LlamaCppCollector(totals, BackendStats))
    lines = generate_latest(registry).decode().splitlines()
    return {k: float(v) for k, v in (line.split(" ") for line in lines if not line.startswith("#"))}


def test_speculative_counters_add_up_each_requests_drafts() -> None:
    totals = LlamaCppTotals()
    assert _scrape(totals)["llamacpp:spec_decode_num_drafts_total"] == 0  # off: present, 0, as there
    totals.add(Timings(predicted_n=9, draft_n=8, draft_n_accepted=5, draft_steps=2))
    totals.add(Timings(predicted_n=4, draft_n=3, draft_n_accepted=1, draft_steps=1))
    series = _scrape(totals)
    assert series["llamacpp:spec_decode_num_draft_tokens_total"] == 11
    assert series["llamacpp:spec_decode_num_accepted_tokens_total"] == 6
    assert series["llamacpp:spec_decode_num_drafts_total"] == 3


def test_timings_carry_llama_servers_per_token_times() -> None:
    t = Timings(prompt_n=4, prompt_ms=10.0, predicted_n=5, predicted_ms=20.0).as_dict()
    assert t["prompt_per_token_ms"] == 2.5 and t["predicted_per_token_ms"] == 4.0
    assert Timings().as_dict()["predicted_per_token_ms"] == 0.0  # nothing timed: 0, not a division error
