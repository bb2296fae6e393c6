"""The server's configuration: one pydantic model for everything `outpost serve` is told.

`ServerConfig` holds the HTTP side (address, TLS, limits, auth, CORS, logging) and the few engine
knobs the server passes through; `engine_config()` turns the latter into the engine's own
`EngineConfig`. The environment reaches it through the CLI: each `outpost serve` flag reads
`OUTPOST_<LONG_FLAG>` (outpost/envflags.py).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from outpost.engine.config import EngineConfig, resolve_flash_attn
from outpost.sizing import Plan

MiB = 1024 * 1024
# Paths anyone may call, even when API keys are set: health checks and scrapers carry no keys.
DEFAULT_OPEN_PATHS: tuple[str, ...] = ("/health", "/ping", "/metrics")
Auto = Literal["auto"]


class ServerConfig(BaseModel):
    """What `outpost serve` runs with; defaults follow llama-server where it has one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_path: str = Field(description="GGUF file to serve")
    model_id: str | None = Field(None, description="id clients put in `model`; default: the file stem")
    chat_template: str | None = Field(None, description="jinja chat template text overriding the GGUF's")
    # Engine knobs (llama-server's flag names in the comments).
    # "auto": sized from the machine and the model at start (outpost/sizing, `sized_config`).
    parallel: Annotated[int, Field(ge=1, le=256)] | Auto = Field(
        "auto", description="slots: requests decoded together (-np)"
    )
    ctx_size: Annotated[int, Field(ge=0)] | Auto = Field(
        "auto", description="KV cells for all slots (-c); 0 = the trained context, at most 8192"
    )
    threads: Annotated[int, Field(ge=1)] | Auto | None = Field(
        "auto", description="CPU threads (-t); auto = the usable cores"
    )
    n_gpu_layers: int = Field(0, ge=-1, description="layers offloaded to GPU (-ngl); -1 = all")
    split_mode: Literal["none", "layer", "row"] = "layer"
    batch_size: int = Field(512, ge=1, description="tokens per decode step (-b)")
    prefill_budget: Annotated[int, Field(ge=1)] | Literal["auto", "off"] = Field(
        "auto",
        description="prompt tokens per step while others generate; auto: chosen from step times "
        "measured at start (outpost/scheduler/budget.py); off: batch_size",
    )
    ubatch_size: int = Field(512, ge=1, description="physical micro-batch (-ub)")
    flash_attn: Literal["auto", "on", "off"] = Field("auto", description="flash attention (-fa)")
    repack: Literal["auto", "on", "off"] = Field(
        "auto", description="llama.cpp's repacked CPU weight layouts (see outpost/engine/cpu_probe.py)"
    )
    kv_unified: Literal["auto", "on", "off"] = Field(
        "auto", description="a stream of ctx_size/parallel KV cells per slot (auto, off), or one pool (on)"
    )
    prefix_cache: bool = True
    cache_idle_cells: int = Field(
        0, ge=0, description="KV cells finished requests may keep for prefix reuse while others run"
    )
    # HTTP.
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535, description="8080 is also SageMaker's port")
    max_queue: int = Field(64, ge=0, description="requests waiting beyond the slots; more get 429")
    request_timeout: float = Field(600.0, gt=0, description="seconds from arrival to the last token")
    max_body: int = Field(4 * MiB, ge=1024, description="request body limit in bytes; more get 413")
    default_max_tokens: int = Field(1024, ge=1, description="max_tokens when a request gives none")
    api_keys: tuple[str, ...] = Field((), repr=False, description="accepted keys; empty = no auth")
    open_paths: tuple[str, ...] = Field(DEFAULT_OPEN_PATHS, description="paths that need no key")
    cors_origins: tuple[str, ...] = Field((), description="allowed CORS origins; empty = CORS off")
    ssl_keyfile: str | None = None
    ssl_certfile: str | None = None
    log_prompts: bool = Field(False, description="put prompt and completion text in the request log")
    reasoning_format: Literal["auto", "none", "deepseek"] = Field(
        "auto", description="auto: <think> text goes to reasoning_content; none: it stays in content"
    )
    embedding_model: str | None = Field(None, description="GGUF for /v1/embeddings; default: the served one")
    webui: bool = Field(True, description="the browser chat page at / (--no-webui: off, / is a 404)")
    grace_period: float = Field(30.0, ge=0, description="seconds SIGTERM waits for in-flight requests")
    sse_keepalive: float = Field(
        15.0, ge=0, description="seconds without an event before a stream gets an SSE comment; 0: never"
    )
    otlp_endpoint: str | None = Field(
        None,
        description="OTLP/HTTP collector URL that receives spans, e.g. http://127.0.0.1:4318; default: off",
    )

    @field_validator("model_path", "embedding_model", "ssl_keyfile", "ssl_certfile")
    @classmethod
    def _file_exists(cls, path: str | None) -> str | None:
        if path is not None and not os.path.isfile(path):
            raise ValueError(f"file not found: {path}")
        return path

    @field_validator("api_keys")
    @classmethod
    def _keys_not_blank(cls, keys: tuple[str, ...]) -> tuple[str, ...]:
        if any(not k.strip() for k in keys):
            raise ValueError("an API key is empty: give non-blank keys with --api-key / --api-key-file")
        return tuple(k.strip() for k in keys)

    @model_validator(mode="after")
    def _tls_pair(self) -> ServerConfig:
        if (self.ssl_keyfile is None) != (self.ssl_certfile is None):
            raise ValueError("TLS needs both --ssl-keyfile and --ssl-certfile")
        if isinstance(self.parallel, int) and self.batch_size < self.parallel:
            raise ValueError(
                f"--batch-size ({self.batch_size}) must be at least --parallel ({self.parallel}): "
                "every busy slot decodes one token per step"
            )
        return self

    @property
    def served_model_id(self) -> str:
        return self.model_id or Path(self.model_path).stem

    @property
    def tls(self) -> bool:
        return self.ssl_certfile is not None

    def engine_config(self) -> EngineConfig:
        """The engine's config; "auto" values not sized yet (see sized_config)
        fall back to 4 slots, the trained context (at most 8192) and every usable core."""
        options: dict[str, Any] = {
            "model_path": self.model_path,
            "n_ctx": self.ctx_size if isinstance(self.ctx_size, int) else 0,
            "n_batch": self.batch_size,
            "n_ubatch": self.ubatch_size,
            "n_seq_max": self.parallel if isinstance(self.parallel, int) else 4,
            "n_gpu_layers": self.n_gpu_layers,
            "split_mode": self.split_mode,
            "flash_attn": self.flash_attn,
            "repack": self.repack,
            "kv_unified": self.kv_unified,
            "chat_template": self.chat_template,
        }
        if isinstance(self.threads, int):
            options["n_threads"] = self.threads
        return EngineConfig.model_validate(options)


