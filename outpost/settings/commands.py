"""Which blocks each server command takes, and the few settings that belong to one command only.

serve = Engine + Http + Serve (+ Tracing), worker = Broker + Engine + Worker (+ Tracing),
gateway = Http + Broker + Gateway (+ Tracing). A flag that one command alone has goes in that
command's block below; one that several share goes in the shared block (engine.py, http.py,
broker.py, and here `ModelsDirSettings` for all three and `ModelPoolSettings` for serve and worker),
so it is spelled and documented the same in each.

`--max-queue` is one name with a meaning per command, which each command's help states: on serve,
requests waiting beyond the slots (default 64); on the gateway, requests waiting per model in the
broker (default 1024). `-c` on the gateway is refused: positions per request come from the workers.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Literal

from pydantic import field_validator

from outpost.settings.broker import BrokerSettings, TracingSettings
from outpost.settings.engine import EngineSettings
from outpost.settings.fields import Block, ChatTemplateSettings, setting
from outpost.settings.http import HttpSettings


class ModelsDirSettings(Block):
    """--models-dir, declared once for serve, worker and gateway (each serves every GGUF in it)."""

    models_dir: str | None = setting(
        None,
        "--models-dir",
        help="serve every GGUF in DIR, each named by its file name without .gguf (serve and worker: "
        "loaded on first use; a gateway: vocab only, beside its -m models); serve and worker without "
        "-m and --models-dir: every model in the store, by its store name",
    )

    @field_validator("models_dir")
    @classmethod
    def _existing_dir(cls, value: str | None) -> str | None:
        if value is not None and not Path(value).is_dir():
            raise ValueError(f"--models-dir: no such directory: {value}")
        return value


class ModelPoolSettings(ModelsDirSettings):
    """How serve and a worker hold several models (outpost/serving/model_pool.py), declared once."""

    models_max: int = setting(
        4,
        "--models-max",
        help="models loaded at once (default 4; 0: no limit); the least recently used idle one is "
        "unloaded to make room",
        parse=int,
        ge=0,
    )
    sleep_idle_seconds: int = setting(
        -1,
        "--sleep-idle-seconds",
        help="unload a model idle this long, reload it on its next request (default -1: never)",
        parse=int,
        ge=-1,
    )
    model_load_timeout: float = setting(
        300.0,
        "--model-load-timeout",
        help="seconds a request waits for its model to load before a 503 with Retry-After (default 300)",
        parse=float,
        gt=0,
    )


class ServeSettings(ModelPoolSettings):
    """`outpost serve`'s own settings, llama-server's router flags among them."""

    max_queue: int = setting(
        64,
        "--max-queue",
        help="requests waiting beyond the slots (default 64); more: 429",
        parse=int,
        ge=0,
    )
    models_autoload: bool = setting(
        True,
        "--models-autoload",
        help="a request for a model not loaded loads it (--no-models-autoload: a 400; POST /models/load)",
        action="switch",
    )


class WorkerSettings(ModelPoolSettings):
    """`outpost worker`'s own settings (and the model pool's, as serve's: several models)."""

    worker_id: str | None = setting(
        None, "--worker-id", help="id in heartbeats (default: host-pid-random, unique per process)"
    )


def _refuse_ctx_size(text: str) -> int:
    raise argparse.ArgumentTypeError(
        "the gateway takes positions per request from its workers' heartbeats: set -c on the workers"
    )


class GatewaySettings(ChatTemplateSettings, ModelsDirSettings):
    """`outpost gateway`'s own settings: its models and the broker-side queue it keeps for them."""

    models: tuple[str, ...] = setting(
        (),
        "-m",
        "--model",
        help="model served (repeatable): GGUF or store name",
        action="append",
    )
    ctx_size: None = setting(
        None,
        "-c",
        "--ctx-size",
        help="refused (exit 2): a gateway takes positions per request from its workers' heartbeats",
        parse=_refuse_ctx_size,
    )
    max_queue: int = setting(
        1024,
        "--max-queue",
        help="requests waiting per model in the broker (default 1024); more: 429",
        parse=int,
        ge=0,
    )
    broker_management_url: str | None = setting(
        None,
        "--broker-management-url",
        help="RabbitMQ management API, for the queue length policy (default http://BROKER-HOST:15672/; "
        "https://BROKER-HOST:15671/ for amqps://, verified like the broker)",
    )
    prefix_routing: Literal["on", "off"] = setting(
        "on",
        "--prefix-routing",
        help="send a request whose prompt prefix a worker holds in its KV cache to that worker's lane "
        "(on, default), or every request to the shared queue (off)",
        choices=("on", "off"),
    )
    broker_outage: float = setting(
        30.0,
        "--broker-outage",
        help="seconds without the broker that requests in flight ride out (they resume once it is "
        "back); past this each ends with an error (default 30)",
        parse=float,
        gt=0,
    )


COMMANDS: dict[str, tuple[type[Block], ...]] = {
    "serve": (EngineSettings, HttpSettings, ServeSettings, TracingSettings),
    "worker": (BrokerSettings, EngineSettings, WorkerSettings, TracingSettings),
    "gateway": (BrokerSettings, GatewaySettings, HttpSettings, TracingSettings),
}


def add_command_flags(parser: argparse.ArgumentParser, command: str) -> None:
    """Every flag of `command`'s blocks (argparse refuses a flag two of its blocks both define)."""
    for block in COMMANDS[command]:
        block.add_to(parser)
