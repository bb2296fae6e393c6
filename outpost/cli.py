"""The `outpost` command: parses arguments, builds configs, calls a package. No logic of its own.

Exit codes for every subcommand: 0 success, 2 bad usage or bad input (a one-line message, no
traceback), 1 a runtime failure. Progress and logs go to stderr, results to stdout.
"""

from __future__ import annotations

import outpost.preload  # noqa: F401  (first: llama.cpp's libraries before numpy.linalg; see it)

# isort: split
import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from pydantic import ValidationError

from outpost.bench.cli_args import add_bench_parser
from outpost.control import add_control_parsers
from outpost.envflags import MODEL_COMMANDS, subcommand, use_environment
from outpost.models.cli_args import add_models_store_parsers, add_pull_parser, add_quantize_parser
from outpost.models.convert.cli_args import add_convert_parser
from outpost.models.store import resolve_model_arg, sagemaker_model
from outpost.progressbar import progress_bar
from outpost.run import PRESETS, UsageError
from outpost.settings import (
    BrokerSettings,
    EngineSettings,
    GatewaySettings,
    HttpSettings,
    ServeSettings,
    TracingSettings,
    WorkerSettings,
    add_command_flags,
)

_log = logging.getLogger("outpost")


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports bad usage on one line (exit 2) instead of a usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"outpost: error: {message} (see: {self.prog} --help)\n")


# run's engine flags: serve's and the worker's EngineSettings, spelled, explained, parsed and
# validated as there (one slot; run reads no OUTPOST_* variables).
RUN_ENGINE_FIELDS = (
    "model",
    "ctx_size",
    "threads",
    "n_gpu_layers",
    "split_mode",
    "flash_attn",
    "repack",
    "chat_template",
    "chat_template_file",
)


def _add_run_parser(sub: Any) -> None:
    p = sub.add_parser("run", help="chat with a model in the terminal (llama-cli's flags)")
    EngineSettings.add_to(p, only=RUN_ENGINE_FIELDS, env=False)
    p.add_argument("-p", "--prompt", help="first user message")
    p.add_argument("-f", "--file", help="read the first user message from this file")
    p.add_argument("-sys", "--system-prompt", dest="system", help="system message")
    p.add_argument("-n", "--n-predict", type=int, help="max tokens per answer (-1: until the context ends)")
    p.add_argument("--temp", type=float, help="temperature (0 = greedy; default 0.8)")
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("-s", "--seed", type=int, default=-1, help="RNG seed (-1: random)")
    p.add_argument("--single-turn", action="store_true", help="answer the prompt once and exit")
    p.add_argument("--preset", choices=sorted(PRESETS), help="chat or summarize defaults; flags override")
    p.set_defaults(handler=_cmd_run)


def _add_models_parser(sub: Any) -> None:
    p = sub.add_parser("models", help="the model store (list, show, rm) and synthetic models")
    msub = p.add_subparsers(dest="models_cmd", required=True, parser_class=OneLineParser)
    s = msub.add_parser("synth", help="write a random-weight GGUF in a real architecture's shape")
    s.add_argument(
        "--shape",
        required=True,
        help="tiny, smollm2-135m, smollm2-360m, smollm2-1.7b, qwen2.5-0.5b, or reranker-tiny (a "
        "rank-pooling BERT reranker for /rerank)",
    )
    s.add_argument("--quant", default="f16", help="f16 (default), q8_0, q4_0 or q4_K_M")
    s.add_argument("-o", "--output", required=True, help="output .gguf path")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument(
        "--lora",
        action="store_true",
        help="write a LoRA adapter (llama.cpp's GGUF) for the --shape model instead of the model",
    )
    s.add_argument("--lora-rank", type=int, default=4, help="the adapter's rank r (default 4)")
    s.add_argument("--lora-alpha", type=float, help="adapter.lora.alpha (default: the rank, alpha / r = 1)")
    s.add_argument(
        "--lora-target",
        action="append",
        help="weight the adapter changes (repeatable; default output.weight, the output projection)",
    )
    s.set_defaults(handler=_cmd_models_synth)
    add_models_store_parsers(msub)


def _add_probe_parser(sub: Any) -> None:
    p = sub.add_parser(
        "probe",
        help="measure which kernels decode fastest on this machine (what -fa/--repack/-kvu auto mean), "
        "once; serve, worker and run read the cached answer",
    )
    p.add_argument("--again", action="store_true", help="measure anew, replacing the cached answer")
    p.add_argument(
        "-np",
        "--parallel",
        type=int,
        help="the slots the server will run: the probe decodes that many sequences together, at most "
        "32 (default 8, what sizing gives 2 cores); each width has its own answer",
    )
    p.set_defaults(handler=_cmd_probe)


def _cmd_probe(args: argparse.Namespace) -> int:
    from outpost.engine import kernel_probe

    logging.getLogger(kernel_probe.__name__).setLevel(logging.INFO)  # its measurement, when it runs one
    sys.stderr.write("outpost: kernel probe: the cached answer, else four variants of a 135M model (~30 s)\n")
    width = kernel_probe.PROBE_SEQS if args.parallel is None else args.parallel
    if width < 1:
        sys.stderr.write("outpost: probe: -np must be at least 1\n")
        return 2
    choice = kernel_probe.measure(again=args.again, width=width)
    if choice is None:
        sys.stderr.write("outpost: not measured (a busy machine, or the probe failed: see above)\n")
        return 1
    print(f"auto kernels: {choice.describe()}")
    return 0


