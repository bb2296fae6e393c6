"""What a benchmark is asked to do: servers, load plan, token-length distributions, scenario presets.

Owns the typed inputs every other `outpost.bench` module reads (frozen dataclasses) and the parsing
of the command line's compact forms (`1,4,8`, `MEAN[,STD]`). Bad input raises `BenchUsageError`, a
`ValueError`, which the CLI reports on one line with exit status 2.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

Mode = Literal["concurrency", "rate"]
Endpoint = Literal["chat", "completions"]


class BenchUsageError(ValueError):
    """Bad benchmark input. A ValueError so `outpost.cli.main` maps it to exit 2 without this package
    importing `outpost.run` (which loads the engine: the benchmark must work against any server)."""


@dataclass(frozen=True)
class TokenDist:
    """A token-count distribution: normal(mean, std) or uniform[low, high], never below 1."""

    mean: float
    std: float = 0.0
    low: int | None = None
    high: int | None = None

    def sample(self, rng: random.Random) -> int:
        if self.low is not None and self.high is not None:
            return rng.randint(self.low, self.high)
        value = rng.gauss(self.mean, self.std) if self.std > 0 else self.mean
        return max(1, round(value))

    @classmethod
    def uniform(cls, low: int, high: int) -> TokenDist:
        return cls(mean=(low + high) / 2, low=low, high=high)

    @classmethod
    def parse(cls, text: str, flag: str) -> TokenDist:
        """`MEAN` or `MEAN,STDDEV` (tokens)."""
        parts = [p.strip() for p in text.split(",")]
        try:
            values = [float(p) for p in parts]
        except ValueError:
            raise BenchUsageError(f"{flag} takes MEAN[,STDDEV] in tokens, got {text!r}") from None
        if len(values) > 2 or values[0] < 1 or (len(values) == 2 and values[1] < 0):
            raise BenchUsageError(f"{flag} takes MEAN[,STDDEV] with MEAN >= 1 and STDDEV >= 0, got {text!r}")
        return cls(mean=values[0], std=values[1] if len(values) == 2 else 0.0)


@dataclass(frozen=True)
class Scenario:
    """A workload preset. `input_tokens` counts the user text including `instruction`; a shared prefix
    (a system prompt common to every request of a level) comes on top."""

    name: str
    input_tokens: TokenDist
    output_tokens: TokenDist
    instruction: str = ""
    shared_prefix_tokens: int = 0


SCENARIOS: dict[str, Scenario] = {
    "chat": Scenario("chat", TokenDist.uniform(50, 150), TokenDist.uniform(100, 300)),
    "summarize": Scenario(
        "summarize", TokenDist(1000), TokenDist(200), instruction="Summarize the following text:\n\n"
    ),
    # A ~500-token system prompt common to all requests of a level, short user turns: measures
    # how much a server gains from caching the prefix.
    "shared-prefix": Scenario(
        "shared-prefix", TokenDist.uniform(20, 60), TokenDist.uniform(50, 150), shared_prefix_tokens=500
    ),
    "custom": Scenario("custom", TokenDist(128), TokenDist(128)),
}


def make_scenario(name: str, input_tokens: str | None, output_tokens: str | None) -> Scenario:
    """The preset `name`, with `--input-tokens` / `--output-tokens` overriding its distributions."""
    if name not in SCENARIOS:
        raise BenchUsageError(f"unknown scenario {name!r}; choose one of: {', '.join(SCENARIOS)}")
    base = SCENARIOS[name]
    return replace(
        base,
        input_tokens=TokenDist.parse(input_tokens, "--input-tokens") if input_tokens else base.input_tokens,
        output_tokens=TokenDist.parse(output_tokens, "--output-tokens")
        if output_tokens
        else base.output_tokens,
    )


@dataclass(frozen=True)
class ServerTarget:
    """One server under test. `model` None: the first id its `/v1/models` lists."""

    url: str
    label: str
    model: str | None = None


def make_targets(url: str, compare: list[str], model: str | None) -> tuple[ServerTarget, ...]:
    urls = [check_url(u) for u in [url, *compare]]
    if len(set(urls)) != len(urls):
        raise BenchUsageError("--url and --compare must name different servers")
    # host:port reads best in tables and legends; the full URL only where two would collide
    short = [urlsplit(u).netloc + urlsplit(u).path for u in urls]
    if len(set(short)) != len(short):  # labels key tables and legends: they must differ
        short = urls
    return tuple(ServerTarget(url=u, label=s, model=model) for u, s in zip(urls, short, strict=True))


def check_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise BenchUsageError(f"not an http(s) base URL: {url!r} (e.g. http://127.0.0.1:8080)")
    return url.rstrip("/").removesuffix("/v1")


@dataclass(frozen=True)
class LoadPlan:
    """How load is applied at each level. A level ends after `requests` requests or `duration`
    seconds, whichever comes first; `cap(level)` bounds every level and sizes its prompt pool.
    `ramp_up` (closed loop): the users start one by one, evenly over that many seconds, instead of
    all at once (JMeter's ramp-up period, Locust's spawn rate), so their requests do not stay in step."""

    mode: Mode
    levels: tuple[float, ...]
    requests: int | None
    duration: float | None
    warmup: int
    ramp_up: float = 0.0

    def cap(self, level: float) -> int:
        """`--requests`, else for --duration: 1.5x the expected Poisson arrivals (open loop) or two
        requests per user per second (closed loop), which real LLM requests rarely beat."""
        if self.requests is not None:
            return self.requests
        assert self.duration is not None
        expected = level * self.duration * (1.5 if self.mode == "rate" else 2.0)
        return min(100_000, math.ceil(expected) + 16)


def parse_levels(text: str, flag: str, integer: bool) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise BenchUsageError(f"{flag} takes a comma-separated list of numbers, got {text!r}") from None
    if not values or any(v <= 0 or math.isinf(v) for v in values):
        raise BenchUsageError(f"{flag} values must be positive, got {text!r}")
    if integer and any(v != int(v) for v in values):
        raise BenchUsageError(f"{flag} takes whole numbers of concurrent requests, got {text!r}")
    return values


def make_plan(
    concurrency: str | None,
    rate: str | None,
    requests: int | None,
    duration: float | None,
    warmup: int,
    ramp_up: float = 0.0,
) -> LoadPlan:
    if concurrency and rate:
        raise BenchUsageError("give --concurrency (closed loop) or --rate (open loop), not both")
    if requests is not None and requests < 1:
        raise BenchUsageError("--requests must be at least 1")
    if duration is not None and duration <= 0:
        raise BenchUsageError("--duration must be positive seconds")
    if warmup < 0:
        raise BenchUsageError("--warmup must be 0 or more")
    if not 0 <= ramp_up < math.inf:
        raise BenchUsageError("--ramp-up must be 0 or more seconds")
    if ramp_up and rate:
        raise BenchUsageError("--ramp-up is for closed-loop users (--concurrency), not --rate")
    mode: Mode = "rate" if rate else "concurrency"
    levels = parse_levels(rate or concurrency or "1", f"--{mode}", integer=mode == "concurrency")
    if requests is None and duration is None:
        requests = 32
    return LoadPlan(mode, levels, requests, duration, warmup, ramp_up)


@dataclass(frozen=True)
class BenchConfig:
    """Everything one benchmark run needs; the runner reads nothing else."""

    targets: tuple[ServerTarget, ...]
    plan: LoadPlan
    scenario: Scenario
    endpoint: Endpoint = "chat"
    api_key: str | None = None
    seed: int = 0
    timeout: float = 300.0
    prompt_file: Path | None = None
    # Body fields every request carries (e.g. temperature, logit_bias); the benchmark's own win.
    extra_body: Mapping[str, Any] = field(default_factory=dict)
