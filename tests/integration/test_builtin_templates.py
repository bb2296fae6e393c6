"""`--chat-template NAME`: each built-in name's jinja text renders what llama.cpp's own formatter for
that name writes (`llama_chat_apply_template`, the C++ behind llama-server's built-in templates)."""

from __future__ import annotations

import ctypes

import pytest

from outpost.chat.builtin_templates import BUILTIN_TEMPLATES
from outpost.engine.chat_template import ChatTemplate

llama_cpp = pytest.importorskip("llama_cpp")

CHAT = [
    ("system", "You are a helpful assistant"),
    ("user", "Hello"),
    ("assistant", "Hi there"),
    ("user", "Who are you"),
]


def _llama_cpp_render(name: str, add_generation_prompt: bool) -> str:
    messages = (llama_cpp.llama_chat_message * len(CHAT))()
    for i, (role, content) in enumerate(CHAT):
        messages[i].role, messages[i].content = role.encode(), content.encode()
    buf = ctypes.create_string_buffer(16384)
    n = llama_cpp.llama_chat_apply_template(
        name.encode(), messages, len(CHAT), add_generation_prompt, buf, 16384
    )
    assert 0 < n < 16384, (name, n)
    return buf.raw[:n].decode()


@pytest.mark.parametrize("name", list(BUILTIN_TEMPLATES))
@pytest.mark.parametrize("add_generation_prompt", [True, False], ids=["gen", "nogen"])
def test_builtin_template_renders_as_llama_cpp(name: str, add_generation_prompt: bool) -> None:
    ours = ChatTemplate(BUILTIN_TEMPLATES[name]).render(
        [{"role": r, "content": c} for r, c in CHAT], add_generation_prompt=add_generation_prompt
    )
    assert ours == _llama_cpp_render(name, add_generation_prompt)
