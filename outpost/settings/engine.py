"""`EngineSettings`: the model and how its engine runs (serve and worker), llama-server's flags.

To add an engine flag, add one field here (see outpost/settings/fields.py):

    spec_draft_n_max: int = setting(16, "--spec-draft-n-max", help="...", parse=int, ge=0)

That one line gives `outpost serve` and `outpost worker` the flag, `OUTPOST_SPEC_DRAFT_N_MAX` and the
`--help` line; the command's composition root (outpost/commands) reads `settings.spec_draft_n_max`.
A flag that takes "auto" or a number parses with `int_or_auto` and is typed `int | Auto`.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import Field, field_validator, model_validator

from outpost.messages import SPLIT_MODES, SpecParams, SplitMode
from outpost.scheduler.budget import parse_prefill_budget
from outpost.settings.fields import (
    ChatTemplateSettings,
    comma_list,
    existing_file,
    setting,
)
from outpost.sizing import int_or_auto

Auto = Literal["auto"]
SpecType = Literal["none", "ngram-simple", "ngram-mod", "draft"]


def _spec_type(text: str) -> str:
    """--spec-type's value: llama-server's names; `draft-simple` (its draft model type) is `draft`."""
    word = text.strip().lower()
    word = "draft" if word == "draft-simple" else word
    if word not in ("none", "ngram-simple", "ngram-mod", "draft"):
        raise argparse.ArgumentTypeError(f"expected none, ngram-simple, ngram-mod or draft, got {text!r}")
    return word


def lora_scaled_pairs(item: object) -> list[tuple[str, float]]:
    """One --lora-scaled: ["FILE", "SCALE"] (FILE SCALE), ["FILE:SCALE,..."] or "FILE:SCALE"
    (llama-server's spelling, and the variable's items) -> (file, scale) pairs; ValueError else."""
    words = [str(w) for w in item] if isinstance(item, list | tuple) else [str(item)]
    if len(words) == 2 and ":" not in words[1]:
        pairs = [(words[0], words[1])]
    elif len(words) == 1:
        parts = [part.rpartition(":") for part in comma_list(words[0])]
        if not parts or any(not sep or not path for path, sep, _ in parts):
            raise ValueError(f"--lora-scaled takes FILE SCALE or FILE:SCALE, got {words[0]!r}")
        pairs = [(path, scale) for path, _, scale in parts]
    else:
        raise ValueError(f"--lora-scaled takes FILE SCALE or FILE:SCALE, got {' '.join(words)!r}")
    out = []
    for path, scale in pairs:
        try:
            value = float(scale)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise ValueError(f"--lora-scaled {path}: the scale {scale!r} is not a number")
        out.append((existing_file(path) or path, value))
    return out


Switch3 = Literal["auto", "on", "off"]
_SWITCH3 = ("auto", "on", "off")


class EngineSettings(ChatTemplateSettings):
    """What `outpost serve` and `outpost worker` load and how they decode; defaults follow llama-server."""

    model: str | None = setting(
        None,
        "-m",
        "--model",
        help="GGUF file or model store name (serve, run: default the built-in random-weight demo model; "
        "worker: required)",
    )
    model_id: str | None = setting(
        None,
        "-a",
        "--alias",
        help="model id clients use, also the worker's queue name (default: the file stem)",
    )
    # auto (the default): sized from the memory and cores this process may use (outpost/sizing).
    parallel: Annotated[int, Field(ge=1, le=256)] | Auto = setting(
        "auto", "-np", "--parallel", help="slots decoded together (default auto)", parse=int_or_auto
    )
    ctx_size: Annotated[int, Field(ge=0)] | Auto = setting(
        "auto", "-c", "--ctx-size", help="KV cells for all slots (default auto)", parse=int_or_auto
    )
    threads: Annotated[int, Field(ge=1)] | Auto = setting(
        "auto", "-t", "--threads", help="CPU threads (default auto: usable cores)", parse=int_or_auto
    )
    n_gpu_layers: Annotated[int, Field(ge=-1)] | Auto = setting(
        0,
        "-ngl",
        "--n-gpu-layers",
        help="layers to offload to GPU (default 0): a number (-1: all), or auto: as many as the free "
        "GPU memory holds (none on a CPU-only llama.cpp build)",
        parse=int_or_auto,
    )
    split_mode: SplitMode = setting(
        "layer",
        "-sm",
        "--split-mode",
        help="how the model spreads over several GPUs (default layer; tensor: llama.cpp's experimental "
        "tensor parallelism)",
        choices=SPLIT_MODES,
    )
    batch_size: int = setting(
        512, "-b", "--batch-size", help="tokens per decode step (default 512)", parse=int, ge=1
    )
    ubatch_size: int = setting(
        512, "-ub", "--ubatch-size", help="physical micro-batch (default 512)", parse=int, ge=1
    )
    prefill_budget: Annotated[int, Field(ge=1)] | Literal["auto", "off"] = setting(
        "auto",
        "--prefill-budget",
        help="prompt tokens per step while other requests generate, so their tokens keep coming "
        "while long prompts are read: auto (default: from step times measured at start, a step with "
        "a prompt chunk costs at most 3 one-stream decode steps; 64 at least with flash attention), "
        "a number, or off/0 (whole -b steps)",
        parse=parse_prefill_budget,
    )
    prompt_waves: int = setting(
        8,
        "--prompt-waves",
        help="steps: while a quarter of the generating requests (four at least) will end within this "
        "many (by their max_tokens), a new prompt waits for them, at most 8 times as many steps, so "
        "requests that end together start together and their prompts are read beside fewer streams "
        "(closed loops of clients, batch jobs with one max_tokens; default 8, what was measured; "
        "0: off)",
        parse=int,
        ge=0,
    )
    # The loopback benchmark's clients sent again 1-9 ms after an end, where a 3 ms wait missed
    # most of them and 10 ms caught them (docs/performance.md, "A closed loop's next request").
    follow_up_wait: float = setting(
        20.0,
        "--follow-up-wait",
        help="milliseconds: after a request ends, while most ends were soon followed by a new request "
        "(closed loops of clients: worker pools, agents, benchmarks), wait up to this long for it "
        "before the next step, so its prompt is read next rather than after another's; the wait ends "
        "when a request arrives (default 20; 0: off; CPU only: with GPU layers prompts share steps)",
        parse=float,
        ge=0,
        le=1000,
    )
    flash_attn: Switch3 = setting(
        "auto",
        "-fa",
        "--flash-attn",
        help="flash attention (default auto: on the CPU what a short decode probe measured faster on "
        "this machine, once, cached; off where it has not (OUTPOST_KERNEL_PROBE=off, a busy machine) "
        "(engine/kernel_probe.py); llama.cpp's auto with -ngl)",
        choices=_SWITCH3,
    )
    repack: Switch3 = setting(
        "auto",
        "--repack",
        help="llama.cpp's repacked CPU weight layouts (default auto: repacked unless the kernel "
        "probe measured plain weights faster; AMX probed where its tiles fault)",
        choices=_SWITCH3,
    )
    kv_unified: Switch3 = setting(
        "auto",
        "-kvu",
        "--kv-unified",
        help="a stream of c/np KV cells per slot (auto, off: a token attends only over its own "
        "slot's cells; idle caches are kept) or one pool for all slots (on: one request may use "
        "all c cells; auto takes it where the opt-in kernel probe measured it faster); AMX's one-token "
        "layout and -np 1 always use one pool",
        choices=_SWITCH3,
    )
    backend_sampling: bool | None = setting(
        None,
        "-bs",
        "--backend-sampling",
        help="sample in llama.cpp's graph (its backend sampling: only token ids come back) the requests "
        "whose chain it does exactly (greedy, temperature, top-k, top-p, min-p, seed; grammar, logit "
        "bias, penalties, logprobs and speculation stay on the host in the same step); default: on "
        "with GPU layers, off on the CPU, where the host sampler measured no slower",
        action="switch",
    )
    prefix_cache: bool = setting(
        True,
        "--no-prefix-cache",
        help="do not reuse a previous request's KV cells for a prompt that starts the same way",
        action="store_false",
    )
    cache_idle_cells: int = setting(
        0,
        "--cache-idle-cells",
        help="with a shared KV pool (the default), KV cells finished requests keep for prefix reuse once "
        "others run (default 0: every decode attends over every used cell, so idle caches slow all "
        "requests); per-slot streams keep them all",
        parse=int,
        ge=0,
    )
    # Speculative decoding, with llama-server's spellings (outpost/scheduler/speculation.py).
    spec_type: SpecType | None = setting(
        None,
        "--spec-type",
        help="speculative decoding: none, ngram-simple, ngram-mod (drafts from the request's own text) "
        "or draft (a draft model, -md; draft-simple is read as draft); default: draft with -md, else none",
        parse=_spec_type,
    )
    model_draft: str | None = setting(
        None, "-md", "--model-draft", help="draft model GGUF for speculative decoding (same vocabulary)"
    )
    spec_draft_n_max: int = setting(
        16,
        "--spec-draft-n-max",
        help="most draft tokens verified per step (default 16)",
        parse=int,
        ge=0,
        le=256,
    )
    spec_draft_n_min: int = setting(
        0,
        "--spec-draft-n-min",
        help="drafts shorter than this are not verified (default 0)",
        parse=int,
        ge=0,
        le=256,
    )
    # LoRA adapters (llama-server's flags): ids 0, 1, ... in the order --lora files, then --lora-scaled.
    lora: tuple[str, ...] = setting(
        (),
        "--lora",
        help="LoRA adapter GGUF applied at scale 1 (repeatable, or comma-separated); ids from 0 in "
        "the order given, --lora before --lora-scaled",
        action="append",
    )
    lora_scaled: tuple[tuple[str, float], ...] = setting(
        (),
        "--lora-scaled",
        help="LoRA adapter GGUF with its scale: FILE SCALE or llama-server's FILE:SCALE[,...] "
        "(repeatable; the variable takes FILE:SCALE,...)",
        action="append",
        nargs="+",
        metavar=("FILE", "SCALE"),
    )
    lora_init_without_apply: bool = setting(
        False,
        "--lora-init-without-apply",
        help="load the LoRA adapters at scale 0 (apply them with POST /lora-adapters or a request's lora)",
        action="store_true",
    )
    embedding_model: str | None = setting(
        None, "--embedding-model", help="GGUF for /v1/embeddings (default: the served model)"
    )
    # llama-server's flags below are accepted; those Outpost cannot honour say so at start (notices).
    tags: tuple[str, ...] = setting(
        (), "--tags", help="comma-separated tags shown with the model in /v1/models", parse=comma_list
    )
    embedding: bool = setting(
        False,
        "--embedding",
        "--embeddings",
        help="accepted: /v1/embeddings is always served (chat stays on, unlike llama-server's)",
        action="store_true",
    )
    reranking: bool = setting(
        False,
        "--reranking",
        "--rerank",
        help="serve /rerank (llama-server's): with --rerank-model's GGUF, else the -m model's",
        action="store_true",
    )
    rerank_model: str | None = setting(
        None,
        "--rerank-model",
        help="reranker GGUF (rank pooling) for /rerank beside the chat model; implies --reranking",
    )
    pooling: Literal["none", "mean", "cls", "last", "rank"] | None = setting(
        None,
        "--pooling",
        help="embedding pooling: Outpost pools by mean (another choice is noted and ignored)",
        choices=("none", "mean", "cls", "last", "rank"),
    )
    jinja: bool = setting(
        True, "--jinja", help="accepted: chat templates are always rendered with jinja", action="switch"
    )
    context_shift: bool = setting(
        False,
        "--context-shift",
        help="accepted, not done: a reply that fills the context ends with finish_reason length",
        action="switch",
    )
    slot_save_path: str | None = setting(
        None,
        "--slot-save-path",
        help="folder for POST /slots/{id}?action=save|restore files, created if missing (llama-server's; "
        "without it: 501)",
    )
    offline: bool = setting(
        False,
        "--offline",
        help="accepted: serve and worker never download (outpost pull does)",
        action="store_true",
    )

    @field_validator("lora", mode="before")
    @classmethod
    def _lora_files(cls, value: object) -> tuple[str, ...]:
        """llama-server's --lora takes comma-separated files too."""
        items = list(value) if isinstance(value, list | tuple) else [value]
        return tuple(p for item in items for p in comma_list(str(item)))

    @field_validator("lora_scaled", mode="before")
    @classmethod
    def _lora_pairs(cls, value: object) -> tuple[tuple[str, float], ...]:
        items = list(value) if isinstance(value, list | tuple) else [value]
        return tuple(pair for item in items for pair in lora_scaled_pairs(item))

    @field_validator("lora")
    @classmethod
    def _lora_exist(cls, paths: tuple[str, ...]) -> tuple[str, ...]:
        for path in paths:
            existing_file(path)
        return paths

    @property
    def lora_adapters(self) -> tuple[tuple[str, float], ...]:
        """(file, starting scale) per adapter, in id order; scale 0 with --lora-init-without-apply."""
        pairs = [(path, 1.0) for path in self.lora] + list(self.lora_scaled)
        return tuple((path, 0.0 if self.lora_init_without_apply else scale) for path, scale in pairs)

    @field_validator("embedding_model", "model_draft", "rerank_model")
    @classmethod
    def _file_exists(cls, path: str | None) -> str | None:
        return existing_file(path)

    @field_validator("slot_save_path")
    @classmethod
    def _is_folder(cls, path: str | None) -> str | None:
        if path is not None and Path(path).exists() and not Path(path).is_dir():
            raise ValueError(f"--slot-save-path must be a folder (serve creates a missing one): {path}")
        return path

    @model_validator(mode="after")
    def _speculation_fits(self) -> Self:
        if self.spec_draft_n_min > self.spec_draft_n_max:
            raise ValueError("--spec-draft-n-min must not exceed --spec-draft-n-max")
        if self.spec_type == "draft" and self.model_draft is None:
            raise ValueError("--spec-type draft needs a draft model: give it with -md/--model-draft")
        return self

    @property
    def speculative(self) -> SpecParams:
        """The speculative decoding requests get unless they ask otherwise."""
        kind = self.spec_type or ("draft" if self.model_draft else "none")
        return SpecParams(kind, self.spec_draft_n_max, self.spec_draft_n_min)

    @model_validator(mode="after")
    def _batch_holds_the_slots(self) -> Self:
        if isinstance(self.parallel, int) and self.batch_size < self.parallel:
            raise ValueError(
                f"--batch-size ({self.batch_size}) must be at least --parallel ({self.parallel}): "
                "every busy slot decodes one token per step"
            )
        return self

    def reranker_path(self, model_path: str) -> str | None:
        """The GGUF /rerank scores with: --rerank-model's, or -m's with --reranking; None: off."""
        return self.rerank_model or (model_path if self.reranking else None)

    def served_model_id(self, model_path: str) -> str:
        """The id clients use for the model at `model_path` (-a's first name, else the file stem)."""
        return next(iter(self.aliases), None) or Path(model_path).stem

    @property
    def aliases(self) -> tuple[str, ...]:
        """-a's names (llama-server takes `-a a,b`): the first is the served id."""
        return comma_list(self.model_id or "")

    def notices(self) -> list[str]:
        """One line per llama-server flag given here that Outpost accepts but does not honour."""
        out = []
        if not self.jinja:
            out.append("--no-jinja ignored: Outpost always renders chat templates with jinja")
        if self.context_shift:
            out.append(
                "--context-shift ignored: a reply that fills the context ends with finish_reason length"
            )
        if self.pooling not in (None, "mean"):
            out.append(f"--pooling {self.pooling} ignored: Outpost's embeddings pool by mean")
        if self.embedding:
            out.append("--embedding: /v1/embeddings is always served; chat routes stay on")
        return out
