"""llama-server's native `POST /completion`, called as its web UI and scripts call it (raw HTTP).

The backend is the in-memory FakeBackend: its codec tokenizes by characters (id = code point) and
it answers "hello" one character per event, so every field of the reply can be checked exactly.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import httpx
from fake_backend import FakeBackend, FakeCodec

from outpost.api.app import create_app
from outpost.api.llama import render as native_render
from outpost.api.llama import slots
from outpost.api.llama.render import NativeSpec
from outpost.api.pipeline.generation import Outcome
from outpost.messages import FimTokens, FinishReason, SamplingParams, Timings, TokenLogprob
from outpost.settings import HttpSettings


def call(
    backend: FakeBackend, method: str, path: str, body: Any, http: HttpSettings | None = None
) -> httpx.Response:
    async def main() -> httpx.Response:
        app = create_app({"m": backend}, http or HttpSettings(), "m")
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.request(method, path, json=body)

    return asyncio.run(main())


def test_text_prompt_gives_llama_server_result_fields() -> None:
    backend = FakeBackend("hello")
    r = call(backend, "POST", "/completion", {"prompt": "Hi", "return_tokens": True, "cache_prompt": True})
    assert r.status_code == 200, r.text
    res = r.json()
    assert res["content"] == "hello"
    assert res["tokens"] == [ord(c) for c in "hello"]
    assert res["stop"] is True and res["stop_type"] == "eos" and res["stopping_word"] == ""
    assert res["tokens_predicted"] == 5 and res["tokens_evaluated"] == 2
    assert res["truncated"] is False and res["model"] == "m" and res["prompt"] == "Hi"
    assert res["timings"]["predicted_n"] == 5
    settings = res["generation_settings"]
    assert settings["n_predict"] == -1 and settings["temperature"] == 0.8 and settings["top_k"] == 40
    assert backend.prompts == [[ord("H"), ord("i")]]


def test_n_predict_limits_and_tokens_only_when_asked() -> None:
    backend = FakeBackend("hello")
    res = call(backend, "POST", "/completion", {"prompt": "Hi", "n_predict": 3}).json()
    assert res["content"] == "hel" and res["stop_type"] == "limit" and res["tokens"] == []
    assert res["generation_settings"]["n_predict"] == 3
    assert backend.submitted[0].max_tokens == 3


def test_token_ids_and_mixed_prompts_are_one_prompt_each() -> None:
    backend = FakeBackend("ok")
    assert call(backend, "POST", "/completion", {"prompt": [72, 105]}).status_code == 200
    assert call(backend, "POST", "/completion", {"prompt": ["A", 66, "C"]}).status_code == 200
    assert backend.prompts == [[72, 105], [65, 66, 67]]


class ByteCodec(FakeCodec):
    """Token ids are UTF-8 bytes: one character may take several tokens, as in byte-level BPE."""

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return list(text.encode())

    def detokenize(self, tokens: Sequence[int]) -> str:
        return bytes(tokens).decode(errors="replace")


def test_the_replys_prompt_detokenizes_each_run_of_ids_whole() -> None:
    """The "é" of the prompt is two byte tokens: read one by one they would be two replacement characters."""
    backend = FakeBackend("ok")
    backend.codec = ByteCodec()
    res = call(backend, "POST", "/completion", {"prompt": ["caf", *"é".encode(), " au lait"]})
    assert res.status_code == 200, res.text
    assert res.json()["prompt"] == "café au lait"


def test_several_prompts_give_a_list_of_results_with_index() -> None:
    backend = FakeBackend("ok")
    res = call(backend, "POST", "/completion", {"prompt": ["a", [98, 99]]}).json()
    assert [r["index"] for r in res] == [0, 1]
    assert [r["content"] for r in res] == ["ok", "ok"]
    assert sorted(backend.prompts) == [[97], [98, 99]]


def test_stream_sends_content_chunks_then_a_stop_chunk_and_no_done() -> None:
    backend = FakeBackend("hello")

    async def main() -> list[str]:
        app = create_app({"m": backend}, HttpSettings(), "m")
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            body = {"prompt": "Hi", "stream": True, "n_predict": 4, "return_tokens": True}
            async with client.stream("POST", "/completion", json=body) as r:
                assert r.status_code == 200
                return [line async for line in r.aiter_lines() if line]

    lines = asyncio.run(main())
    assert all(line.startswith("data: ") for line in lines) and "data: [DONE]" not in lines
    chunks = [json.loads(line[6:]) for line in lines]
    assert "".join(c["content"] for c in chunks) == "hell"
    assert [c["stop"] for c in chunks] == [False] * 4 + [True]
    assert chunks[0]["tokens"] == [ord("h")] and chunks[1]["tokens_predicted"] == 2
    last = chunks[-1]
    assert last["stop_type"] == "limit" and last["timings"]["predicted_n"] == 4
    assert last["generation_settings"]["stream"] is True and last["tokens"] == []


def test_grammar_is_checked_and_passed_on() -> None:
    backend = FakeBackend("ok")
    bad = call(backend, "POST", "/completion", {"prompt": "x", "grammar": "root ::= answer\n"})
    assert bad.status_code == 400
    assert "'answer' is used but never defined" in bad.json()["error"]["message"]
    good = 'root ::= "yes" | "no"\n'
    assert call(backend, "POST", "/completion", {"prompt": "x", "grammar": good}).status_code == 200
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    assert call(backend, "POST", "/completion", {"prompt": "x", "json_schema": schema}).status_code == 200
    both = call(backend, "POST", "/completion", {"prompt": "x", "grammar": good, "json_schema": schema})
    assert both.status_code == 400
    first, second = (r.sampling.grammar for r in backend.submitted)
    assert first == good and second is not None and '"\\"a\\""' in second


def test_samplers_left_out_are_switched_off_and_sampling_fields_pass() -> None:
    backend = FakeBackend("ok")
    body = {"prompt": "x", "samplers": ["top_k", "temperature"], "top_k": 5, "seed": 7, "ignore_eos": True}
    res = call(backend, "POST", "/completion", {**body, "temperature": 0.2, "logit_bias": [[65, False]]})
    assert res.status_code == 200
    s = backend.submitted[0].sampling
    assert (s.top_k, s.top_p, s.min_p, s.temperature, s.seed, s.ignore_eos) == (5, 1.0, 0.0, 0.2, 7, True)
    assert s.logit_bias == ((65, float("-inf")),)
    assert res.json()["generation_settings"]["samplers"] == ["top_k", "temperature"]
    unknown = call(backend, "POST", "/completion", {"prompt": "x", "samplers": ["warp"]})
    assert unknown.status_code == 400


def test_bad_prompts_are_400() -> None:
    backend = FakeBackend("ok")
    too_big = call(backend, "POST", "/completion", {"prompt": [FakeCodec.n_vocab]})
    assert too_big.status_code == 400 and "out of range" in too_big.json()["error"]["message"]
    assert call(backend, "POST", "/completion", {"prompt": ""}).status_code == 400
    long = call(backend, "POST", "/completion", {"prompt": "x" * 300, "n_predict": 10})
    assert long.status_code == 400
    assert backend.submitted == []


def test_bare_completions_is_llama_servers_native_route() -> None:
    res = call(FakeBackend("ok"), "POST", "/completions", {"prompt": "x", "n_predict": 2}).json()
    assert res["content"] == "ok" and res["stop"] is True and "choices" not in res
    oai = call(FakeBackend("ok"), "POST", "/v1/completions", {"prompt": "x", "max_tokens": 2}).json()
    assert oai["object"] == "text_completion" and oai["choices"][0]["text"] == "ok"


def _spec(stop: tuple[str, ...] = (), post: bool = False) -> NativeSpec:
    return NativeSpec("m", FakeCodec(), SamplingParams(), -1, stop, (), False, False, post)


def test_stop_type_names_the_stop_word() -> None:
    out = Outcome("r", 1, token_ids=[ord(c) for c in "yes END"], text="yes ", finish=FinishReason.STOP)
    assert native_render.stop_type(out, FakeCodec(), ("END",)) == ("word", "END")
    out.text = "yes END"
    assert native_render.stop_type(out, FakeCodec(), ()) == ("eos", "")


def test_tokens_predicted_is_the_count_the_timings_give() -> None:
    """The end-of-generation token is sampled (timings count it) but never shown (not in token_ids):
    `tokens_predicted` and `timings.predicted_n` are one count, as llama-server's n_decoded."""
    out = Outcome("r", 4, token_ids=[ord("o"), ord("k")], text="ok", finish=FinishReason.STOP)
    out.timings = Timings(prompt_n=4, predicted_n=3)
    res = native_render.final(_spec(), 0, out, "p")
    assert res["tokens_predicted"] == res["timings"]["predicted_n"] == 3


