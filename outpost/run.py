"""`outpost run`: llama-cli's chat workflow on Outpost's engine.

Owns the conversation (history of messages, presets, one-shot vs interactive) and the llama.cpp-style
timing lines. Tokens are streamed to stdout as they arrive; everything else goes to stderr.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from outpost.engine.config import EngineConfig
from outpost.messages import FinishReason, GenerateRequest, SamplingParams, Timings
from outpost.settings import EngineSettings

if TYPE_CHECKING:  # loading llama.cpp is run_command's business, not the CLI's at import
    from outpost.serving.assembly import Engine


class UsageError(Exception):
    """Bad input from the user: the CLI prints the message on one line and exits 2."""


@dataclass(frozen=True)
class Preset:
    system: str | None = None
    n_predict: int | None = None
    ctx_size: int | None = None
    temperature: float | None = None
    user_prefix: str = ""
    stop_on_loop: bool = False  # end an answer that repeats itself (RepeatGuard) before its limit


PRESETS: dict[str, Preset] = {
    "chat": Preset(
        system="You are a helpful assistant", n_predict=512, ctx_size=8192, temperature=0.0, stop_on_loop=True
    ),
    "summarize": Preset(
        system="You are a technical writer",
        n_predict=512,
        user_prefix="Summarize the following text: ",
        stop_on_loop=True,
    ),
}


class RepeatGuard:
    """Spots an answer stuck in a loop: its last tokens are one block of 1..MAX_PERIOD tokens said
    again and again, at least MIN_COPIES times and MIN_SPAN tokens in all (", 2019, 2019, ..." or
    one sentence over and over). Prose does not repeat itself token for token over that span; a
    small model that does will do so until its token limit."""

    MAX_PERIOD = 100
    MIN_COPIES = 3
    MIN_SPAN = 64

    def __init__(self) -> None:
        self.tokens: list[int] = []
        # run[p - 1]: how many of the last tokens equal the token p places before them
        self._run = [0] * self.MAX_PERIOD

    def add(self, token_ids: list[int]) -> bool:
        """Take the next tokens; True once the answer loops."""
        looping = False
        for token in token_ids:
            self.tokens.append(token)
            n = len(self.tokens)
            for p in range(1, min(self.MAX_PERIOD, n - 1) + 1):
                run = self._run[p - 1] + 1 if self.tokens[n - 1 - p] == token else 0
                self._run[p - 1] = run
                span = run + p  # the tail that repeats with period p
                looping |= span >= self.MIN_SPAN and span >= self.MIN_COPIES * p
        return looping


@dataclass
class ChatSession:
    """A multi-turn conversation: every turn re-renders the whole history, and the engine's
    prefix cache makes that cost only the new tokens."""

    engine: Engine
    sampling: SamplingParams
    n_predict: int
    system: str | None = None
    user_prefix: str = ""
    stop_on_loop: bool = False
    out: TextIO = field(default_factory=lambda: sys.stdout)
    err: TextIO = field(default_factory=lambda: sys.stderr)
    messages: list[dict[str, str]] = field(default_factory=list)
    last_finish: FinishReason | None = None  # why the last answer ended
    last_looped: bool = False  # the last answer was stopped by the RepeatGuard
    last_timings: Timings = field(default_factory=Timings)

    def __post_init__(self) -> None:
        if self.system:
            self.messages.append({"role": "system", "content": self.system})

    def ask(self, user_text: str) -> str:
        """Send one user turn, stream the answer, print timings; returns the answer."""
        self.messages.append({"role": "user", "content": self.user_prefix + user_text})
        prompt = self.engine.tokenize_prompt(self.engine.render_chat(self.messages))
        room = self.engine.n_ctx_seq - len(prompt)
        if room < 1:
            self.messages.pop()
            raise UsageError(
                f"prompt is {len(prompt)} tokens but the context holds {self.engine.n_ctx_seq}; "
                "raise -c/--ctx-size or shorten the prompt"
            )
        max_tokens = room if self.n_predict < 0 else min(self.n_predict, room)
        request = GenerateRequest(prompt_tokens=prompt, max_tokens=max_tokens, sampling=self.sampling)
        text = self._stream(request)
        self.messages.append({"role": "assistant", "content": text})
        if self.last_looped:
            self.err.write("[the answer repeats itself: stopped]\n")
        print_timings(self.last_timings, self.err)
        return text

    def _stream(self, request: GenerateRequest) -> str:
        """Write the answer as it comes; abort it once the guard sees a loop (the ABORT event that
        follows still brings the timings)."""
        answer: list[str] = []
        guard = RepeatGuard() if self.stop_on_loop else None
        self.last_looped, self.last_timings = False, Timings()
        for event in self.engine.client.generate_sync(request):
            if event.text and not self.last_looped:
                answer.append(event.text)
                self.out.write(event.text)
                self.out.flush()
            if event.finish_reason is FinishReason.ERROR:
                raise RuntimeError(event.error or "generation failed")
            if event.timings is not None:
                self.last_timings = event.timings
            if event.finish_reason is not None:
                self.last_finish = event.finish_reason
            elif guard is not None and not self.last_looped and guard.add(event.token_ids):
                self.last_looped = True
                self.engine.client.abort(request.request_id)
        self.out.write("\n")
        self.out.flush()
        return "".join(answer)

    def interactive(self, stdin: TextIO) -> None:
        """Read user turns until EOF (Ctrl-D) or /exit."""
        while True:
            self.err.write("\n> ")
            self.err.flush()
            line = stdin.readline()
            if not line or line.strip() in ("/exit", "/quit"):
                return
            if line.strip():
                self.ask(line.rstrip("\n"))


def print_timings(t: Timings, err: TextIO) -> None:
    """The three lines llama.cpp prints after an answer."""

    def line(label: str, ms: float, n: int) -> str:
        per_token = ms / n if n else 0.0
        per_second = n / ms * 1000.0 if ms > 0 else 0.0
        return (
            f"{label} = {ms:10.2f} ms / {n:5d} tokens ({per_token:8.2f} ms per token, "
            f"{per_second:8.2f} tokens per second)"
        )

    err.write(line("prompt eval time", t.prompt_ms, t.prompt_n) + f"  [cached: {t.cache_n}]\n")
    err.write(line("       eval time", t.predicted_ms, t.predicted_n) + "\n")
    total_ms = t.queue_ms + t.prompt_ms + t.predicted_ms
    err.write(f"      total time = {total_ms:10.2f} ms / {t.prompt_n + t.predicted_n:5d} tokens\n")
    err.flush()


def _given(value: object) -> object:
    """A flag's value, None where it says auto (the preset's or run's default then decides)."""
    return None if value == "auto" else value


