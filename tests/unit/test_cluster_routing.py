"""Prefix hashes, the gateway's routing decision and the worker's credit plan, with no broker."""

from __future__ import annotations

import random

from outpost.cluster.gateway import routing
from outpost.cluster.gateway.routing import Router, WorkerView
from outpost.cluster.prefix import BLOCK, PrefixIndex, block_hashes, matched_blocks
from outpost.cluster.worker.intake import LANE, SHARED, CreditPlan

SHARED_Q = "outpost.req.m"


def tokens(n: int, seed: int) -> list[int]:
    rnd = random.Random(seed)
    return [rnd.randrange(1, 50_000) for _ in range(n)]


def worker(
    wid: str, busy: int = 0, slots: int = 4, held: list[list[int]] | None = None, **kw: object
) -> WorkerView:
    hashes = frozenset(h for seq in held or [] for h in block_hashes(seq))
    return WorkerView(wid, "m", f"outpost.lane.m.{wid}", slots, busy, prefixes=hashes, **kw)  # type: ignore[arg-type]


# -- prefix hashes ------------------------------------------------------------------------------


def test_block_hashes_chain_over_the_whole_prefix() -> None:
    a = tokens(3 * BLOCK + 10, 1)
    b = a[: 2 * BLOCK] + tokens(BLOCK, 2)
    ha, hb = block_hashes(a), block_hashes(b)
    assert len(ha) == 3 and len(hb) == 3  # the partial last block is not hashed
    assert ha[:2] == hb[:2] and ha[2] != hb[2]
    shifted = [7, *a]  # same blocks one token later: nothing matches
    assert not set(block_hashes(shifted)) & set(ha)
    assert matched_blocks(hb, frozenset(ha)) == 2
    assert matched_blocks(block_hashes(a[:BLOCK] + tokens(2 * BLOCK, 9)), frozenset(ha)) == 1


def test_prefix_index_caps_but_keeps_every_sequences_leading_blocks() -> None:
    seqs = [tokens(40 * BLOCK, s) for s in range(4)]
    index = PrefixIndex(limit=20)
    out = index.hashes(seqs)
    assert len(out) == 20
    assert all(block_hashes(s)[0] in out and block_hashes(s)[4] in out for s in seqs)
    assert index.hashes(seqs) == out  # memoized: same answer


# -- routing ------------------------------------------------------------------------------------


def test_a_held_prefix_goes_to_the_lane_of_its_holder() -> None:
    system = tokens(8 * BLOCK, 3)
    holder = worker("b", held=[system + tokens(30, 4)], prefill_tps=400.0)
    router = Router(SHARED_Q)
    route, hashes = router.route(system + tokens(40, 5), [worker("a"), holder], now=0.0)
    assert (route.queue, route.worker_id, route.reason) == (holder.lane, "b", "prefix")
    assert route.matched_tokens == 8 * BLOCK
    assert route.window_s is not None and abs(route.window_s - 8 * BLOCK / 400.0) < 1e-9  # 1.28 s saved
    assert len(hashes) == 8


def test_the_spill_window_is_the_prefill_time_saved_within_bounds_and_the_deadline() -> None:
    system = tokens(4 * BLOCK, 3)
    fast = worker("b", held=[system], prefill_tps=1000.0)
    route, _ = Router(SHARED_Q).route([*system, 1, 2, 3], [fast], now=0.0)
    assert route.window_s is not None and abs(route.window_s - 4 * BLOCK / 1000.0) < 1e-9
    slow = worker("b", held=[system], prefill_tps=10.0)  # 25 s of prefill saved: wait at most 2 s
    assert Router(SHARED_Q).route([*system, 1], [slow], now=0.0)[0].window_s == routing.MAX_WINDOW_S
    route, _ = Router(SHARED_Q).route([*system, 1, 2, 3], [fast], now=0.0, time_left=0.4)
    assert route.queue == SHARED_Q  # a quarter of 0.4 s is shorter than any useful wait