def test_probabilities_as_logprobs_or_post_sampling_probs() -> None:
    lp = [TokenLogprob(ord("a"), -0.5, ((ord("a"), -0.5), (ord("b"), float("-inf"))))]
    out = Outcome("r", 1, token_ids=[ord("a")], text="a", finish=FinishReason.LENGTH, logprobs=lp)
    (entry,) = native_render.final(_spec(), 0, out, "p")["completion_probabilities"]
    assert entry["id"] == 97 and entry["token"] == "a" and entry["bytes"] == [97]
    assert entry["logprob"] == -0.5 and entry["top_logprobs"][1]["logprob"] == -9999.0
    (entry,) = native_render.final(_spec(post=True), 0, out, "p")["completion_probabilities"]
    assert abs(entry["prob"] - 0.6065) < 1e-3 and entry["top_probs"][1]["prob"] == 0.0


def test_chat_and_completions_take_top_level_grammar_and_json_schema() -> None:
    backend = FakeBackend("ok")
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    bad = call(backend, "POST", "/v1/chat/completions", {**chat, "grammar": 'root ::= "a'})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "grammar"
    assert "unterminated string" in bad.json()["error"]["message"]
    ok = call(backend, "POST", "/v1/chat/completions", {**chat, "grammar": 'root ::= "ok"\n'})
    assert ok.status_code == 200
    schema = {"type": "string", "enum": ["ok"]}
    text = {"prompt": "x", "max_tokens": 2, "json_schema": schema, "return_progress": True, "verbose": True}
    assert call(backend, "POST", "/v1/completions", text).status_code == 200
    assert backend.submitted[0].sampling.grammar == 'root ::= "ok"\n'
    assert backend.submitted[1].sampling.grammar is not None


