"""`HttpSettings`: the HTTP side of `outpost serve` and `outpost gateway` (address, TLS, keys, CORS, limits).

To add an HTTP flag, add one field here with `setting(...)` (outpost/settings/fields.py): both
commands get the flag, its `OUTPOST_<LONG_FLAG>` variable and its `--help` line; the API reads it as
`state.config.<field>`. API keys (--api-key, --api-key-file) and CORS origins are parsed here, once.
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import Field, field_validator, model_validator

from outpost.settings.fields import Block, comma_list, existing_file, read_text, setting

MiB = 1024 * 1024
# Paths anyone may call, even when API keys are set: health checks and scrapers carry no keys.
DEFAULT_OPEN_PATHS: tuple[str, ...] = ("/health", "/v1/health", "/ping", "/metrics")


def read_api_keys(path: str) -> tuple[str, ...]:
    """One key per line; blank lines and lines starting with '#' are skipped."""
    lines = read_text(path, "API key file").splitlines()
    keys = tuple(s for s in (line.strip() for line in lines) if s and not s.startswith("#"))
    if not keys:
        raise ValueError(f"the API key file {path} holds no keys")
    return keys


class HttpSettings(Block):
    """How the OpenAI-compatible API listens and what it accepts; defaults follow llama-server."""

    host: str = setting(
        "127.0.0.1", "--host", help="address to bind, or several comma-separated (default 127.0.0.1)"
    )
    port: int = setting(8080, "--port", help="port (default 8080, SageMaker's)", parse=int, ge=0, le=65535)
    api_keys: tuple[str, ...] = setting(
        (), "--api-key", help="accepted API key (repeatable)", action="append", repr=False
    )
    api_key_file: str | None = setting(None, "--api-key-file", help="file with one API key per line")
    request_timeout: float = setting(
        600.0,
        "--request-timeout",
        help="seconds from arrival to last token (default 600)",
        parse=float,
        gt=0,
    )
    max_body: int = setting(
        4 * MiB, "--max-body", help="request body limit in bytes (default 4 MiB)", parse=int, ge=1024
    )
    default_max_tokens: int = setting(
        1024,
        "--default-max-tokens",
        help="max_tokens when a request gives none (1024)",
        parse=int,
        ge=1,
    )
    ssl_keyfile: str | None = setting(None, "--ssl-keyfile", help="TLS private key (PEM)")
    ssl_certfile: str | None = setting(None, "--ssl-certfile", help="TLS certificate (PEM)")
    cors_origins: tuple[str, ...] = setting(
        ("*",),
        "--cors-origins",
        help="comma-separated allowed origins (exact scheme://host[:port]); localhost: any scheme and "
        "port on localhost, 127.0.0.1 or [::1]; * (default, as llama-server: any origin); none: CORS off",
        parse=comma_list,
    )
    log_prompts: bool = setting(
        False, "--log-prompts", help="log prompt and answer text", action="store_true"
    )
    reasoning_format: Literal["auto", "none", "deepseek"] = setting(
        "auto",
        "--reasoning-format",
        help="auto (default): <think> text goes to reasoning_content; none: it stays in content",
        choices=("auto", "none", "deepseek"),
    )
    reasoning: Literal["auto", "on", "off"] = setting(
        "auto",
        "-rea",
        "--reasoning",
        help="thinking in templates that offer it: auto/on (default: enable_thinking true, as "
        "llama-server) or off (enable_thinking false); a request's chat_template_kwargs wins",
        choices=("auto", "on", "off"),
    )
    temp: float | None = setting(
        None,
        "--temp",
        help="temperature for requests that set none (default 0.8, llama-server's)",
        parse=float,
        ge=0.0,
    )
    seed: int | None = setting(
        None, "-s", "--seed", help="sampling seed for requests that set none (default: random)", parse=int
    )
    n_predict: int = setting(
        -1,
        "-n",
        "--n-predict",
        help="server-wide output cap, as llama-server's: the budget of requests that set none and the "
        "most any request gets (default -1: no cap)",
        parse=int,
        ge=-1,
    )
    metrics: bool = setting(
        False,
        "--metrics",
        help="accepted: /metrics is always on (outpost_* and llama-server's llamacpp:* series)",
        action="store_true",
    )
    slots: bool = setting(
        True, "--slots", help="the /slots monitoring endpoint (llama-server's; default on)", action="switch"
    )
    props: bool = setting(
        False,
        "--props",
        help="accept POST /props (llama-server's; it changes no setting there either, answers success)",
        action="store_true",
    )
    webui: bool = setting(True, "--no-webui", help="no chat page at / (404)", action="store_false")
    grace_period: float = setting(
        30.0,
        "--grace-period",
        help="seconds SIGTERM waits for in-flight requests (30)",
        parse=float,
        ge=0,
    )
    sse_keepalive: float = setting(
        15.0,
        "--sse-keepalive",
        help="seconds a stream may go without an event before a `: keep-alive` comment is sent, so "
        "proxies keep queued and prefilling streams open (default 15; 0: never)",
        parse=float,
        ge=0,
    )
    responses_max: int = setting(
        1000,
        "--responses-max",
        help="finished /v1/responses kept in memory for previous_response_id, the least recently "
        "used dropped first (default 1000; 0: none)",
        parse=int,
        ge=0,
    )
    responses_ttl: float = setting(
        3600.0,
        "--responses-ttl",
        help="seconds a finished /v1/responses is kept for previous_response_id (default 3600)",
        parse=float,
        gt=0,
    )
    open_paths: tuple[str, ...] = Field(DEFAULT_OPEN_PATHS, description="paths that need no key")

    @model_validator(mode="before")
    @classmethod
    def _keys_from_file(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("api_key_file"):
            data = {**data, "api_keys": (*data.get("api_keys", ()), *read_api_keys(data["api_key_file"]))}
        return data

    @field_validator("ssl_keyfile", "ssl_certfile")
    @classmethod
    def _file_exists(cls, path: str | None) -> str | None:
        return existing_file(path)

    @field_validator("api_keys")
    @classmethod
    def _keys_not_blank(cls, keys: tuple[str, ...]) -> tuple[str, ...]:
        if any(not k.strip() for k in keys):
            raise ValueError("an API key is empty: give non-blank keys with --api-key / --api-key-file")
        return tuple(k.strip() for k in keys)

    @model_validator(mode="after")
    def _tls_pair(self) -> Self:
        if (self.ssl_keyfile is None) != (self.ssl_certfile is None):
            raise ValueError("TLS needs both --ssl-keyfile and --ssl-certfile")
        return self

    @property
    def hosts(self) -> tuple[str, ...]:
        """--host's addresses (llama-server's `127.0.0.1,::1`), brackets off IPv6 literals."""
        return tuple(h.strip("[]") for h in comma_list(self.host)) or ("127.0.0.1",)

    @property
    def tls(self) -> bool:
        return self.ssl_certfile is not None
