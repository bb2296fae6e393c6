"""`outpost convert`: its argparse parser and handler (kept here so cli.py only registers it)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from outpost.progressbar import progress_bar


def add_convert_parser(sub: Any) -> None:
    """Register `outpost convert SRC --outtype T -o OUT.gguf [--pre-tokenizer NAME]`."""
    p = sub.add_parser(
        "convert",
        help="convert a Hugging Face model (folder or repo id) to GGUF",
        description="Convert a Hugging Face causal LM (LlamaForCausalLM, MistralForCausalLM, "
        "Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma3ForCausalLM, Phi3ForCausalLM) to GGUF.",
    )
    p.add_argument("src", metavar="SRC", help="local Hugging Face model folder, or a repo id (owner/name)")
    # The names of tensors.OUTTYPES, spelled out so that `outpost --help` does not import gguf/numpy.
    p.add_argument("--outtype", default="f16", choices=["f32", "f16", "bf16", "q8_0"], help="default f16")
    p.add_argument("-o", "--outfile", dest="output", help="output .gguf (default: ./NAME-OUTTYPE.gguf)")
    p.add_argument(
        "--pre-tokenizer",
        help="llama.cpp pre-tokenizer name (tokenizer.ggml.pre), overriding the one read from tokenizer.json",
    )
    p.set_defaults(handler=_cmd_convert)


def _cmd_convert(args: argparse.Namespace) -> int:
    from outpost.models.convert import convert_model

    out = convert_model(
        args.src,
        Path(args.output) if args.output else None,
        outtype=args.outtype,
        pre_tokenizer=args.pre_tokenizer,
        progress=progress_bar("convert"),
    )
    print(out)
    return 0
