"""benchmarks/serve/'s several-models scenario (issue 43 item 5), `--scenarios models`:

- cold vs warm: one `outpost serve --models-dir` over the two `--pair` models; every round, each
  model in turn (the order rotated): POST /models/unload, one streamed request (its TTFT includes
  the load: cold), one more (warm), then the load alone timed (unload, then Ollama's empty request,
  POST /api/generate with the model alone, which answers once it is loaded). The other model stays
  loaded meanwhile.
- two models at once: `--models-levels` total streams split evenly over the two models, against that
  Outpost (both models in one process) and against two llama-server processes (one per model, each
  on its own port), all three processes up from the start, pinned to the same `--cpus`; the same
  prompts for both setups, the order rotated every round; warmup requests first (both models at
  once), then the measured ones. Threads: each model gets `-t` threads in either setup (Outpost
  sizes every model of a pool with the server's -t; each llama-server gets the same -t), so both
  setups run 2 x -t threads when both models decode.

Run through serve.py:  python -m benchmarks.serve --scenarios models [--pair A.gguf,B.gguf] ...
"""

from __future__ import annotations

import argparse
import asyncio
import io
import sys
import time
from contextlib import AsyncExitStack, ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness.common import log, weight_layout
from benchmarks.harness.ports import free_port
from benchmarks.harness.servers import ServerProcess, ServerSpec, Setup, eog_tokens, server_spec
from benchmarks.serve.models_report import PAIR, POOL, ColdSample, ModelsReport, MultiRun, split_streams
from benchmarks.serve.scenarios import base_config, check_alive, requests_at, rotate
from outpost.bench.config import BenchConfig, ServerTarget
from outpost.bench.progress import Progress
from outpost.bench.prompts import Prompt, PromptBuilder, build_prompts
from outpost.bench.records import RequestRecord, RunResult
from outpost.bench.runner import Connected, connect, prompt_builder, run_level


class SharedProgress(Progress):
    """One bar for the runs of several models at once: each `start` adds its requests to the total,
    only the last `finish` ends the line."""

    def __init__(self, runs: int) -> None:
        super().__init__()
        self.runs, self.started, self.finished = runs, 0, 0

    def start(self, label: str, total: int, duration: float | None) -> None:
        self.started += 1
        if self.started == 1:
            super().start(label.rsplit(" ", 1)[-1], total, duration)
        else:
            self.total += total

    def finish(self) -> None:
        self.finished += 1
        if self.finished == self.runs:
            super().finish()


def models_dir(pair: dict[str, Path], out: Path) -> Path:
    """OUT/models/NAME.gguf links to the pair: what `--models-dir` reads (names are file stems)."""
    folder = out / "models"
    folder.mkdir(parents=True, exist_ok=True)
    for name, path in pair.items():
        link = folder / f"{name}.gguf"
        link.unlink(missing_ok=True)
        link.symlink_to(path.resolve())
    return folder


def flash_attn(fa: str) -> list[str]:
    """`-fa` for every process alike (both take it), or none with "auto": each picks its own (llama-
    server's auto is on on CPUs; Outpost's is its kernel probe's answer, off on a busy machine)."""
    return [] if fa == "auto" else ["-fa", fa]


def pool_spec(folder: Path, pair: dict[str, Path], setup: Setup, port: int, fa: str) -> ServerSpec:
    """`outpost serve --models-dir` with every model loadable at once (--models-max = their count)."""
    pin = ["taskset", "-c", setup.cpus] if setup.cpus else []
    argv = [sys.executable, "-m", "outpost.cli", "serve", "--models-dir", str(folder)]
    argv += ["--models-max", str(len(pair)), "-t", str(setup.threads), "-np", str(setup.parallel)]
    argv += ["-c", str(setup.ctx), "--port", str(port), *flash_attn(fa)]
    layouts = {name: weight_layout(path, setup.parallel) for name, path in pair.items()}
    layout = ", ".join(f"{n}: {v}" for n, v in layouts.items())
    return ServerSpec("outpost", pin + argv, layout, ["each model sized alone with the server's -t"])


