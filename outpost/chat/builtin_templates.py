"""llama.cpp's built-in chat templates by name, as jinja texts (`--chat-template chatml`).

llama-server's `--chat-template NAME` picks one of llama.cpp's hand-written formatters
(src/llama-chat.cpp). Outpost renders every template with jinja, so each name maps to a jinja text
that renders what llama.cpp's formatter writes (tests/integration/test_builtin_templates.py
compares them with llama.cpp's own `llama_chat_apply_template`). Only the common names are here;
another name is an error listing these.
"""

from __future__ import annotations

# A system message folded into the first user turn, for formats without a system role.
_SYS_INTO_USER = (
    "{%- set ns = namespace(sys='') -%}"
    "{%- for m in messages if m.role == 'system' %}{% set ns.sys = ns.sys + m.content %}{% endfor -%}"
)

BUILTIN_TEMPLATES: dict[str, str] = {
    "chatml": (
        "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor -%}"
        "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}"
    ),
    "llama3": (
        "{%- for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
        "{{ m.content | trim }}<|eot_id|>{% endfor -%}"
        "{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif -%}"
    ),
    "mistral-v7": (
        "{%- for m in messages -%}"
        "{%- if m.role == 'system' %}[SYSTEM_PROMPT] {{ m.content }}[/SYSTEM_PROMPT]"
        "{%- elif m.role == 'user' %}[INST] {{ m.content }}[/INST]"
        "{%- else %} {{ m.content }}</s>{% endif -%}"
        "{%- endfor -%}"
    ),
    "phi3": (
        "{%- for m in messages %}<|{{ m.role }}|>\n{{ m.content }}<|end|>\n{% endfor -%}"
        "{%- if add_generation_prompt %}<|assistant|>\n{% endif -%}"
    ),
    "phi4": (
        "{%- for m in messages %}<|im_start|>{{ m.role }}<|im_sep|>{{ m.content }}<|im_end|>{% endfor -%}"
        "{%- if add_generation_prompt %}<|im_start|>assistant<|im_sep|>{% endif -%}"
    ),
    "gemma": _SYS_INTO_USER
    + (
        "{%- set ns2 = namespace(first=true) -%}"
        "{%- for m in messages if m.role != 'system' -%}"
        "<start_of_turn>{{ 'model' if m.role == 'assistant' else m.role }}\n"
        "{% if ns2.first and ns.sys %}{{ ns.sys }}\n\n{% endif %}{% set ns2.first = false -%}"
        "{{ m.content | trim }}<end_of_turn>\n"
        "{% endfor -%}"
        "{%- if add_generation_prompt %}<start_of_turn>model\n{% endif -%}"
    ),
    "zephyr": (
        "{%- for m in messages %}<|{{ m.role }}|>\n{{ m.content }}<|endoftext|>\n{% endfor -%}"
        "{%- if add_generation_prompt %}<|assistant|>\n{% endif -%}"
    ),
    "vicuna": (
        "{%- for m in messages -%}"
        "{%- if m.role == 'system' %}{{ m.content }}\n\n"
        "{% elif m.role == 'user' %}USER: {{ m.content }}\n"
        "{% else %}ASSISTANT: {{ m.content }}</s>\n{% endif -%}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt %}ASSISTANT:{% endif -%}"
    ),
    "deepseek3": (
        "{%- for m in messages -%}"
        "{%- if m.role == 'system' %}{{ m.content }}\n\n"
        "{% elif m.role == 'user' %}<｜User｜>{{ m.content }}"
        "{%- else %}<｜Assistant｜>{{ m.content }}<｜end▁of▁sentence｜>{% endif -%}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt %}<｜Assistant｜>{% endif -%}"
    ),
}


def builtin_template(name: str) -> str | None:
    """The jinja text of llama.cpp's built-in template `name`, None for another name."""
    return BUILTIN_TEMPLATES.get(name)
