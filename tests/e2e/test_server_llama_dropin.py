"""llama-server's users, second pass (issue 45): `outpost serve` started with llama-server's flags
(`--temp`, `--seed`, `-n`, a `--slot-save-path` that does not exist yet) and called with raw HTTP
and llama-server's bodies, as its web UI and scripts call it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from server_harness import Server, start

N_PREDICT = 6
# A Qwen3-style template, inline as llama-server takes it: it shows an assistant turn's reasoning.
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
    "{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
FLAGS = (
    *("-np", "2", "-c", "1024", "--temp", "0", "--seed", "42", "-n", str(N_PREDICT)),
    *("--cors-origins", "localhost"),
)


@pytest.fixture(scope="module")
def slot_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("state") / "not" / "yet"


@pytest.fixture(scope="module")
def server(tiny_model: Path, slot_dir: Path) -> Iterator[Server]:
    with start(tiny_model, *FLAGS, "--chat-template", TEMPLATE, "--slot-save-path", str(slot_dir)) as srv:
        yield srv


@pytest.fixture(scope="module")
def http(server: Server) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


def _completion(http: httpx.Client, **body: Any) -> dict[str, Any]:
    r = http.post("/completion", json={"prompt": "The sky is", "ignore_eos": True, **body})
    assert r.status_code == 200, r.text
    return cast(dict[str, Any], r.json())


def test_temp_and_seed_flags_are_the_defaults_of_completion(http: httpx.Client) -> None:
    bare = _completion(http)
    assert bare["content"] == _completion(http, temperature=0)["content"]  # --temp 0: greedy
    assert bare["generation_settings"]["temperature"] == 0
    hot = _completion(http, temperature=1.5)  # no seed: --seed 42's
    assert hot["content"] == _completion(http, temperature=1.5)["content"]
    assert hot["generation_settings"]["seed"] == 42


def test_n_predict_flag_is_the_default_and_the_cap_on_every_route(http: httpx.Client) -> None:
    assert _completion(http)["tokens_predicted"] == N_PREDICT  # none asked: -n's
    assert _completion(http, n_predict=100)["tokens_predicted"] == N_PREDICT  # more asked: cut to -n
    assert _completion(http, n_predict=2)["tokens_predicted"] == 2  # fewer: as asked
    chat = http.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100, "ignore_eos": True},
    )
    assert chat.json()["usage"]["completion_tokens"] == N_PREDICT


def test_props_shows_the_flags_as_default_generation_settings(http: httpx.Client) -> None:
    params = http.get("/props").json()["default_generation_settings"]["params"]
    assert (params["temperature"], params["seed"], params["n_predict"]) == (0, 42, N_PREDICT)
    assert http.get("/slots").json()[0]["params"]["n_predict"] == N_PREDICT


def test_a_slot_save_path_that_did_not_exist_is_created(http: httpx.Client, slot_dir: Path) -> None:
    assert slot_dir.is_dir()  # serve started (llama-server creates the folder and its parents)
    r = http.post("/slots/0", params={"action": "save"}, json={"filename": "s.bin"})
    assert r.status_code == 200, r.text
    assert (slot_dir / "s.bin").is_file()


def test_id_slot_is_the_slot_used_and_the_one_a_save_writes(http: httpx.Client) -> None:
    for slot in (1, 0):
        http.post(f"/slots/{slot}", params={"action": "erase"})
        res = _completion(http, id_slot=slot, n_predict=3)
        assert res["id_slot"] == slot
        saved = http.post(f"/slots/{slot}", params={"action": "save"}, json={"filename": f"{slot}.bin"})
        assert saved.json()["n_saved"] >= res["tokens_evaluated"]  # its prompt (and what it decoded)
    assert _completion(http)["id_slot"] in (0, 1)  # none asked: the one it ran in, not -1
    bad = http.post("/completion", json={"prompt": "x", "id_slot": 5})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "id_slot"


def test_bare_completions_is_native_and_v1_stays_openai(http: httpx.Client) -> None:
    native = http.post("/completions", json={"prompt": "The sky is", "n_predict": 2, "ignore_eos": True})
    assert native.json()["tokens_predicted"] == 2 and "id_slot" in native.json()
    oai = http.post("/v1/completions", json={"prompt": "The sky is", "max_tokens": 2})
    assert oai.json()["object"] == "text_completion"


def test_bare_embeddings_is_native_and_takes_llama_servers_inputs(http: httpx.Client) -> None:
    text = "a red apple"
    ids = http.post("/tokenize", json={"content": text, "add_special": True}).json()["tokens"]
    parts = {"content": [{"type": "text", "text": text}]}
    res = http.post("/embeddings", json={"input": [text, ids, {"content": text}, parts]}).json()
    assert [r["index"] for r in res] == [0, 1, 2, 3]
    vectors = [r["embedding"][0] for r in res]  # llama-server's [[...]]: the pooled vector
    for v in vectors[1:]:
        assert v == pytest.approx(vectors[0], abs=1e-5)
    oai = http.post("/v1/embeddings", json={"input": [text, ids]}).json()
    assert oai["object"] == "list" and oai["data"][1]["embedding"] == pytest.approx(vectors[0], abs=1e-5)


def test_llama_servers_other_routes_and_timing_fields(http: httpx.Client) -> None:
    assert http.get("/v1/health").json()["status"] == "ok"
    t = _completion(http, n_predict=3)["timings"]
    assert t["predicted_per_token_ms"] == pytest.approx(t["predicted_ms"] / t["predicted_n"])
    assert t["prompt_per_token_ms"] == pytest.approx(t["prompt_ms"] / t["prompt_n"])
    chat = {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 1}
    used = http.post("/chat/completions", json=chat).json()["usage"]["prompt_tokens"]
    for path in ("/chat/completions/input_tokens", "/v1/chat/completions/input_tokens"):
        assert http.post(path, json=chat).json() == {"input_tokens": used, "object": "response.input_tokens"}
    reply = http.post("/responses", json={"input": "Name a colour.", "max_output_tokens": 1}).json()
    assert reply["object"] == "response"  # llama-server's alias without /v1
    for path in ("/responses/input_tokens", "/v1/responses/input_tokens"):
        counted = http.post(path, json={"input": "Name a colour."}).json()
        assert counted["input_tokens"] == reply["usage"]["input_tokens"] > 0
    scrape = http.get("/metrics").text
    for series in ("draft_tokens", "accepted_tokens", "drafts"):
        assert f"llamacpp:spec_decode_num_{series}_total " in scrape


def _chunks(http: httpx.Client, **body: Any) -> list[dict[str, Any]]:
    body = {"prompt": "The sky is blue and", "stream": True, **body}
    with http.stream("POST", "/completion", json=body) as r:
        return [json.loads(line.removeprefix("data: ")) for line in r.iter_lines() if line]


def test_return_progress_streams_prompt_progress_before_the_content(http: httpx.Client) -> None:
    chunks = _chunks(http, n_predict=2, return_progress=True)
    reads = [c["prompt_progress"] for c in chunks if "prompt_progress" in c]
    assert reads and chunks[0]["prompt_progress"] == reads[0]  # the prompt is read first
    assert [r["processed"] for r in reads] == sorted(r["processed"] for r in reads)
    assert reads[-1]["processed"] == reads[-1]["total"] == chunks[-1]["tokens_evaluated"]
    assert all(r["time_ms"] >= 0 and 0 <= r["cache"] < r["total"] for r in reads)
    assert not any("prompt_progress" in c for c in _chunks(http, n_predict=2))  # not asked: none


def test_chat_validation_as_llama_server(http: httpx.Client) -> None:
    user = {"role": "user", "content": "hi"}
    both = {"messages": [user, {"role": "assistant", "content": "Hel"}], "continue_final_message": True}
    r = http.post("/v1/chat/completions", json={**both, "add_generation_prompt": True})
    assert r.status_code == 400 and "add_generation_prompt" in r.json()["error"]["message"]
    two = [user, {"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]
    r = http.post("/v1/chat/completions", json={"messages": two})
    assert r.status_code == 400 and "2 or more assistant messages" in r.json()["error"]["message"]
    assert http.post("/v1/chat/completions", json={**both, "add_generation_prompt": False}).status_code == 200


def test_anthropic_thinking_in_history_is_rendered_and_counted(http: httpx.Client) -> None:
    thought = {"type": "thinking", "thinking": "The user greets me; greet back.", "signature": "s"}
    said = {"type": "text", "text": "Hello!"}

    def body(*blocks: dict[str, str]) -> dict[str, Any]:
        turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": list(blocks)}]
        return {"model": "m", "max_tokens": 1, "messages": [*turns, {"role": "user", "content": "bye"}]}

    bare = http.post("/v1/messages/count_tokens", json=body(said)).json()["input_tokens"]
    counted = http.post("/v1/messages/count_tokens", json=body(thought, said)).json()["input_tokens"]
    thought_tokens = http.post("/tokenize", json={"content": f"<think>{thought['thinking']}</think>"})
    assert counted == bare + len(thought_tokens.json()["tokens"])  # the template shows it in <think>
    used = http.post("/v1/messages", json=body(thought, said)).json()["usage"]
    assert used["input_tokens"] + used.get("cache_read_input_tokens", 0) == counted


def test_a_preflight_from_an_origin_not_allowed_gets_200_without_allow_headers(http: httpx.Client) -> None:
    for origin, allowed in (("http://localhost:5173", True), ("https://evil.example", False)):
        headers = {"Origin": origin, "Access-Control-Request-Method": "POST"}
        r = http.options("/v1/chat/completions", headers=headers)
        assert r.status_code == 200  # llama-server's answer either way; the headers decide
        assert r.headers.get("access-control-allow-origin") == (origin if allowed else None)


def test_verbose_adds_the_native_result_to_openai_replies(http: httpx.Client) -> None:
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "ignore_eos": True}
    reply = http.post("/v1/chat/completions", json={**chat, "verbose": True}).json()
    native = reply["__verbose"]
    assert native["tokens_predicted"] == reply["usage"]["completion_tokens"] and native["stop"] is True
    assert native["tokens_evaluated"] == reply["usage"]["prompt_tokens"]
    assert "__verbose" not in http.post("/v1/chat/completions", json=chat).json()
    text = http.post("/v1/completions", json={"prompt": "The sky", "max_tokens": 3, "verbose": True}).json()
    assert text["__verbose"]["content"] == text["choices"][0]["text"]
    assert text["__verbose"]["prompt"] == "The sky"