def start_setups(
    stack: ExitStack, pair: dict[str, Path], setup: Setup, out: Path, fa: str, report: ModelsReport
) -> tuple[ServerProcess, dict[str, ServerProcess]]:
    """The Outpost over both models, and one llama-server per model where LLAMA_SERVER is set."""
    port = free_port()
    spec = pool_spec(models_dir(pair, out), pair, setup, port, fa)
    pool = stack.enter_context(ServerProcess(spec, port, out / "logs" / "outpost-models.log"))
    report.servers[POOL] = [spec.describe()]
    singles: dict[str, ServerProcess] = {}
    if setup.llama_server:
        for name, path in pair.items():
            one = Setup(path, setup.threads, setup.parallel, setup.cpus, setup.llama_server)
            port = free_port()
            base = server_spec("llama_server", one, port)
            spec = replace(base, argv=[*base.argv, *flash_attn(fa)])
            log_path = out / "logs" / f"llama-server-{name}.log"
            singles[name] = stack.enter_context(ServerProcess(spec, port, log_path))
        report.servers[PAIR] = [p.spec.describe() for p in singles.values()]
    return pool, singles


async def _status(client: httpx.AsyncClient, model: str) -> str | None:
    cards = (await client.get("/v1/models")).json()["data"]
    return next((c.get("status", {}).get("value") for c in cards if c["id"] == model), None)


async def unload(client: httpx.AsyncClient, model: str) -> None:
    if await _status(client, model) == "loaded":
        r = await client.post("/models/unload", json={"model": model})
        r.raise_for_status()


async def timed_load(client: httpx.AsyncClient, model: str, timeout: float) -> float | None:
    """Seconds an empty Ollama request takes (POST /api/generate with the model alone: it answers once
    the model is loaded), after an unload; None where it did not load."""
    await unload(client, model)
    t0 = time.monotonic()
    r = await client.post("/api/generate", json={"model": model}, timeout=timeout)
    took = time.monotonic() - t0
    return took if r.status_code == 200 and await _status(client, model) == "loaded" else None


async def _one(conn: Connected, config: BenchConfig, prompt: Prompt) -> RequestRecord:
    run = await run_level(conn, config, 0, 1, [prompt], [], Progress())
    return run.records[0]


async def cold_warm(
    conns: dict[str, Connected], configs: dict[str, BenchConfig], prompts: dict[str, list[Prompt]], r: int
) -> list[ColdSample]:
    """Round `r`: each model unloaded, asked (cold), asked again (warm), its load timed."""
    samples = []
    for pos, model in enumerate(rotate(list(conns), r)):
        conn, config = conns[model], configs[model]
        log(f"cold/warm round {r + 1}: {model} unloaded, then two requests")
        await unload(conn.client, model)
        cold = await _one(conn, config, prompts[model][0])
        warm = await _one(conn, config, prompts[model][1])
        load_s = await timed_load(conn.client, model, config.timeout)
        samples.append(ColdSample(model, r, pos, cold, warm, load_s))
    return samples


async def at_once(
    conns: dict[str, Connected],
    configs: dict[str, BenchConfig],
    li: int,
    split: dict[str, int],
    prompts: dict[str, tuple[list[Prompt], list[Prompt]]],
) -> dict[str, RunResult]:
    """Both models' warmups at once (dropped), then their measured requests at once."""
    quiet = Progress(io.StringIO())
    await asyncio.gather(
        *(run_level(conns[m], configs[m], li, split[m], prompts[m][1], [], quiet) for m in conns)
    )
    shared = SharedProgress(len(conns))
    runs = await asyncio.gather(
        *(run_level(conns[m], configs[m], li, split[m], prompts[m][0], [], shared) for m in conns)
    )
    return dict(zip(conns, runs, strict=True))


