"""Server benchmark: `outpost serve` vs llama-cpp-python's server vs llama.cpp's `llama-server`.

Not a test. Run:  python benchmarks/serve.py [--shape smollm2-135m] [--threads 2] [--requests 32]
Optional baseline: LLAMA_SERVER=/path/to/llama-server (../shared/tools/build-llama-cpp.sh builds it).
llama-cpp-python's server needs its extras: pip install -e ".[bench]".

Same synthetic GGUF (q4_0, written once under $OUTPOST_HOME/bench/), same threads, one server at a
time on a free loopback port. The chat workload: distinct ~130-token prompts, 128 output tokens
(EOS banned), streamed; at 1, 4 and 8 concurrent streams, `--requests` requests per level after a
warmup. Per level: output tokens/s (all streams' tokens / wall time), time to first token and
inter-token latency percentiles, errors (HTTP errors, streams without finish/[DONE], streams cut
off before max_tokens). Table to stderr; the last stdout line is one JSON object:
{"outpost": {"1": {...}, "4": {...}, "8": {...}}, "llama_cpp_python": {...}, "llama_server": {...}}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from common import bench_model, log, same_weight_layout_for_llama_cpp_python

from outpost.engine.config import EngineConfig, available_cpus

LEVELS = (1, 4, 8)
LCP_WORKER = "--llama-cpp-python-server"
WORDS = (
    "river stone lantern orchard copper meadow harbor signal winter garden pilot ledger canyon "
    "thunder violet engine marble forest quiet rapid silver market bridge candle desert falcon"
).split()


def eog_tokens(model: Path) -> list[int]:
    """Every end-of-generation id: the workload bans them all so each stream runs to max_tokens."""
    from outpost.engine.config import EngineConfig
    from outpost.engine.model import LoadedModel

    loaded = LoadedModel(EngineConfig(model_path=str(model), n_ctx=256, n_seq_max=1))
    try:
        return sorted(loaded.vocab.eog_ids)
    finally:
        loaded.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_command(kind: str, model: Path, threads: int, port: int, parallel: int) -> list[str]:
    """The same GGUF, threads and weight layout for every server; outpost and llama-server get the
    same slots and KV cells."""
    m, t, p, ctx = str(model), str(threads), str(port), str(1024 * parallel)
    if kind == "outpost":
        opts = f"serve -m {m} -t {t} -np {parallel} -c {ctx} --port {p}"
        return [sys.executable, "-m", "outpost.cli", *opts.split()]
    if kind == "llama_cpp_python":
        opts = f"--model {m} --n_threads {t} --n_threads_batch {t} --n_ctx 2048 --host 127.0.0.1 --port {p}"
        return [sys.executable, __file__, LCP_WORKER, *opts.split(), "--verbose", "False"]
    repack = [] if EngineConfig(model_path=m).use_extra_bufts else ["--no-repack"]
    opts = f"-m {m} -t {t} -tb {t} -np {parallel} -c {ctx} --host 127.0.0.1 --port {p}"
    return [os.environ["LLAMA_SERVER"], *opts.split(), *repack]


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            models = httpx.get(f"{url}/v1/models", timeout=2).status_code
            health = httpx.get(f"{url}/health", timeout=2).status_code  # 404 where there is none
            if models == 200 and health != 503:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise TimeoutError(f"{url} not ready in {timeout} s")


def make_prompt(rng: random.Random, n_words: int) -> list[dict[str, str]]:
    tag = f"{rng.getrandbits(48):012x}"  # distinct from the first token: no prefix reuse between requests
    words = " ".join(rng.choice(WORDS) for _ in range(n_words))
    return [{"role": "user", "content": f"[{tag}] Summarise these notes in detail: {words}"}]


@dataclass
class Result:
    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)
    tokens: int = 0
    error: str | None = None


async def one_request(client: httpx.AsyncClient, body: dict[str, Any], max_tokens: int) -> Result:
    res = Result()
    start = last = time.perf_counter()
    done = False
    finish: str | None = None
    usage_tokens: int | None = None
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    break
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    res.error = "stream error"
                    return res
                if chunk.get("usage"):
                    usage_tokens = chunk["usage"].get("completion_tokens")
                for choice in chunk.get("choices") or []:
                    if (choice.get("delta") or {}).get("content"):
                        now = time.perf_counter()
                        if res.ttft is None:
                            res.ttft = now - start
                        else:
                            res.gaps.append(now - last)
                        last = now
                        res.tokens += 1
                    finish = finish or choice.get("finish_reason")
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        res.error = type(exc).__name__
        return res
    res.tokens = usage_tokens if usage_tokens is not None else res.tokens
    if not (finish and done):
        res.error = "stream ended without finish_reason/[DONE]"
    elif finish != "length" and res.tokens < max_tokens:  # EOS is banned: a short stop is a cut-off
        res.error = f"cut off after {res.tokens} tokens"
    return res


async def run_level(
    url: str, bodies: list[dict[str, Any]], concurrency: int, max_tokens: int
) -> dict[str, Any]:
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)
    results: list[Result] = []
    limits = httpx.Limits(max_connections=concurrency + 2)

    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(600.0), limits=limits) as client:

        async def worker() -> None:
            while not queue.empty():
                results.append(await one_request(client, queue.get_nowait(), max_tokens))

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return summarise(results, wall)


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarise(results: list[Result], wall: float) -> dict[str, Any]:
    ttfts = [r.ttft for r in results if r.ttft is not None]
    gaps = [g for r in results for g in r.gaps]
    errors = [r.error for r in results if r.error]
    return {
        "requests": len(results),
        "output_tok_s": sum(r.tokens for r in results) / wall,
        "ttft_s": {"p50": pct(ttfts, 0.5), "p90": pct(ttfts, 0.9)},
        "itl_s": {"p50": pct(gaps, 0.5), "p90": pct(gaps, 0.9)},
        "errors": len(errors),
        "error_kinds": sorted(set(errors))[:5],
        "wall_s": wall,
    }


def chat_body(messages: list[dict[str, str]], max_tokens: int, eog: list[int]) -> dict[str, Any]:
    body: dict[str, Any] = {
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": True,
        "temperature": 0.8,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    if eog:
        body["logit_bias"] = {str(t): -100 for t in eog}
    return body


def bench_server(kind: str, model: Path, args: argparse.Namespace, rng: random.Random) -> dict[str, Any]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    eog = eog_tokens(model)
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            server_command(kind, model, args.threads, port, args.parallel),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        try:
            wait_ready(url, proc)
            log(f"[{kind}] ready on {url}; warming up")
            warm = [chat_body(make_prompt(rng, args.prompt_words), 16, eog) for _ in range(4)]
            asyncio.run(run_level(url, warm, 2, 16))
            out: dict[str, Any] = {}
            for level in args.levels:
                bodies = [
                    chat_body(make_prompt(rng, args.prompt_words), args.max_tokens, eog)
                    for _ in range(args.requests)
                ]
                out[str(level)] = asyncio.run(run_level(url, bodies, level, args.max_tokens))
                log(f"[{kind}] {level:>2} streams: " + fmt_row(out[str(level)]))
            return out
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def fmt_row(r: dict[str, Any]) -> str:
    def ms(v: float | None) -> str:
        return f"{v * 1000:7.0f}" if v is not None else "      -"

    return (
        f"{r['output_tok_s']:7.1f} tok/s  ttft p50/p90 {ms(r['ttft_s']['p50'])}/{ms(r['ttft_s']['p90'])} ms  "
        f"itl p50/p90 {ms(r['itl_s']['p50'])}/{ms(r['itl_s']['p90'])} ms  errors {r['errors']}"
    )


def print_table(report: dict[str, Any], levels: list[int]) -> None:
    log("")
    log(f"{'server':<18}{'streams':>8}  result")
    for kind, per_level in report.items():
        if per_level is None:
            log(f"{kind:<18}{'-':>8}  (not run)")
            continue
        for level in levels:
            log(f"{kind:<18}{level:>8}  {fmt_row(per_level[str(level)])}")
    ours, theirs = report.get("outpost"), report.get("llama_server")
    if ours and theirs:
        for level in levels:
            a, b = ours[str(level)], theirs[str(level)]
            ttft = (a["ttft_s"]["p50"] or 0) / (b["ttft_s"]["p50"] or float("inf"))
            log(
                f"outpost / llama-server at {level}: tok/s x{a['output_tok_s'] / b['output_tok_s']:.2f}, "
                f"p50 TTFT x{ttft:.2f}"
            )


def have_llama_cpp_server() -> bool:
    try:
        import llama_cpp.server.app  # noqa: F401
    except ImportError as exc:
        log(f"llama-cpp-python's server is not installed ({exc}); pip install -e '.[bench]' to include it")
        return False
    return True


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--shape", default="smollm2-135m")
    p.add_argument("--quant", default="q4_0")
    p.add_argument("--threads", type=int, default=available_cpus())
    p.add_argument("--parallel", type=int, default=8, help="slots for outpost and llama-server")
    p.add_argument("--requests", type=int, default=32, help="requests per concurrency level")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--prompt-words", type=int, default=43, help="~130 prompt tokens with the chat template")
    p.add_argument("--levels", default="1,4,8")
    p.add_argument("--servers", default="outpost,llama_cpp_python,llama_server")
    args = p.parse_args()
    args.levels = [int(x) for x in args.levels.split(",")]
    model = bench_model(args.shape, args.quant)
    rng = random.Random(int(time.time()))  # distinct prompts every run
    report: dict[str, Any] = {}
    for kind in args.servers.split(","):
        skip = (kind == "llama_server" and not os.environ.get("LLAMA_SERVER")) or (
            kind == "llama_cpp_python" and not have_llama_cpp_server()
        )
        report[kind] = None if skip else bench_server(kind, model, args, rng)
    print_table(report, args.levels)
    print(json.dumps(report))


def run_llama_cpp_python_server(argv: list[str]) -> None:
    """`python -m llama_cpp.server ARGV` with the weight layout Outpost uses (see benchmarks/engine.py):
    on AMX CPUs llama.cpp's extra buffer types crash batched decode of quantized weights."""
    import runpy

    use_extra_bufts = EngineConfig.model_validate(
        {"model_path": argv[argv.index("--model") + 1]}
    ).use_extra_bufts
    same_weight_layout_for_llama_cpp_python(use_extra_bufts)
    sys.argv = ["llama_cpp.server", *argv]
    runpy.run_module("llama_cpp.server", run_name="__main__")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == LCP_WORKER:
        run_llama_cpp_python_server(sys.argv[2:])
    else:
        main()