FIM = FimTokens(pre=1, suf=2, mid=3, rep=4, sep=5)


def test_infill_builds_llama_servers_fim_prompt_and_answers_natively() -> None:
    backend = FakeBackend("x = 1")
    backend.codec.fim_tokens = FIM  # type: ignore[misc]
    body = {
        "input_prefix": "ab",
        "input_suffix": "c",
        "prompt": "d",
        "input_extra": [{"filename": "f", "text": "g"}],
        "n_predict": 5,
    }
    res = call(backend, "POST", "/infill", body)
    assert res.status_code == 200, res.text
    assert res.json()["content"] == "x = 1" and res.json()["stop_type"] == "limit"
    o = ord
    expected = [4, *map(o, "myproject\n"), 5, *map(o, "f\n"), o("g"), 5, *map(o, "filename\n")]
    expected += [1, o("a"), o("b"), o("d"), 2, o("c"), 3]
    assert backend.prompts == [expected]


def test_infill_takes_token_ids_in_prefix_and_suffix_and_a_snippet_line_without_fim_sep() -> None:
    """As llama-server's format_prompt_infill: `input_prefix`/`input_suffix` may mix text and ids;
    with no FIM_SEP token each extra chunk follows its "--- snippet ---" line, and no file names."""
    backend = FakeBackend("x")
    backend.codec.fim_tokens = FimTokens(pre=1, suf=2, mid=3)  # type: ignore[misc]
    body = {"input_prefix": ["a", 7], "input_suffix": [8], "input_extra": [{"filename": "f", "text": "g"}]}
    res = call(backend, "POST", "/infill", body)
    assert res.status_code == 200, res.text
    snippet = [ord(c) for c in "\n\n--- snippet ---\n\n"]
    assert backend.prompts == [[*snippet, ord("g"), 1, ord("a"), 7, 2, 8, 3]]


