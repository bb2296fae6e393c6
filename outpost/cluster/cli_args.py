"""`outpost worker` and `outpost gateway`: their flags and what they run (no logic of their own)."""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

from outpost.scheduler.budget import parse_prefill_budget
from outpost.sizing import int_or_auto

_BROKER_HELP = "RabbitMQ URL without the password, e.g. amqp://outpost@10.0.1.5/ (amqps:// for TLS)"
_PASSWORD_HELP = "file holding the broker password (else $OUTPOST_BROKER_PASSWORD)"
_TLS_HELP = {
    "--broker-ca-file": "PEM CA certificate(s) the broker's TLS certificate must verify against "
    "(amqps://; default: the system's CAs)",
    "--broker-cert-file": "PEM client certificate, for a broker that asks for one (mutual TLS)",
    "--broker-key-file": "the client certificate's unencrypted PEM key (default: in --broker-cert-file)",
}


def _add_broker_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--broker", default=os.environ.get("OUTPOST_BROKER_URL"), help=_BROKER_HELP)
    p.add_argument("--broker-password-file", help=_PASSWORD_HELP)
    for flag, help_text in _TLS_HELP.items():
        p.add_argument(flag, help=help_text)


def _broker_url(args: argparse.Namespace) -> str:
    """--broker with the password and the TLS files; ValueError (a usage error) when unusable."""
    from outpost.cluster.topology import TLS_FLAGS, broker_url

    if not args.broker:
        raise ValueError("--broker is required (or $OUTPOST_BROKER_URL)")
    tls_files = {name: getattr(args, flag[2:].replace("-", "_")) for name, flag in TLS_FLAGS.items()}
    return broker_url(args.broker, args.broker_password_file, tls_files=tls_files)


def add_worker_parser(sub: Any, handler: Any) -> None:
    p = sub.add_parser("worker", help="serve a model's requests from RabbitMQ (outpost serve's engine flags)")
    _add_broker_flags(p)
    p.add_argument("-m", "--model", required=True, help="GGUF file or model store name")
    p.add_argument("-a", "--alias", dest="model_id", help="model id (queue name; default: the file stem)")
    # auto (the default): sized from the memory and cores this process may use (outpost/sizing).
    p.add_argument("-np", "--parallel", type=int_or_auto, help="slots = requests held (default auto)")
    p.add_argument("-c", "--ctx-size", type=int_or_auto, help="KV cells for all slots (default auto)")
    p.add_argument("-t", "--threads", type=int_or_auto, help="CPU threads (default auto: usable cores)")
    p.add_argument("-ngl", "--n-gpu-layers", type=int, help="layers to offload to GPU")
    p.add_argument("-b", "--batch-size", type=int, help="tokens per decode step (default 512)")
    p.add_argument("-ub", "--ubatch-size", type=int, help="physical micro-batch (default 512)")
    p.add_argument("-fa", "--flash-attn", choices=["auto", "on", "off"])
    p.add_argument("--repack", choices=["auto", "on", "off"])
    p.add_argument("-kvu", "--kv-unified", choices=["auto", "on", "off"])
    p.add_argument("--no-prefix-cache", action="store_false", dest="prefix_cache", default=None)
    p.add_argument("--cache-idle-cells", type=int)
    p.add_argument(
        "--prefill-budget",
        type=parse_prefill_budget,
        help="prompt tokens per step while others generate: auto (default), a number, or off/0",
    )
    p.add_argument("--chat-template", help="jinja chat template file overriding the model's")
    p.add_argument("--embedding-model", help="GGUF this worker embeds with (default: the served model)")
    p.add_argument("--worker-id", help="id in heartbeats (default: host-pid-random, unique per process)")
    p.add_argument("--otlp-endpoint", help="export queue wait / prefill / decode spans to this OTLP/HTTP URL")
    p.set_defaults(handler=handler)


_WORKER_OPTIONS = (
    "model_id parallel ctx_size threads n_gpu_layers batch_size ubatch_size flash_attn repack kv_unified "
    "prefix_cache cache_idle_cells prefill_budget embedding_model"
).split()


