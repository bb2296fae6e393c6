"""Running the app: uvicorn (optionally TLS), logging, and a graceful SIGTERM drain.

On the first SIGTERM (or Ctrl-C) the server keeps listening but answers new requests with 503 and
/health says `draining`; once the in-flight requests finish, or the grace period ends, uvicorn
shuts down and the process exits 0. A second signal stops at once. A model that fails to load
ends the process with exit code 1.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from functools import partial
from types import FrameType
from typing import Any

import uvicorn

from outpost.api.app import create_app
from outpost.api.config import ServerConfig
from outpost.api.requestlog import access_log
from outpost.api.state import ServerState
from outpost.sizing import Plan
from outpost.sizing.plan import human_bytes, plural

_log = logging.getLogger("outpost.api")


def build_engine(config: ServerConfig) -> Any:
    """Load the model and start its engine thread (runs in a worker thread at startup)."""
    from outpost.runtime import Engine

    return Engine(
        config.engine_config(),
        max_queue=config.max_queue,
        prefix_cache=config.prefix_cache,
        idle_cache_cells=config.cache_idle_cells,
    )


def configure_logging() -> None:
    """Access lines (one JSON object each) and server notices to stderr, unformatted."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    access_log.handlers[:] = [handler]
    access_log.setLevel(logging.INFO)
    access_log.propagate = False
    notices = logging.getLogger("outpost.api")
    if notices.level == logging.NOTSET or notices.level > logging.INFO:
        notices.setLevel(logging.INFO)


class DrainingServer(uvicorn.Server):
    """uvicorn.Server whose first exit signal drains in-flight requests instead of closing at once."""

    def __init__(
        self, config: uvicorn.Config, state: ServerState, url: str, plan: Plan | None = None
    ) -> None:
        super().__init__(config)
        self.state = state
        self.url = url
        self.plan = plan
        self.exit_code = 0
        self._signalled_at: float | None = None
        self._announced = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._signalled_at is None and not self.should_exit:
            self._signalled_at = time.monotonic()  # acted on in on_tick, outside the signal handler
            return
        super().handle_exit(sig, frame)  # a second signal: stop now

    async def on_tick(self, counter: int) -> bool:
        state = self.state
        if not self._announced and state.status in ("ok", "failed"):
            self._announced = True
            if state.status == "ok":
                _log.info(
                    "ready: %s; serving %s on %s", ready_summary(state, self.plan), state.model_id, self.url
                )
        if state.status == "failed" and not self.should_exit:
            self.exit_code = 1
            self.should_exit = True
        if self._signalled_at is not None:
            if state.status != "draining":
                state.begin_drain()
            grace = state.config.grace_period
            if state.inflight == 0 or time.monotonic() - self._signalled_at >= grace:
                if state.inflight:
                    _log.warning("grace period over: cancelling %d request(s)", state.inflight)
                self.should_exit = True
        return await super().on_tick(counter)


def sized_config(config: ServerConfig) -> tuple[ServerConfig, Plan]:
    """`config` with its "auto" slots, KV cells and threads decided from the machine and the model
    (outpost/sizing); NotEnoughMemory (a ValueError: exit 2) when explicit ones cannot fit."""
    from outpost.sizing import Asked, size_for_model

    def given(value: object) -> int | None:
        return value if isinstance(value, int) else None

    asked = Asked(
        parallel=given(config.parallel),
        ctx_size=given(config.ctx_size),
        threads=given(config.threads),
        n_ubatch=config.ubatch_size,
        n_batch=config.batch_size,
        flash_attn=config.flash_attn,
        check_memory=config.n_gpu_layers == 0,
    )
    plan = size_for_model(config.model_path, asked)
    update = {"parallel": plan.slots, "ctx_size": plan.n_ctx, "threads": plan.threads}
    return config.model_copy(update=update), plan


def serve(config: ServerConfig, engine_factory: Callable[[], Any] | None = None) -> int:
    """Serve until stopped; returns the process exit code."""
    config.engine_config()  # a bad model file is a usage error, before anything starts
    config, plan = sized_config(config)
    configure_logging()
    app = create_app(engine_factory or partial(build_engine, config), config)
    uv_config = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        ssl_keyfile=config.ssl_keyfile,
        ssl_certfile=config.ssl_certfile,
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=2,
        timeout_keep_alive=5,
    )
    scheme = "https" if config.tls else "http"
    url = f"{scheme}://{config.host}:{config.port}"
    _log.info("loading %s; listening on %s", config.model_path, url)
    server = DrainingServer(uv_config, app.state.server, url, plan)
    server.run()
    return server.exit_code


def ready_summary(state: ServerState, plan: Plan | None) -> str:
    """The ready line's sizing and speed facts: `8 slots x 8192 positions, 1.4 GiB KV (65536
    cells, one pool), 2 threads, repacked weights: <where the numbers came from>`."""
    engine: Any = state.engine
    model: Any = getattr(engine, "model", None)
    config = getattr(model, "config", None)
    if config is None:  # a test's stand-in engine
        return f"{state.config.parallel} slots"
    cells = model.n_ctx if model.kv_unified else model.n_ctx_seq * config.n_seq_max
    kv = f"{cells} cells, one pool" if model.kv_unified else f"{cells} cells, a stream per slot"
    kv_gib = f"{human_bytes(plan.kv_bytes)} KV ({kv})" if plan else f"KV {kv}"
    return (
        f"{plural(config.n_seq_max, 'slot')} x {engine.n_ctx_seq} positions, {kv_gib}, "
        f"{plural(config.n_threads, 'thread')}, {config.weight_layout} weights"
        + (f": {plan.why()}" if plan else "")
    )


__all__ = ["DrainingServer", "build_engine", "ready_summary", "serve", "sized_config"]