def _read_text(path: str, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read {what} {path}: {exc.strerror}") from exc


def read_api_keys(path: str) -> tuple[str, ...]:
    """One key per line; blank lines and lines starting with '#' are skipped."""
    lines = _read_text(path, "API key file").splitlines()
    keys = tuple(s for s in (line.strip() for line in lines) if s and not s.startswith("#"))
    if not keys:
        raise ValueError(f"the API key file {path} holds no keys")
    return keys


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
        flash_attn=resolve_flash_attn(config.flash_attn, config.n_gpu_layers),
        kv_unified=config.kv_unified,
        check_memory=config.n_gpu_layers == 0,
    )
    plan = size_for_model(config.model_path, asked)
    update = {"parallel": plan.slots, "ctx_size": plan.n_ctx, "threads": plan.threads}
    return config.model_copy(update=update), plan


def build_server_config(
    options: dict[str, Any], api_key_file: str | None = None, chat_template_file: str | None = None
) -> ServerConfig:
    """ServerConfig from explicit options (None = not given: the field's default)."""
    merged = {k: v for k, v in options.items() if v is not None}
    if api_key_file:
        merged["api_keys"] = (*merged.get("api_keys", ()), *read_api_keys(api_key_file))
    if chat_template_file:
        merged["chat_template"] = _read_text(chat_template_file, "chat template")
    return ServerConfig.model_validate(merged)
