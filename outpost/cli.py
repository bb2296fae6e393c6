"""The `outpost` command: parses arguments, builds configs, calls a package. No logic of its own.

Exit codes for every subcommand: 0 success, 2 bad usage or bad input (a one-line message, no
traceback), 1 a runtime failure. Progress and logs go to stderr, results to stdout.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from pydantic import ValidationError

from outpost.bench.cli_args import add_bench_parser
from outpost.cluster.cli_args import add_gateway_parser, add_worker_parser
from outpost.envflags import use_environment
from outpost.models.cli_args import add_models_store_parsers, add_pull_parser, add_quantize_parser
from outpost.models.convert.cli_args import add_convert_parser
from outpost.models.store import resolve_model_arg, sagemaker_model
from outpost.run import PRESETS, UsageError
from outpost.scheduler.budget import parse_prefill_budget
from outpost.sizing import int_or_auto

_log = logging.getLogger("outpost")


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports bad usage on one line (exit 2) instead of a usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"outpost: error: {message} (see: {self.prog} --help)\n")


def _add_kernel_flags(p: argparse.ArgumentParser, default: str | None) -> None:
    """llama.cpp kernel choices shared by run and serve (llama-server's -fa; --repack auto|on|off)."""
    p.add_argument(
        "-fa",
        "--flash-attn",
        choices=["auto", "on", "off"],
        default=default,
        help="flash attention (default auto: off on the CPU, where llama.cpp's kernel is slow for "
        "decode steps and short chunks; llama.cpp's auto with -ngl)",
    )
    p.add_argument(
        "--repack",
        choices=["auto", "on", "off"],
        default=default,
        help="llama.cpp's repacked CPU weight layouts (default auto: probed where AMX tiles fault)",
    )


def _add_run_parser(sub: Any) -> None:
    p = sub.add_parser("run", help="chat with a model in the terminal (llama-cli's flags)")
    p.add_argument("-m", "--model", help="GGUF file (default: the built-in random-weight demo model)")
    p.add_argument("-p", "--prompt", help="first user message")
    p.add_argument("-f", "--file", help="read the first user message from this file")
    p.add_argument("-sys", "--system-prompt", dest="system", help="system message")
    p.add_argument("-n", "--n-predict", type=int, help="max tokens per answer (-1: until the context ends)")
    p.add_argument("-c", "--ctx-size", type=int, help="context size (default: trained context, max 8192)")
    p.add_argument("-t", "--threads", type=int, help="CPU threads (default: all this process may use)")
    p.add_argument("-ngl", "--n-gpu-layers", type=int, default=0, help="layers to offload to GPU")
    p.add_argument("-sm", "--split-mode", choices=["none", "layer", "row"], default="layer")
    p.add_argument("--temp", type=float, help="temperature (0 = greedy; default 0.8)")
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("-s", "--seed", type=int, default=-1, help="RNG seed (-1: random)")
    p.add_argument("--single-turn", action="store_true", help="answer the prompt once and exit")
    p.add_argument("--chat-template", help="jinja chat template file overriding the model's")
    p.add_argument("--preset", choices=sorted(PRESETS), help="chat or summarize defaults; flags override")
    _add_kernel_flags(p, "auto")
    p.set_defaults(handler=_cmd_run)


def _add_models_parser(sub: Any) -> None:
    p = sub.add_parser("models", help="the model store (list, show, rm) and synthetic models")
    msub = p.add_subparsers(dest="models_cmd", required=True, parser_class=OneLineParser)
    s = msub.add_parser("synth", help="write a random-weight GGUF in a real architecture's shape")
    s.add_argument(
        "--shape", required=True, help="tiny, smollm2-135m, smollm2-360m, smollm2-1.7b, qwen2.5-0.5b"
    )
    s.add_argument("--quant", default="f16", help="f16 (default), q8_0, q4_0 or q4_K_M")
    s.add_argument("-o", "--output", required=True, help="output .gguf path")
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(handler=_cmd_models_synth)
    add_models_store_parsers(msub)


def _add_serve_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible and SageMaker HTTP server (llama-server's flags)")
    p.add_argument("-m", "--model", help="GGUF file (default: the built-in random-weight demo model)")
    p.add_argument("-a", "--alias", dest="model_id", help="model id clients use (default: the file stem)")
    # auto (the default): sized from the memory and cores this process may use (outpost/sizing).
    p.add_argument("-np", "--parallel", type=int_or_auto, help="slots decoded together (default auto)")
    p.add_argument("-c", "--ctx-size", type=int_or_auto, help="KV cells for all slots (default auto)")
    p.add_argument("-t", "--threads", type=int_or_auto, help="CPU threads (default auto: usable cores)")
    p.add_argument("-ngl", "--n-gpu-layers", type=int, help="layers to offload to GPU")
    p.add_argument("-sm", "--split-mode", choices=["none", "layer", "row"])
    p.add_argument("-b", "--batch-size", type=int, help="tokens per decode step (default 512)")
    p.add_argument("-ub", "--ubatch-size", type=int, help="physical micro-batch (default 512)")
    p.add_argument(
        "--prefill-budget",
        type=parse_prefill_budget,
        help="prompt tokens per step while other requests generate, so their tokens keep coming "
        "while long prompts are read: auto (default: from step times measured at start, a step with "
        "a prompt chunk costs at most 3 one-stream decode steps; 64 at least with flash attention), "
        "a number, or off/0 (whole -b steps)",
    )
    p.add_argument("--host", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 8080, SageMaker's)")
    p.add_argument("--api-key", action="append", dest="api_keys", help="accepted API key (repeatable)")
    p.add_argument("--api-key-file", help="file with one API key per line")
    p.add_argument("--max-queue", type=int, help="requests waiting beyond the slots (default 64); more: 429")
    p.add_argument("--request-timeout", type=float, help="seconds from arrival to last token (default 600)")
    p.add_argument("--max-body", type=int, help="request body limit in bytes (default 4 MiB)")
    p.add_argument("--default-max-tokens", type=int, help="max_tokens when a request gives none (1024)")
    p.add_argument("--embedding-model", help="GGUF for /v1/embeddings (default: the served model)")
    p.add_argument("--ssl-keyfile", help="TLS private key (PEM)")
    p.add_argument("--ssl-certfile", help="TLS certificate (PEM)")
    p.add_argument("--cors-origins", help="comma-separated allowed origins, or * (default: CORS off)")
    p.add_argument("--log-prompts", action="store_true", default=None, help="log prompt and answer text")
    p.add_argument("--chat-template", help="jinja chat template file overriding the model's")
    p.add_argument(
        "--reasoning-format",
        choices=["auto", "none", "deepseek"],
        help="auto (default): <think> text goes to reasoning_content; none: it stays in content",
    )
    p.add_argument("--no-prefix-cache", action="store_false", dest="prefix_cache", default=None)
    p.add_argument(
        "--cache-idle-cells",
        type=int,
        help="with a shared KV pool (the default), KV cells finished requests keep for prefix reuse once "
        "others run (default 0: every decode attends over every used cell, so idle caches slow all "
        "requests); per-slot streams keep them all",
    )
    p.add_argument(
        "--no-webui", action="store_false", dest="webui", default=None, help="no chat page at / (404)"
    )
    p.add_argument("--grace-period", type=float, help="seconds SIGTERM waits for in-flight requests (30)")
    p.add_argument("--otlp-endpoint", help="export OpenTelemetry spans to this OTLP/HTTP collector URL")
    p.add_argument(
        "--sse-keepalive",
        type=float,
        help="seconds a stream may go without an event before a `: keep-alive` comment is sent, so "
        "proxies keep queued and prefilling streams open (default 15; 0: never)",
    )
    p.add_argument(
        "-kvu",
        "--kv-unified",
        choices=["auto", "on", "off"],
        help="a stream of c/np KV cells per slot (auto, off: a token attends only over its own "
        "slot's cells; idle caches are kept) or one pool for all slots (on: one request may use "
        "all c cells); AMX's one-token layout and -np 1 always use one pool",
    )
    _add_kernel_flags(p, None)
    p.set_defaults(handler=_cmd_serve)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="outpost", description="Run small language models on your own hardware.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log llama.cpp and engine details")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    _add_run_parser(sub)
    _add_models_parser(sub)
    _add_serve_parser(sub)
    add_bench_parser(sub)
    add_pull_parser(sub)
    add_quantize_parser(sub)
    add_convert_parser(sub)
    add_worker_parser(sub, _cmd_worker)
    add_gateway_parser(sub, _cmd_gateway)
    return parser


def progress_bar(desc: str) -> Callable[[int, int, str], None]:
    """A stderr progress callback `(done, total, label)` for long tasks."""
    from tqdm import tqdm

    bar: list[Any] = []

    def update(done: int, total: int, label: str) -> None:
        if not bar:
            bar.append(tqdm(total=total, desc=desc, unit="tensor", file=sys.stderr, leave=True))
        bar[0].set_postfix_str(label[:40], refresh=False)
        bar[0].update(done - bar[0].n)
        if done >= total:
            bar[0].close()

    return update


def _cmd_models_synth(args: argparse.Namespace) -> int:
    from outpost.models import SHAPES, write_synthetic_model

    if args.shape not in SHAPES:
        raise UsageError(f"unknown shape {args.shape!r}; choose one of: {', '.join(SHAPES)}")
    path = write_synthetic_model(
        args.shape, Path(args.output), quant=args.quant, seed=args.seed, progress=progress_bar(args.shape)
    )
    print(path)
    return 0


def _resolve_model(model: str | None, command: str = "run") -> str:
    if model:
        return resolve_model_arg(model)  # a path, or a name in the model store (never downloads)
    from outpost.models import ensure_demo_model

    path = ensure_demo_model(progress=progress_bar("demo model"))
    sys.stderr.write(
        f"outpost: using the built-in demo model {path}: RANDOM WEIGHTS, its answers are noise.\n"
        f"outpost: for real answers give a real model: outpost {command} -m path/to/model.gguf\n"
    )
    return str(path)


def _cmd_run(args: argparse.Namespace) -> int:
    from outpost.run import run_command

    args.model = _resolve_model(args.model)
    return run_command(args)


# `outpost serve` flags that map one-to-one onto ServerConfig fields.
_SERVE_OPTIONS = (
    "model_id parallel ctx_size threads n_gpu_layers split_mode batch_size ubatch_size host port max_queue "
    "request_timeout max_body default_max_tokens embedding_model ssl_keyfile ssl_certfile log_prompts "
    "prefix_cache cache_idle_cells grace_period flash_attn repack kv_unified reasoning_format sse_keepalive"
    " prefill_budget webui otlp_endpoint"
).split()


def _cmd_serve(args: argparse.Namespace) -> int:
    from outpost.api import serve
    from outpost.api.config import build_server_config

    options = {name: getattr(args, name) for name in _SERVE_OPTIONS}
    options["api_keys"] = tuple(args.api_keys) if args.api_keys else None
    options["cors_origins"] = (
        tuple(o.strip() for o in args.cors_origins.split(",")) if args.cors_origins else None
    )
    # -m (or OUTPOST_MODEL / OUTPOST_MODEL_PATH), else a GGUF in SageMaker's /opt/ml/model, else the demo.
    options["model_path"] = _resolve_model(args.model or sagemaker_model(), "serve")
    config = build_server_config(options, args.api_key_file, args.chat_template)
    return serve(config)


def _cmd_worker(args: argparse.Namespace) -> int:
    from outpost.cluster.cli_args import run_worker

    return run_worker(args, resolve_model_arg(args.model))


def _cmd_gateway(args: argparse.Namespace) -> int:
    from outpost.cluster.cli_args import run_gateway

    return run_gateway(args, [resolve_model_arg(m) for m in args.model])


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    use_environment(parser, sys.argv[1:] if argv is None else argv)  # OUTPOST_* variables as flag defaults
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING, format="%(name)s: %(message)s"
    )
    try:
        return int(args.handler(args))
    except (UsageError, ValidationError, ValueError, FileNotFoundError) as exc:
        sys.stderr.write(f"outpost: error: {_one_line(exc)}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("\n")
        return 130
    except Exception as exc:
        if os.environ.get("OUTPOST_DEBUG"):
            raise
        sys.stderr.write(f"outpost: error: {_one_line(exc)}\n")
        return 1


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
    return " ".join(str(exc).split()) or type(exc).__name__


if __name__ == "__main__":  # `python -m outpost.cli`: the console script's way in, huge pages included
    from outpost.entry import main as entry_main

    sys.exit(entry_main())