def test_equal_matches_go_to_the_worker_with_more_free_slots() -> None:
    system = tokens(4 * BLOCK, 3)
    busy = worker("a", busy=4, held=[system])
    free = worker("b", busy=1, held=[system])
    route, _ = Router(SHARED_Q).route([*system, 5], [busy, free], now=0.0)
    assert route.worker_id == "b"


def test_a_new_long_prefix_is_placed_alike_by_every_gateway() -> None:
    workers = [worker(w) for w in "abcd"]
    prompt = tokens(6 * BLOCK, 11)
    first, _ = Router(SHARED_Q).route(prompt, workers, now=0.0)
    second, _ = Router(SHARED_Q).route(prompt[: 4 * BLOCK] + tokens(90, 12), list(reversed(workers)), now=0.0)
    assert first.reason == "placed" and first.worker_id == second.worker_id
    spread = {Router(SHARED_Q).route(tokens(6 * BLOCK, s), workers, 0.0)[0].worker_id for s in range(40)}
    assert spread == set("abcd")  # different prefixes spread over the workers


def test_a_new_prefix_goes_shared_when_every_worker_is_full_and_short_prompts_always() -> None:
    prompt = tokens(6 * BLOCK, 11)
    home = Router(SHARED_Q).route(prompt, [worker(w) for w in "ab"], 0.0)[0].worker_id
    one_full = [worker(w, busy=4 if w == home else 0) for w in "ab"]
    assert Router(SHARED_Q).route(prompt, one_full, 0.0)[0].worker_id not in (None, home)
    all_full = [worker(w, busy=4) for w in "ab"]
    assert Router(SHARED_Q).route(prompt, all_full, 0.0)[0].queue == SHARED_Q
    assert Router(SHARED_Q).route(tokens(100, 1), [worker("a")], 0.0)[0].queue == SHARED_Q
    assert Router(SHARED_Q, enabled=False).route(prompt, [worker("a")], 0.0)[0].queue == SHARED_Q
    assert Router(SHARED_Q).route(prompt, [], 0.0)[0].queue == SHARED_Q
    draining = WorkerView("a", "m", "outpost.lane.m.a", 4, 0, draining=True)
    assert Router(SHARED_Q).route(prompt, [draining], 0.0)[0].queue == SHARED_Q


def test_new_prefixes_skip_a_worker_busier_than_its_fair_share() -> None:
    workers = [worker(w) for w in "ab"]
    prompts = [tokens(6 * BLOCK, s) for s in range(40)]
    first_choice = {i: Router(SHARED_Q).route(p, workers, 0.0)[0].worker_id for i, p in enumerate(prompts)}
    loaded = [worker("a", busy=3), worker("b", busy=0)]  # fair share of 3 + 1 is 2 (2.5 with slack)
    moved = {i: Router(SHARED_Q).route(p, loaded, 0.0)[0].worker_id for i, p in enumerate(prompts)}
    assert set(moved.values()) == {"b"}
    assert any(v == "a" for v in first_choice.values())  # those went to b only for the load


def test_what_a_gateway_sent_counts_until_the_heartbeat_does() -> None:
    router = Router(SHARED_Q)
    workers = [worker("a", slots=1), worker("b", slots=1)]
    system = tokens(4 * BLOCK, 3)
    route, hashes = router.route([*system, 1], workers, now=0.0)
    assert route.reason == "placed"
    router.published(route, hashes, now=0.0)
    again, _ = router.route([*system, 2], workers, now=1.0)  # no heartbeat yet: remembered
    assert (again.reason, again.worker_id) == ("prefix", route.worker_id)
    later, _ = router.route([*system, 2], workers, now=1.0 + routing.MEMORY_S)
    assert later.worker_id not in (None, route.worker_id)  # forgotten; its one slot counted as taken
    router.heartbeat(route.worker_id or "")
    assert router.route([*system, 2], workers, now=99.0)[0].reason == "placed"