def test_infill_refuses_a_token_id_prompt_and_ids_out_of_range() -> None:
    """llama-server's 400 '"prompt" must be a string' (Outpost used to drop such a prompt silently);
    an id past the vocabulary in `input_prefix` is a 400 naming the field. Nothing is generated."""
    backend = FakeBackend("x")
    backend.codec.fim_tokens = FIM  # type: ignore[misc]
    ids = call(backend, "POST", "/infill", {"input_prefix": "a", "input_suffix": "b", "prompt": [5, 6]})
    assert ids.status_code == 400 and ids.json()["error"]["message"] == '"prompt" must be a string'
    far = call(backend, "POST", "/infill", {"input_prefix": [10**9], "input_suffix": "b"})
    assert far.status_code == 400 and far.json()["error"]["param"] == "input_prefix"
    assert backend.submitted == []


def test_infill_without_fim_tokens_is_llama_servers_501() -> None:
    backend = FakeBackend("x")
    res = call(backend, "POST", "/infill", {"input_prefix": "a", "input_suffix": "b"})
    assert res.status_code == 501
    err = res.json()["error"]
    assert err["type"] == "not_supported_error"
    assert err["message"].startswith("Infill is not supported by this model: prefix token is missing.")
    backend.codec.fim_tokens = FIM  # type: ignore[misc]
    bad = call(backend, "POST", "/infill", {"input_prefix": "a", "input_extra": [{"filename": "f"}]})
    assert bad.status_code == 400 and backend.submitted == []


def test_props_and_slots_as_llama_server_reports_them() -> None:
    backend = FakeBackend("x", n_ctx_seq=512, slots=3)
    props = call(backend, "GET", "/props", {}).json()
    assert props["default_generation_settings"]["n_ctx"] == 512
    assert props["default_generation_settings"]["params"]["temperature"] == 0.8
    assert props["total_slots"] == 3 and props["chat_template"] == "fake"
    assert props["modalities"] == {"vision": False, "audio": False}
    assert props["model_path"] == "m" and props["build_info"].startswith("outpost-")
    refused = call(backend, "POST", "/props", {"n_ctx": 5})
    assert refused.status_code == 501 and "--props" in refused.json()["error"]["message"]
    backend.running = 1
    slots = call(backend, "GET", "/slots", {}).json()
    assert [s["id"] for s in slots] == [0, 1, 2]
    assert [s["is_processing"] for s in slots] == [True, False, False]


