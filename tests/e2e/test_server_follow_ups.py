"""`--follow-up-wait` as a user meets it: a closed loop of clients (each sends its next request
when its last one ends, through the `openai` client) beside a long stream on a real server, with
the wait on (the default) and off. Every request is answered in full, the stream too, and the
ready line says which; what the wait buys is a timing, measured in benchmarks/serve
(docs/performance.md), never asserted here."""

from __future__ import annotations

import threading
from pathlib import Path

import openai
from server_harness import Server, start


def _closed_loop(server: Server, clients: int, turns: int) -> list[int]:
    """Each client's completion token counts, `turns` requests one after another per client, while
    a streamed 200-token request decodes beside them."""
    api = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", timeout=120.0)
    counts: list[int] = []
    lock = threading.Lock()

    def client(i: int) -> None:
        for turn in range(turns):
            reply = api.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": f"client {i} turn {turn}"}],
                max_tokens=6,
                extra_body={"ignore_eos": True},
            )
            with lock:
                counts.append(reply.usage.completion_tokens if reply.usage else -1)

    stream = api.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "a long story"}],
        max_tokens=200,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    streamed = sum(1 for chunk in stream if chunk.choices and chunk.choices[0].delta.content)
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive(), "a client of the loop never got its answer"
    assert streamed > 0
    return counts


def test_a_closed_loop_is_answered_in_full_with_the_wait_on_and_off(tiny_model: Path) -> None:
    for args, said in (((), "follow-up wait up to 20 ms"), (("--follow-up-wait", "0"), "follow-up wait off")):
        with start(tiny_model, "-np", "3", "-c", "2048", *args) as server:
            ready = server.ready_line()
            assert said in ready, ready
            counts = _closed_loop(server, clients=2, turns=8)
            assert counts == [6] * 16, counts
            assert server.health()["status"] == "ok"
