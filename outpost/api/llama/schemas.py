"""llama-server's native request bodies (`POST /completion`), as its web UI and scripts send them.

Field names and defaults are llama-server's (tools/server/server-task.cpp `params_from_json_cmpl`);
fields Outpost has no use for (`cache_prompt`, `n_keep`, `timings_per_token`, ...) are accepted.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, Field, field_validator

from outpost.api.pipeline.schemas import MAX_PROMPTS, Body, LoraList, check_stop

# A prompt: text, token ids, text and ids mixed (one prompt), or a list of those (several prompts).
PromptPiece = str | int
NativePrompt = str | list[PromptPiece | list[PromptPiece]]

# llama-server's sampler names (common/sampling.cpp), with the alternative spellings it accepts.
# llama-server's sampler order when a request names none (also what /props reports).
DEFAULT_SAMPLERS = (
    "penalties",
    "dry",
    "top_n_sigma",
    "top_k",
    "typ_p",
    "top_p",
    "min_p",
    "xtc",
    "temperature",
)
SAMPLER_NAMES = {
    "dry": "dry",
    "top_k": "top_k",
    "top_p": "top_p",
    "nucleus": "top_p",
    "typ_p": "typ_p",
    "typical_p": "typ_p",
    "typical": "typ_p",
    "min_p": "min_p",
    "xtc": "xtc",
    "temperature": "temperature",
    "temp": "temperature",
    "penalties": "penalties",
    "top_n_sigma": "top_n_sigma",
    "infill": "infill",
}


def prompt_pieces(prompt: NativePrompt) -> list[list[PromptPiece]]:
    """llama-server's reading of `prompt`: one prompt (text, ids, or text and ids mixed) or several."""
    if isinstance(prompt, str):
        return [[prompt]]
    ids = [p for p in prompt if isinstance(p, int)]
    if len(ids) == len(prompt) or (ids and any(isinstance(p, str) for p in prompt)):
        return [[p for p in prompt if not isinstance(p, list)]]
    return [p if isinstance(p, list) else [p] for p in prompt]


class NativeCompletionRequest(Body):
    prompt: NativePrompt = ""
    n_predict: int | None = Field(None, ge=-1)
    max_tokens: int | None = Field(None, ge=-1)  # llama-server's alias of n_predict
    stream: bool = False
    cache_prompt: bool = True
    return_tokens: bool = False
    n_probs: int = Field(0, ge=0, le=100)
    post_sampling_probs: bool = False
    samplers: list[str] | str | None = None
    stop: Annotated[list[str] | str | None, AfterValidator(check_stop)] = None
    temperature: float | None = Field(None, ge=0.0, le=100.0)
    top_k: int | None = Field(None, ge=-1, le=2**31 - 1)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    typical_p: float | None = Field(None, ge=0.0, le=1.0)
    repeat_penalty: float | None = Field(None, gt=0.0, le=100.0)
    repeat_last_n: int | None = Field(None, ge=-1)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    seed: int | None = None
    ignore_eos: bool = False
    logit_bias: list[list[Any]] | dict[str, float | bool] | None = None
    grammar: str | None = None
    json_schema: dict[str, Any] | None = None
    model: str | None = None
    id_slot: int | None = None  # the slot to run in (-1 or none: any)
    return_progress: bool | None = None  # streams: `prompt_progress` chunks as the prompt is read
    lora: LoraList | None = None  # this request's adapter scales (adapters not named: 0)
    # Accepted for llama-server's clients; Outpost has no use for them (docs/serve.md says why).
    n_keep: int | None = None
    n_indent: int | None = None
    timings_per_token: bool | None = None
    verbose: bool | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt_shape(cls, prompt: NativePrompt) -> NativePrompt:
        if len(prompt_pieces(prompt)) > MAX_PROMPTS:
            raise ValueError(f"at most {MAX_PROMPTS} prompts per request")
        return prompt

    @field_validator("samplers")
    @classmethod
    def _sampler_names(cls, samplers: list[str] | str | None) -> list[str] | str | None:
        if isinstance(samplers, list) and (bad := [s for s in samplers if s not in SAMPLER_NAMES]):
            raise ValueError(f"unknown sampler {bad[0]!r}; known: {', '.join(sorted(SAMPLER_NAMES))}")
        return samplers
