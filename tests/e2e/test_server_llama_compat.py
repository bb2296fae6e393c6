"""`outpost serve` started as llama-server users start it and called as its clients call it (issue 26):
its flags, a built-in chat template by name, prefill, any model name, its context error, its CORS
default, its `llamacpp:*` metrics and two bound addresses; raw HTTP as its web UI and scripts, the
`openai` client for the OpenAI routes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import openai
import pytest
from server_harness import Server, start

USER = {"role": "user", "content": "Name a colour."}
LLAMA_SERVER_FLAGS = (
    # llama-server's flags that Outpost refused before (exit 2/3): accepted, as fields of its settings
    *("-np", "2", "-c", "2048", "--default-max-tokens", "8"),
    *("--chat-template", "chatml", "--reasoning", "off", "--temp", "0", "--seed", "7"),
    *("--metrics", "--slots", "--embeddings", "--jinja", "--context-shift", "--pooling", "cls"),
    *("--reranking", "--alias", "tiny,chat", "--tags", "small,test", "--offline"),
    *("--host", "127.0.0.1,::1"),
)


@pytest.fixture(scope="module")
def server(
    tiny_model: Path, reranker_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    slots = tmp_path_factory.mktemp("slots")
    rerank = ("--rerank-model", str(reranker_model))  # the reranker beside the chat model
    with start(tiny_model, *LLAMA_SERVER_FLAGS, "--slot-save-path", str(slots), *rerank) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


def test_flags_it_cannot_honour_say_so_in_one_line(server: Server) -> None:
    log = server.stderr()
    assert "--context-shift ignored" in log and "--pooling cls ignored" in log
    assert server.health()["status"] == "ok"


def test_every_host_given_answers(server: Server) -> None:
    for host in ("127.0.0.1", "[::1]"):
        assert httpx.get(f"http://{host}:{server.port}/health", timeout=10).status_code == 200


def test_any_model_name_is_the_one_served(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="gpt-3.5-turbo", messages=[USER], max_tokens=3)
    assert r.model == "tiny" and r.choices[0].message.content is not None
    e = client.embeddings.create(model="text-embedding-3-small", input="red")
    assert e.model == "tiny" and len(e.data[0].embedding) > 0
    assert [m.id for m in client.models.list().data] == ["tiny"]


def test_a_final_assistant_message_is_continued(server: Server, client: openai.OpenAI) -> None:
    messages = [USER, {"role": "assistant", "content": "The colour is"}]
    with server.client() as http:
        prompt = http.post("/apply-template", json={"messages": messages}).json()["prompt"]
        closed = http.post(
            "/apply-template", json={"messages": messages, "continue_final_message": False}
        ).json()["prompt"]
        bare = http.post("/apply-template", json={"messages": [USER], "add_generation_prompt": False})
        n_tokens = len(http.post("/tokenize", json={"content": prompt, "add_special": True}).json()["tokens"])
    assert prompt.endswith("<|im_start|>assistant\nThe colour is")  # chatml, by its built-in name
    assert closed.endswith("The colour is<|im_end|>\n<|im_start|>assistant\n")
    assert bare.json()["prompt"].endswith("Name a colour.<|im_end|>\n")
    r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=3)  # type: ignore[arg-type]
    assert r.usage is not None and r.usage.prompt_tokens == n_tokens  # the chat route continues it too


def test_temp_and_seed_are_the_defaults_of_requests_without_them(client: openai.OpenAI) -> None:
    def text(**kwargs: object) -> str | None:
        r = client.chat.completions.create(
            model="tiny", messages=[USER], max_tokens=8, extra_body={"ignore_eos": True}, **kwargs
        )  # type: ignore[call-overload]
        return r.choices[0].message.content

    assert text() == text(temperature=0)  # --temp 0: greedy unless a request asks otherwise
    assert text(temperature=1.5) == text(temperature=1.5)  # --seed 7 for requests without a seed


def test_context_overflow_is_llama_servers_error_with_openais_code(
    server: Server, client: openai.OpenAI
) -> None:
    r = httpx.post(
        f"{server.url}/v1/chat/completions", json={"messages": [USER], "max_tokens": 100000}, timeout=30
    )
    error = r.json()["error"]
    assert r.status_code == 400 and error["type"] == "exceed_context_size_error"
    # A request's context is c/np = 1024 with a KV stream per slot, or all 2048 cells with one pool:
    # which one -kvu auto takes depends on the CPU (AMX's one-token layout always uses one pool), so
    # the error must name the one this server runs, as /props does.
    props = httpx.get(f"{server.url}/props", timeout=30).json()
    n_ctx_seq = props["default_generation_settings"]["n_ctx"]
    assert n_ctx_seq in (1024, 2048)
    assert error["code"] == "context_length_exceeded" and error["n_ctx"] == n_ctx_seq
    assert 0 < error["n_prompt_tokens"] < 100
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="tiny", messages=[USER], max_tokens=100000)
    assert exc.value.code == "context_length_exceeded"


def test_cors_preflight_is_answered_for_any_origin_by_default(server: Server) -> None:
    origin = "http://app.example.com:3000"
    headers = {"Origin": origin, "Access-Control-Request-Method": "POST"}
    pre = httpx.options(f"{server.url}/v1/chat/completions", headers=headers, timeout=10)
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == origin


def test_metrics_carry_llama_servers_series(server: Server, client: openai.OpenAI) -> None:
    client.chat.completions.create(
        model="tiny", messages=[USER], max_tokens=4, extra_body={"ignore_eos": True}
    )
    server.wait_idle(60)
    assert server.metric("llamacpp:prompt_tokens_total") > 0
    assert server.metric("llamacpp:tokens_predicted_total") >= 4
    assert server.metric("llamacpp:n_decode_total") >= 4
    assert server.metric("llamacpp:prompt_seconds_total") > 0
    assert server.metric("llamacpp:n_busy_slots_per_decode") >= 1
    assert server.metric("outpost_generation_tokens_total") >= 4


PROMPT = "The slot keeps this long shared prefix of a prompt in its KV cache between two requests"


def _complete(http: httpx.Client) -> dict[str, Any]:
    r = http.post(
        "/completion", json={"prompt": PROMPT, "n_predict": 4, "temperature": 0, "ignore_eos": True}
    )
    assert r.status_code == 200, r.text
    return cast(dict[str, Any], r.json())


def _slot(http: httpx.Client, id_slot: int, action: str, filename: str | None = None) -> httpx.Response:
    body = {"filename": filename} if filename is not None else None
    return http.post(f"/slots/{id_slot}", params={"action": action}, json=body)


def test_a_saved_slot_restored_is_a_prefix_cache_the_next_request_reuses(server: Server) -> None:
    with server.client() as http:
        server.wait_idle(60)
        for i in (0, 1):
            assert _slot(http, i, "erase").json()["id_slot"] == i
        first = _complete(http)
        n_prompt = first["tokens_evaluated"]
        assert first["timings"]["cache_n"] == 0 and first["timings"]["prompt_n"] == n_prompt
        saves = [_slot(http, i, "save", f"s{i}.bin") for i in (0, 1)]
        assert all(s.status_code == 200 for s in saves), [s.text for s in saves]
        held = [s.json() for s in saves if s.json()["n_saved"] > 0]
        assert len(held) == 1  # the one slot the request took: its prompt and the tokens decoded after
        saved = held[0]
        assert saved["n_saved"] >= n_prompt and saved["n_written"] > 0 and saved["timings"]["save_ms"] >= 0
        erased = _slot(http, saved["id_slot"], "erase").json()
        assert erased == {"id_slot": saved["id_slot"], "n_erased": saved["n_saved"]}
        assert _complete(http)["timings"]["cache_n"] == 0  # nothing cached any more
        for i in (0, 1):
            _slot(http, i, "erase")
        restored = _slot(http, 1, "restore", saved["filename"]).json()  # into slot 1, whichever saved
        assert restored["n_restored"] == saved["n_saved"] and restored["n_read"] == saved["n_written"]
        again = _complete(http)
    # Every prompt token but the last (whose logits are needed) came from the restored KV.
    assert again["timings"]["cache_n"] == n_prompt - 1 and again["timings"]["prompt_n"] == 1
    assert again["content"] == first["content"]  # the restored cells are the ones computed before


def test_slot_actions_refuse_bad_input_with_a_4xx(server: Server) -> None:
    with server.client() as http:
        cases = [
            (_slot(http, 0, "save", "../escape.bin"), 400, "filename"),
            (_slot(http, 0, "save", "sub/dir.bin"), 400, "filename"),
            (_slot(http, 0, "save"), 400, "filename"),
            (_slot(http, 99, "erase"), 400, "id_slot"),
            (_slot(http, 0, "restore", "missing.bin"), 400, "filename"),
            (_slot(http, 0, "launch"), 400, "action"),
            (http.post("/slots/zero", params={"action": "erase"}), 400, "id_slot"),
        ]
    for response, status, param in cases:
        assert response.status_code == status, response.text
        assert response.json()["error"]["param"] == param


DOCS = ["a cat is a small animal", "paris is in france", "the stock market fell", "cats purr"]


def test_rerank_scores_and_sorts_documents_as_llama_server(server: Server) -> None:
    body = {"query": "what is a cat", "documents": DOCS}
    with server.client() as http:
        replies = [http.post(path, json=body) for path in ("/v1/rerank", "/rerank", "/reranking")]
        top = http.post("/v1/rerank", json={**body, "top_n": 2, "return_documents": True}).json()
        cohere = http.post("/v1/rerank", json={**body, "documents": [{"text": d} for d in DOCS]}).json()
        tei = http.post("/rerank", json={"query": "what is a cat", "texts": DOCS, "return_text": True}).json()
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
    first = replies[0].json()
    assert first["object"] == "list" and first["model"] == "tiny" and first["usage"]["prompt_tokens"] > 0
    results = first["results"]
    scores = [r["relevance_score"] for r in results]
    assert sorted(r["index"] for r in results) == [0, 1, 2, 3] and scores == sorted(scores, reverse=True)
    assert all(r.json()["results"] == results for r in replies)  # deterministic for a fixed model
    assert top["results"] == [{**r, "document": {"text": DOCS[r["index"]]}} for r in results[:2]]
    assert cohere["results"] == results
    assert [(t["index"], t["score"], t["text"]) for t in tei] == [
        (r["index"], r["relevance_score"], DOCS[r["index"]]) for r in results
    ]


def test_rerank_refuses_bad_input_with_a_400(server: Server) -> None:
    bad = [
        {"documents": DOCS},
        {"query": "q", "documents": []},
        {"query": "q"},
        {"query": "q", "documents": ["a", 3]},
        {"query": 5, "documents": ["a"]},
        {"query": "q", "documents": ["a"], "top_n": -1},
    ]
    with server.client() as http:
        replies = [http.post("/v1/rerank", json=body) for body in bad]
    assert [r.status_code for r in replies] == [400] * len(bad), [r.text for r in replies]


def test_a_reranker_served_with_m_and_reranking_as_llama_server_users_start_it(reranker_model: Path) -> None:
    with start(reranker_model, "-np", "1", "-c", "512", "--reranking") as srv, srv.client() as http:
        r = http.post("/v1/rerank", json={"query": "what is a cat", "documents": DOCS})
    assert r.status_code == 200, r.text
    assert sorted(x["index"] for x in r.json()["results"]) == [0, 1, 2, 3]