def test_a_new_prefix_goes_where_the_cache_has_room_for_it() -> None:
    """Four system prompts, two workers whose caches hold two each: placement fills both caches
    instead of handing one worker a third prompt (it would evict one of its own)."""

    def home(system: list[int]) -> str | None:  # rendezvous alone (cache size unknown)
        return Router(SHARED_Q).route(system, [worker(w, slots=8) for w in "ab"], 0.0)[0].worker_id

    candidates = [tokens(16 * BLOCK, 100 + k) for k in range(12)]
    systems = [s for s in candidates if home(s) == "a"][:3] + [s for s in candidates if home(s) == "b"][:1]
    assert len(systems) == 4  # rendezvous alone would put three of the four on "a"

    def view(wid: str, held: list[list[int]]) -> WorkerView:
        return worker(wid, slots=8, held=held, cache_blocks=40)

    placed: dict[str, list[list[int]]] = {"a": [], "b": []}
    for system in systems:  # one at a time, each placement advertised before the next
        route, _ = Router(SHARED_Q).route([*system, 1, 2], [view(w, placed[w]) for w in "ab"], 0.0)
        assert route.reason == "placed" and route.worker_id is not None
        placed[route.worker_id].append(system)
    assert sorted(len(v) for v in placed.values()) == [2, 2]

    # Before any heartbeat: what this gateway sent counts against the room.
    router = Router(SHARED_Q)
    empty = [view(w, []) for w in "ab"]
    homes = []
    for system in systems:
        route, hashes = router.route([*system, 3], empty, 0.0)
        router.published(route, hashes, 0.0)
        homes.append(route.worker_id)
    assert sorted(homes.count(w) for w in "ab") == [2, 2]

    # With no room anywhere: the worker with the most; unknown size (0): rendezvous as before.
    full = [view("a", systems[:2]), view("b", systems[2:3])]
    assert Router(SHARED_Q).route([*tokens(16 * BLOCK, 7), 1], full, 0.0)[0].worker_id == "b"
    unknown = [worker(w, slots=8, held=systems[:3] if w == "a" else []) for w in "ab"]
    first = {Router(SHARED_Q).route(tokens(16 * BLOCK, s), unknown, 0.0)[0].worker_id for s in range(20)}
    assert first == {"a", "b"}


# -- the worker's credits -----------------------------------------------------------------------


def _consuming(plan: CreditPlan) -> None:
    for c in plan.credits:
        c.tag = f"t{c.index}"


def test_credits_split_between_lane_and_shared_and_move_to_waiting_requests() -> None:
    plan = CreditPlan(8, lane=True)
    _consuming(plan)
    assert (plan.count(LANE), plan.count(SHARED)) == (4, 4)
    moves = plan.moves({LANE: 7, SHARED: 0})
    assert len(moves) == 3 and all(to == LANE for _, to in moves)  # 4 idle on the lane + 3 moved
    for credit, to in moves:
        credit.source = to
    assert plan.count(SHARED) == 1
    assert plan.moves({}, hint=LANE) == []  # a guess leaves the shared queue its last credit
    last = plan.moves({LANE: 9, SHARED: 0})  # requests known to wait take it
    assert [(c.source, to) for c, to in last] == [(SHARED, LANE)]
    last[0][0].source = LANE
    assert plan.count(LANE) == 8 and len(plan.credits) == 8  # never more than the slots
    assert plan.moves({LANE: 9, SHARED: 0}) == []


def test_busy_credits_do_not_move_and_a_hint_moves_one() -> None:
    plan = CreditPlan(4, lane=True)
    _consuming(plan)
    for c in plan.credits[:2]:  # both lane credits hold a request
        c.held = 1
    assert plan.moves({}) == []
    moved = plan.moves({}, hint=LANE)  # the lane's last idle credit just took a delivery
    assert [(c.source, to) for c, to in moved] == [(SHARED, LANE)]
    assert plan.moves({SHARED: 2, LANE: 1}) == []  # both queues wait: idle credits stay put


def test_one_slot_or_no_lane_is_plain_pull() -> None:
    one = CreditPlan(1, lane=True)
    _consuming(one)
    assert [c.source for c in one.credits] == [SHARED]
    assert [(c.source, to) for c, to in one.moves({LANE: 1})] == [(SHARED, LANE)]  # its only credit
    plan = CreditPlan(4, lane=False)
    _consuming(plan)
    assert plan.count(SHARED) == 4 and plan.moves({LANE: 5}) == []