def test_n_choices_for_chat_and_completions_plain_and_streamed() -> None:
    backend = FakeBackend("hey", n_ctx_seq=4096)
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "n": 3, "seed": 9}
    res = call(backend, "POST", "/v1/chat/completions", chat).json()
    assert [c["index"] for c in res["choices"]] == [0, 1, 2]
    assert [c["message"]["content"] for c in res["choices"]] == ["hey"] * 3
    assert res["usage"]["completion_tokens"] == 9 and res["usage"]["prompt_tokens"] == len(backend.prompts[0])
    assert [r.sampling.seed for r in backend.submitted] == [9, 10, 11]
    assert len({r.request_id for r in backend.submitted}) == 3

    async def stream(path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        app = create_app({"m": backend}, HttpSettings(), "m")
        transport = httpx.ASGITransport(app=app)
        client = httpx.AsyncClient(transport=transport, base_url="http://test")
        async with client, client.stream("POST", path, json={**body, "stream": True}) as r:
            lines = [line async for line in r.aiter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]" and lines.count("data: [DONE]") == 1
        return [json.loads(line[6:]) for line in lines[:-1]]

    chunks = asyncio.run(stream("/v1/chat/completions", {**chat, "stream_options": {"include_usage": True}}))
    texts = {i: "" for i in range(3)}
    for c in chunks[:-1]:
        texts[c["choices"][0]["index"]] += c["choices"][0]["delta"].get("content") or ""
    assert texts == {0: "hey", 1: "hey", 2: "hey"} and chunks[-1]["usage"]["completion_tokens"] == 9
    text = {"prompt": ["a", "b"], "max_tokens": 2, "n": 2}
    res = call(backend, "POST", "/v1/completions", text).json()
    assert [c["index"] for c in res["choices"]] == [0, 1, 2, 3]
    chunks = asyncio.run(stream("/v1/completions", text))
    assert sorted({c["choices"][0]["index"] for c in chunks}) == [0, 1, 2, 3]
    assert call(backend, "POST", "/v1/chat/completions", {**chat, "n": 17}).status_code == 400


def test_embeddings_take_token_ids_and_lists_of_them() -> None:
    backend = FakeBackend()
    one = call(backend, "POST", "/v1/embeddings", {"input": [12, 34, 56]}).json()
    two = call(backend, "POST", "/v1/embeddings", {"input": [[12, 34], [56]]}).json()
    assert len(one["data"]) == 1 and len(two["data"]) == 2 and one["usage"]["prompt_tokens"] == 3
    assert backend.embedded == [[[12, 34, 56]], [[12, 34], [56]]]
    backend.embedded.clear()
    mixed = call(backend, "POST", "/v1/embeddings", {"input": [[1], "a", {"content": "b"}]}).json()
    assert len(mixed["data"]) == 3 and backend.embedded == [[[1], "a", "b"]]
    parts = {"content": [{"type": "text", "text": "c"}, {"type": "text", "text": "d"}]}
    call(backend, "POST", "/v1/embeddings", {"input": [parts]})
    assert backend.embedded[-1] == ["cd"]  # llama-server joins the text parts
    assert call(backend, "POST", "/v1/embeddings", {"input": [[]]}).status_code == 400
    assert call(backend, "POST", "/v1/embeddings", {"model": "m"}).status_code == 400


def test_bare_embeddings_answer_llama_servers_native_shape() -> None:
    backend = FakeBackend()
    for path, body in (
        ("/embeddings", {"input": ["a", [12, 34]]}),
        ("/embedding", {"content": ["a", [12, 34]]}),
        ("/v1/embeddings", {"content": ["a", [12, 34]]}),  # `content`: native on /v1 too, as there
    ):
        res = call(backend, "POST", path, body).json()
        assert [r["index"] for r in res] == [0, 1], path
        assert all(len(r["embedding"]) == 1 and len(r["embedding"][0]) > 0 for r in res)
    one = call(backend, "POST", "/embeddings", {"content": ["ab", 7]}).json()  # text and ids: one input
    assert len(one) == 1 and backend.embedded[-1][0][-1] == 7 and len(backend.embedded[-1][0]) > 1


def test_rerank_is_llama_servers_501() -> None:
    for path in ("/rerank", "/v1/rerank"):
        r = call(FakeBackend(), "POST", path, {"query": "q", "documents": ["a"]})
        assert r.status_code == 501 and "does not support reranking" in r.json()["error"]["message"]


def test_slot_actions_without_a_slot_folder_are_llama_servers_501() -> None:
    r = call(FakeBackend(), "POST", "/slots/0?action=save", {"filename": "x.bin"})
    assert r.status_code == 501 and "--slot-save-path" in r.json()["error"]["message"]
    assert call(FakeBackend(), "POST", "/slots/0?action=erase", {}).status_code == 501


def test_slot_file_names_are_checked_as_llama_cpp_checks_them() -> None:
    good = ("x.bin", "slot 1.bin", "état.bin", ".hidden")
    bad = ("", ".", "..", "../x", "a/b", "a\\b", "x.bin.", " x", "x ", "a:b", "a*b", "a\x00b", "x" * 256)
    assert all(slots.valid_filename(name) for name in good)
    assert not any(slots.valid_filename(name) for name in bad)
    r = call(FakeBackend(), "POST", "/slots/0?action=restore", {"filename": "../../etc/passwd"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "filename"


def test_post_props_with_props_is_llama_servers_success() -> None:
    on = HttpSettings(props=True)
    r = call(FakeBackend(), "POST", "/props", {"n_ctx": 5}, on)
    assert r.status_code == 200 and r.json() == {"success": True}
    assert call(FakeBackend(), "GET", "/props", {}, on).json()["endpoint_props"] is True
    assert call(FakeBackend(), "GET", "/props", {}).json()["endpoint_props"] is False
    assert call(FakeBackend(), "POST", "/props", [1, 2], on).status_code == 400
    assert call(FakeBackend(), "POST", "/props", "x", on).status_code == 400


def test_no_slots_turns_the_slots_route_off_as_llama_server() -> None:
    off = HttpSettings(slots=False)
    refused = call(FakeBackend(), "GET", "/slots", {}, off)
    assert refused.status_code == 501 and "--slots" in refused.json()["error"]["message"]
    assert call(FakeBackend(), "GET", "/props", {}, off).json()["endpoint_slots"] is False
    assert call(FakeBackend(), "GET", "/slots", {}).status_code == 200
