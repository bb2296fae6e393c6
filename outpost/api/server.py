"""Running the app: uvicorn (optionally TLS), logging, and a graceful SIGTERM drain.

On the first SIGTERM (or Ctrl-C) the server keeps listening but answers new requests with 503 and
/health says `draining`; once the in-flight requests finish, or the grace period ends, uvicorn
shuts down and the process exits 0. A second signal stops at once. A model that fails to load
ends the process with exit code 1. What runs under it is built by the composition roots
(outpost/commands: serve; outpost/cluster/gateway/main.py: gateway).
"""

from __future__ import annotations

import logging
import socket
import sys
import time
from types import FrameType

import uvicorn
from fastapi import FastAPI

from outpost.api.requestlog import access_log
from outpost.api.state import ServerState
from outpost.settings import HttpSettings
from outpost.sizing import Plan
from outpost.sizing.plan import human_bytes, plural

_log = logging.getLogger("outpost.api")


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
        self.hosts = state.config.hosts
        self._signalled_at: float | None = None
        self._announced = False

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        if sockets is None and len(self.hosts) > 1:  # --host a,b: uvicorn binds one host itself
            sockets = bind_all(self.hosts, self.config.port)
        await super().serve(sockets=sockets)

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
                    "ready: %sserving %s on %s%s",
                    ready_summary(state, self.plan),
                    _served(state),
                    self.url,
                    _engine_summary(state),
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


def bind_all(hosts: tuple[str, ...], port: int) -> list[socket.socket]:
    """A listening socket per address (llama-server's `--host 127.0.0.1,::1`)."""
    socks = []
    for host in hosts:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:  # :: must not also take the IPv4 port another entry binds
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, port))
        sock.set_inheritable(True)
        socks.append(sock)
    return socks


def uvicorn_config(app: FastAPI, config: HttpSettings) -> tuple[uvicorn.Config, str]:
    """How `outpost serve` and `outpost gateway` run their app under uvicorn, and its URL (the
    first --host's; DrainingServer binds the others)."""
    host = config.hosts[0]
    uv_config = uvicorn.Config(
        app,
        host=host,
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
    shown = f"[{host}]" if ":" in host else host
    more = "".join(f", {h}" for h in config.hosts[1:])
    return uv_config, f"{scheme}://{shown}:{config.port}{more}"


def ready_summary(state: ServerState, plan: Plan | None) -> str:
    """The ready line's sizing: `8 slots x 8192 positions, 1.4 GiB KV (65536 cells), 2 threads:
    <where the numbers came from>; ` (from the plan, which holds the sized values); "" where nothing
    was sized here (a gateway, a test's stand-in backend)."""
    backend = next(iter(state.backends.values()), None)
    if backend is None or plan is None:
        return ""
    cells = backend.describe().get("n_ctx", plan.n_ctx)
    return (
        f"{plural(plan.slots, 'slot')} x {backend.n_ctx_seq} positions, {human_bytes(plan.kv_bytes)} KV "
        f"({cells} cells), {plural(plan.threads, 'thread')}: {plan.why()}; "
    )


def _served(state: ServerState) -> str:
    """The model the ready line names, or how many there are and which."""
    if len(state.backends) <= 1:
        return state.model_id
    return f"{len(state.backends)} models ({', '.join(state.backends)})"


def _engine_summary(state: ServerState) -> str:
    """What decides speed, for the ready line (a local engine's `describe()["serving"]`)."""
    backend = next(iter(state.backends.values()), None)
    serving = backend.describe().get("serving") if backend is not None else None
    return f" ({serving})" if serving else ""


__all__ = ["DrainingServer", "configure_logging", "ready_summary", "uvicorn_config"]