async def _prompts(
    builders: dict[str, PromptBuilder], configs: dict[str, BenchConfig], seed: str, n: int, w: int
) -> dict[str, tuple[list[Prompt], list[Prompt]]]:
    """(measured, warmup) prompts per model: `n` and `w` in all, shared out as the streams are."""
    models = list(builders)
    ns, ws = split_streams(n, models), split_streams(w, models)
    out = {}
    for m, b in builders.items():
        scenario = configs[m].scenario
        measured = await build_prompts(b, scenario, f"{seed}:{m}", ns[m])
        out[m] = (measured, await build_prompts(b, scenario, f"{seed}:{m}:warmup", ws[m]))
    return out


async def _connect(
    urls: dict[str, str], label: str, configs: dict[str, BenchConfig], stack: AsyncExitStack
) -> dict[str, Connected]:
    return {m: await connect(ServerTarget(url, label, m), configs[m], stack) for m, url in urls.items()}


async def multi_rounds(
    setups: dict[str, dict[str, Connected]],
    procs: dict[str, list[ServerProcess]],
    builders: dict[str, PromptBuilder],
    configs: dict[str, BenchConfig],
    args: argparse.Namespace,
    out: list[MultiRun],
) -> None:
    """Every round, every stream count, each setup in the round's rotated order, the same prompts;
    each run appended to `out` as it ends (an interrupted run keeps what it measured)."""
    for r in range(args.rounds):
        for li, streams in enumerate(args.models_levels):
            split = split_streams(streams, list(configs))
            n, w = requests_at(args, streams)
            prompts = await _prompts(builders, configs, f"{args.seed}:models:r{r}:c{streams}", n, w)
            order = rotate(list(setups), r)
            log(f"\ntwo models, round {r + 1}/{args.rounds}, {streams} streams {split}: {', '.join(order)}")
            for pos, label in enumerate(order):
                runs = await at_once(setups[label], configs, li, split, prompts)
                out.append(MultiRun(label, streams, r, pos, runs))
                for proc in procs[label]:
                    check_alive(proc)


async def drive(
    pool: ServerProcess,
    singles: dict[str, ServerProcess],
    configs: dict[str, BenchConfig],
    args: argparse.Namespace,
    report: ModelsReport,
) -> None:
    """Cold/warm rounds on the Outpost, then the two-models rounds on both setups."""
    async with AsyncExitStack() as stack:
        ours = await _connect(dict.fromkeys(configs, pool.url), POOL, configs, stack)
        setups, procs = {POOL: ours}, {POOL: [pool]}
        if singles:
            setups[PAIR] = await _connect({m: p.url for m, p in singles.items()}, PAIR, configs, stack)
            procs[PAIR] = list(singles.values())
        builders = {m: (await prompt_builder(c, configs[m]))[0] for m, c in ours.items()}
        for r in range(args.rounds):
            seed = f"{args.seed}:models:cold:r{r}"
            cold = await _prompts(builders, configs, seed, 2 * len(configs), 0)
            report.cold += await cold_warm(ours, configs, {m: p[0] for m, p in cold.items()}, r)
        await multi_rounds(setups, procs, builders, configs, args, report.multi)


def model_configs(pair: dict[str, Path], args: argparse.Namespace) -> dict[str, BenchConfig]:
    """One config per model: its own end-of-generation ids banned, so every stream runs to max_tokens."""
    configs = {}
    for name, path in pair.items():
        extra: dict[str, Any] = {"temperature": 0.8, "logit_bias": {str(t): -100 for t in eog_tokens(path)}}
        configs[name] = base_config([], args.models_levels, "custom", args, extra)
    return configs


def run_models(pair: dict[str, Path], setup: Setup, args: argparse.Namespace, report: ModelsReport) -> None:
    """The scenario, its servers stopped however it ends; fills `report`."""
    configs = model_configs(pair, args)
    with ExitStack() as stack:
        pool, singles = start_setups(stack, pair, setup, args.out, args.models_fa, report)
        if not singles:
            report.notes.append("LLAMA_SERVER is not set: the two-models rounds ran on Outpost alone")
        asyncio.run(drive(pool, singles, configs, args, report))