def _add_server_parsers(sub: Any) -> None:
    """serve, worker and gateway: their flags come from the settings blocks (outpost/settings)."""
    helps = {
        "serve": "OpenAI-compatible and SageMaker HTTP server (llama-server's flags)",
        "worker": "serve a model's requests from RabbitMQ (outpost serve's engine flags)",
        "gateway": "outpost serve's HTTP API in front of workers, over RabbitMQ",
    }
    handlers = {"serve": _cmd_serve, "worker": _cmd_worker, "gateway": _cmd_gateway}
    for name, help_text in helps.items():
        p = sub.add_parser(name, help=help_text)
        add_command_flags(p, name)
        p.set_defaults(handler=handlers[name])


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="outpost", description="Run small language models on your own hardware.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log llama.cpp and engine details")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    _add_run_parser(sub)
    _add_models_parser(sub)
    add_bench_parser(sub)
    add_pull_parser(sub)
    add_quantize_parser(sub)
    add_convert_parser(sub)
    _add_probe_parser(sub)
    _add_server_parsers(sub)
    add_control_parsers(sub)
    return parser


def _cmd_models_synth(args: argparse.Namespace) -> int:
    from outpost.models import SHAPES, synth_rerank, write_synthetic_model

    if args.shape == synth_rerank.SHAPE:
        if args.quant.lower() != "f16":
            raise UsageError(f"--shape {synth_rerank.SHAPE} is written in f16 only")
        print(synth_rerank.write_reranker_gguf(Path(args.output), seed=args.seed))
        return 0
    if args.shape not in SHAPES:
        shapes = ", ".join([*SHAPES, synth_rerank.SHAPE])
        raise UsageError(f"unknown shape {args.shape!r}; choose one of: {shapes}")
    if args.lora:
        from outpost.models.lora import DEFAULT_TARGETS, write_lora_adapter

        targets = args.lora_target or DEFAULT_TARGETS
        print(
            write_lora_adapter(
                args.shape, Path(args.output), args.lora_rank, args.lora_alpha, targets, args.seed
            )
        )
        return 0
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


def _label_random_weights(path: str) -> None:
    """Say so when a model's answers will be noise: a random-weight model (`outpost models synth`)."""
    from outpost.models.gguf_info import read_gguf_info

    try:
        shape = read_gguf_info(Path(path)).synthetic_shape
    except ValueError:
        return  # not readable here: llama.cpp's load reports it
    if shape:
        sys.stderr.write(
            f"outpost: {path} is a {shape}-shaped model with RANDOM WEIGHTS: its answers are noise\n"
        )


def _cmd_run(args: argparse.Namespace) -> int:
    from outpost.run import run_command

    explicit = bool(args.model)
    args.model = _resolve_model(args.model)
    if explicit:  # the demo model says so itself
        _label_random_weights(args.model)
    return run_command(args)


def _cmd_serve(args: argparse.Namespace) -> int:
    from outpost.commands.serve import serve

    engine = EngineSettings.from_args(args)
    http, own, tracing = (
        HttpSettings.from_args(args),
        ServeSettings.from_args(args),
        TracingSettings.from_args(args),
    )
    # -m (or OUTPOST_MODEL / OUTPOST_MODEL_PATH), else a GGUF in SageMaker's /opt/ml/model, else every
    # GGUF of --models-dir, else every model in the store, else the demo.
    explicit = engine.model or sagemaker_model()
    if explicit and own.models_dir:
        raise UsageError("give -m (one model) or --models-dir (several), not both")
    if not explicit:
        from outpost.commands.models import models_in_dir, models_in_store

        models = models_in_dir(own.models_dir) if own.models_dir else models_in_store()
        if models:
            from outpost.commands.serve import serve_models

            return serve_models(models, engine, http, own, tracing)
    return serve(_resolve_model(explicit, "serve"), engine, http, own, tracing)


def _cmd_worker(args: argparse.Namespace) -> int:
    engine, own = EngineSettings.from_args(args), WorkerSettings.from_args(args)
    broker, tracing = BrokerSettings.from_args(args), TracingSettings.from_args(args)
    if engine.model and own.models_dir:
        raise UsageError("give -m (one model) or --models-dir (several), not both")
    if engine.model:
        from outpost.commands.worker import run_worker  # llama.cpp: once the command line is sound

        return run_worker(resolve_model_arg(engine.model), broker, engine, own, tracing)
    # As serve: every GGUF of --models-dir, else every model in the store, each loaded on demand.
    from outpost.commands.models import models_in_dir, models_in_store

    models = models_in_dir(own.models_dir) if own.models_dir else models_in_store()
    if not models:
        raise UsageError(
            "outpost worker needs -m/--model (or OUTPOST_MODEL), --models-dir, or models in the store"
        )
    from outpost.commands.worker import run_worker_models

    return run_worker_models(models, broker, engine, own, tracing)


def _cmd_gateway(args: argparse.Namespace) -> int:
    own = GatewaySettings.from_args(args)
    if not own.models and not own.models_dir:
        raise UsageError(
            "outpost gateway needs -m/--model (or OUTPOST_MODEL) or --models-dir: the models it serves"
        )
    from outpost.commands.gateway import gateway_models, run_gateway

    models = gateway_models([resolve_model_arg(m) for m in own.models], own.models_dir)
    blocks = HttpSettings.from_args(args), TracingSettings.from_args(args)
    return run_gateway(models, BrokerSettings.from_args(args), own, *blocks)


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


if __name__ == "__main__":  # `python -m outpost.cli`: as the console script (outpost/entry.py) runs it
    from outpost.engine.hugepages import reexec_with_hugepages

    if subcommand(sys.argv[1:]) in MODEL_COMMANDS:
        reexec_with_hugepages()
    sys.exit(main())