def _pick(explicit: object, preset_value: object, default: object) -> object:
    return explicit if explicit is not None else preset_value if preset_value is not None else default


def _first_user_text(args: argparse.Namespace, stdin: TextIO) -> str | None:
    if args.prompt is not None and args.file is not None:
        raise UsageError("give the prompt with -p or -f, not both")
    if args.file is not None:
        try:
            return Path(args.file).read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise UsageError(f"cannot read prompt file {args.file}: {exc.strerror}") from exc
    if args.prompt is not None:
        return str(args.prompt)
    if not stdin.isatty():  # piped input is the prompt: answer once
        return stdin.read()
    return None


def _engine_config(args: argparse.Namespace, ctx_size: int) -> EngineConfig:
    """serve's engine config (commands/engine.py) from run's EngineSettings flags, for one slot of
    `ctx_size` cells; "auto" threads are every usable core, "auto" GPU layers as serve sizes them."""
    from outpost.commands.engine import engine_config, sized

    settings = EngineSettings.from_args(args).model_copy(update={"parallel": 1, "ctx_size": ctx_size})
    if settings.n_gpu_layers == "auto":
        settings = settings.model_copy(update={"n_gpu_layers": sized(settings, args.model)[0].n_gpu_layers})
    return engine_config(settings, args.model)


@dataclass(frozen=True)
class RunSettings:
    """What the flags and the preset decide together (a flag given wins over the preset)."""

    n_predict: int
    ctx_size: int
    sampling: SamplingParams
    system: str | None
    user_prefix: str
    stop_on_loop: bool


def _sampling(args: argparse.Namespace, temperature: float) -> SamplingParams:
    if args.top_k < 0 or not 0.0 <= args.top_p <= 1.0 or not 0.0 <= args.min_p <= 1.0:
        raise UsageError("--top-k must be >= 0, --top-p and --min-p in [0, 1]")
    if args.repeat_penalty <= 0:
        raise UsageError("--repeat-penalty must be > 0 (1.0 disables it)")
    return SamplingParams(
        temperature=temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repeat_penalty=args.repeat_penalty,
        seed=None if args.seed < 0 else args.seed,
    )


def run_settings(args: argparse.Namespace) -> RunSettings:
    """`outpost run`'s flags over its preset's defaults; UsageError on a bad value."""
    preset = PRESETS[args.preset] if args.preset else Preset()
    n_predict = int(_pick(args.n_predict, preset.n_predict, 512))  # type: ignore[call-overload]
    if n_predict == 0 or n_predict < -1:
        raise UsageError(f"-n/--n-predict must be > 0 or -1, got {n_predict}")
    temperature = float(_pick(args.temp, preset.temperature, 0.8))  # type: ignore[arg-type]
    return RunSettings(
        n_predict=n_predict,
        ctx_size=int(_pick(_given(args.ctx_size), preset.ctx_size, 0)),  # type: ignore[call-overload]
        sampling=_sampling(args, temperature),
        system=_pick(args.system, preset.system, None),  # type: ignore[arg-type]
        user_prefix=preset.user_prefix,
        stop_on_loop=preset.stop_on_loop,
    )


def new_session(engine: Engine, settings: RunSettings, out: TextIO | None = None) -> ChatSession:
    return ChatSession(
        engine,
        settings.sampling,
        settings.n_predict,
        system=settings.system,
        user_prefix=settings.user_prefix,
        stop_on_loop=settings.stop_on_loop,
        out=out or sys.stdout,
    )


def run_command(args: argparse.Namespace, stdin: TextIO | None = None) -> int:
    """The whole `outpost run`: one answer, then an interactive chat when the terminal allows it."""
    stdin = stdin or sys.stdin
    settings = run_settings(args)
    first = _first_user_text(args, stdin)
    from outpost.serving.assembly import Engine

    with Engine(_engine_config(args, settings.ctx_size), max_queue=1) as engine:
        session = new_session(engine, settings)
        if first is not None:
            session.ask(first)
        if args.single_turn or not stdin.isatty():
            return 0
        session.interactive(stdin)
    return 0
