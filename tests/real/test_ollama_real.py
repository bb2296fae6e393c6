"""Ollama's /api/chat on the real SmolLM2, through the `ollama` client: the same greedy answer as the
OpenAI route on the same server (one engine, one template), whole and streamed, with its counts."""

from __future__ import annotations

import ollama
import openai
from e2e.server_harness import Server

QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


def test_ollama_chat_matches_the_openai_route_greedily(smollm2_server: Server) -> None:
    client = ollama.Client(host=smollm2_server.url, timeout=120)
    oa = openai.OpenAI(base_url=f"{smollm2_server.url}/v1", api_key="unused", max_retries=0, timeout=120)
    options = {"temperature": 0, "num_predict": 24}
    whole = client.chat("smollm2", messages=QUESTION, options=options)
    streamed = list(client.chat("smollm2", messages=QUESTION, options=options, stream=True))
    reference = oa.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0, max_tokens=24)
    choice = reference.choices[0]
    assert whole.message.content and whole.message.content == choice.message.content
    assert "".join(p.message.content or "" for p in streamed) == whole.message.content
    expected = "length" if choice.finish_reason == "length" else "stop"
    assert whole.done_reason == streamed[-1].done_reason == expected
    assert reference.usage is not None
    assert whole.eval_count == reference.usage.completion_tokens
    assert whole.prompt_eval_count == reference.usage.prompt_tokens