def run_worker(args: argparse.Namespace, model_path: str) -> int:
    from outpost.api.config import build_server_config, sized_config
    from outpost.cluster.local_engine import RuntimeEngine
    from outpost.cluster.worker import serve_worker
    from outpost.runtime import Engine
    from outpost.tracing import tracer_for

    url = _broker_url(args)
    options = {name: getattr(args, name) for name in _WORKER_OPTIONS}
    options["model_path"] = model_path
    config, _ = sized_config(build_server_config(options, None, args.chat_template))
    assert isinstance(config.parallel, int)  # sized
    # The engine's own queue never fills: the consumer holds at most `parallel` requests.
    engine = Engine(
        config.engine_config(),
        max_queue=config.parallel,
        prefix_cache=config.prefix_cache,
        idle_cache_cells=config.cache_idle_cells,
        prefill_budget=config.prefill_budget,
    )
    worker_engine = RuntimeEngine(engine, config.embedding_model)
    try:
        tracer = tracer_for(args.otlp_endpoint, "outpost-worker")
        return asyncio.run(serve_worker(url, config.served_model_id, worker_engine, args.worker_id, tracer))
    finally:
        worker_engine.close()  # the embedder, if one was loaded, then the engine


def add_gateway_parser(sub: Any, handler: Any) -> None:
    p = sub.add_parser("gateway", help="outpost serve's HTTP API in front of workers, over RabbitMQ")
    _add_broker_flags(p)
    p.add_argument(
        "--broker-management-url",
        help="RabbitMQ management API, for the queue length policy (default http://BROKER-HOST:15672/; "
        "https://BROKER-HOST:15671/ for amqps://, verified like the broker)",
    )
    p.add_argument(
        "-m", "--model", action="append", required=True, help="model served (repeatable): GGUF or store name"
    )
    p.add_argument("-c", "--ctx-size", type=int, help="positions per request (default: the trained context)")
    p.add_argument("--host", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 8080)")
    p.add_argument("--api-key", action="append", dest="api_keys", help="accepted API key (repeatable)")
    p.add_argument("--api-key-file", help="file with one API key per line")
    p.add_argument("--max-queue", type=int, default=1024, help="requests waiting per model (default 1024)")
    p.add_argument("--request-timeout", type=float, help="seconds from arrival to last token (default 600)")
    p.add_argument("--max-body", type=int, help="request body limit in bytes (default 4 MiB)")
    p.add_argument("--default-max-tokens", type=int, help="max_tokens when a request gives none (1024)")
    p.add_argument("--cors-origins", help="comma-separated allowed origins, or * (default: CORS off)")
    p.add_argument("--log-prompts", action="store_true", default=None, help="log prompt and answer text")
    p.add_argument("--chat-template", help="jinja chat template file overriding the models'")
    p.add_argument("--grace-period", type=float, help="seconds SIGTERM waits for in-flight requests (30)")
    p.add_argument("--ssl-keyfile", help="TLS private key (PEM)")
    p.add_argument("--ssl-certfile", help="TLS certificate (PEM)")
    p.add_argument("--otlp-endpoint", help="export each request's span to this OTLP/HTTP collector URL")
    p.add_argument(
        "--prefix-routing",
        choices=["on", "off"],
        help="send a request whose prompt prefix a worker holds in its KV cache to that worker's lane "
        "(on, default), or every request to the shared queue (off)",
    )
    p.set_defaults(handler=handler)


_GATEWAY_OPTIONS = (
    "host port max_queue request_timeout max_body default_max_tokens log_prompts grace_period "
    "ssl_keyfile ssl_certfile otlp_endpoint"
).split()


def run_gateway(args: argparse.Namespace, model_paths: list[str]) -> int:
    from outpost.api.config import build_server_config
    from outpost.cluster.gateway_main import serve_gateway

    url = _broker_url(args)
    options = {name: getattr(args, name) for name in _GATEWAY_OPTIONS}
    options["model_path"] = model_paths[0]
    options["api_keys"] = tuple(args.api_keys) if args.api_keys else None
    options["cors_origins"] = (
        tuple(o.strip() for o in args.cors_origins.split(",")) if args.cors_origins else None
    )
    config = build_server_config(options, args.api_key_file, args.chat_template)
    return serve_gateway(
        config,
        url,
        model_paths,
        args.ctx_size,
        args.broker_management_url,
        prefix_routing=(args.prefix_routing or "on") == "on",
    )
