"""Request bodies as pydantic models: what clients may send, with the bounds OpenAI documents.

Unknown fields are ignored (clients send `user`, `metadata`, ...); a wrong type or an out-of-range
value is a validation error that `errors.py` turns into a 400. Replies are built as plain dicts in
`openai/render.py`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from outpost.api.pipeline.tool_schemas import ReasoningFormat, ToolCall, ToolChoice, ToolDef

MAX_STOP = 16
MAX_PROMPTS = 16


class Body(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, populate_by_name=True)


class ContentPart(Body):
    type: str
    text: str | None = None


class ChatMessage(Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None  # an assistant turn's thinking (Qwen3's interleaved history)

    def text(self) -> str:
        """The content as one string; only text parts are supported."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise ValueError(f"content part type {part.type!r} is not supported: send text parts")
        return "".join(part.text or "" for part in self.content)


class StreamOptions(Body):
    include_usage: bool = False


class JsonSchemaSpec(Body):
    name: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None
    inline_schema: dict[str, Any] | None = Field(None, alias="schema")  # llama-server's json_object+schema


def _check_messages(messages: list[ChatMessage]) -> list[ChatMessage]:
    if not messages:
        raise ValueError("messages must not be empty: send at least one message")
    return messages


Messages = Annotated[list[ChatMessage], AfterValidator(_check_messages)]


def check_stop(stop: str | list[str] | None) -> str | list[str] | None:
    if isinstance(stop, list) and len(stop) > MAX_STOP:
        raise ValueError(f"at most {MAX_STOP} stop strings")
    return stop


Stop = Annotated[str | list[str] | None, AfterValidator(check_stop)]
SpecType = Literal["none", "ngram-simple", "ngram-mod", "draft"]


class SpeculativeFields(Body):
    """A request's own speculative decoding (outpost/scheduler/speculation.py)."""

    type: SpecType | None = None
    n_max: int | None = Field(None, ge=0, le=256)
    n_min: int | None = Field(None, ge=0, le=256)


class LoraField(Body):
    """One adapter's scale: an entry of llama-server's per-request `lora` and of POST /lora-adapters."""

    id: int = Field(ge=0)
    scale: float = 0.0  # llama-server's default


# At most this many entries in one `lora` list.
MAX_LORA = 64
LoraList = Annotated[list[LoraField], Field(max_length=MAX_LORA)]


class SamplingFields(Body):
    """Fields shared by chat and text completions (OpenAI's, then llama.cpp's extensions)."""

    model: str | None = None
    max_tokens: int | None = Field(None, ge=-1, description="-1 or absent: what the context allows")
    temperature: float | None = Field(None, ge=0.0, le=100.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    n: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: Stop = None
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    seed: int | None = None
    response_format: ResponseFormat | None = None
    top_k: int | None = Field(None, ge=-1, le=2**31 - 1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repeat_penalty: float | None = Field(None, gt=0.0, le=100.0)
    ignore_eos: bool | None = False
    # Speculative decoding, as an object or with llama-server's flat keys ("speculative.n_max").
    speculative: SpeculativeFields | None = None
    spec_type: SpecType | None = Field(None, alias="speculative.type")
    spec_n_max: int | None = Field(None, ge=0, le=256, alias="speculative.n_max")
    spec_n_min: int | None = Field(None, ge=0, le=256, alias="speculative.n_min")

    grammar: str | None = None  # llama.cpp's: GBNF (checked: 400 if it does not parse)
    json_schema: dict[str, Any] | None = None  # llama.cpp's: a JSON schema the output must match
    return_progress: bool | None = None  # llama.cpp's: accepted; prompt progress is not reported
    verbose: bool | None = None  # llama.cpp's: the reply adds `__verbose`, the native result
    lora: LoraList | None = None  # llama.cpp's: this request's adapter scales (others: 0)

    @field_validator("logit_bias")
    @classmethod
    def _bias_range(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        if bias and any(not -100.0 <= v <= 100.0 for v in bias.values()):
            raise ValueError("logit_bias values must be between -100 and 100")
        return bias


class ChatCompletionRequest(SamplingFields):
    messages: Messages
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[ToolDef] | None = Field(None, max_length=128)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    reasoning_format: ReasoningFormat | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # llama-server's / Hugging Face's rendering switches; a final assistant message is continued
    # (prefill) unless continue_final_message is false.
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None


def chat_from_fields(fields: dict[str, Any]) -> ChatCompletionRequest:
    """The chat request another protocol's body maps to (None values left out); ValueError naming
    the first field that is wrong, for the protocol to give in its own envelope."""
    try:
        return ChatCompletionRequest.model_validate({k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise ValueError(f"{where}: {first.get('msg')}") from None


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int]
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool | None = False

    @field_validator("prompt")
    @classmethod
    def _prompt_count(cls, prompt: str | list[str] | list[int]) -> str | list[str] | list[int]:
        if isinstance(prompt, list) and not prompt:
            raise ValueError("prompt must not be empty")
        if isinstance(prompt, list) and isinstance(prompt[0], str) and len(prompt) > MAX_PROMPTS:
            raise ValueError(f"at most {MAX_PROMPTS} prompts per request")
        return prompt


class EmbeddingContent(Body):
    """llama-server's `{"content": ...}` input: text, or content parts whose text is joined."""

    content: str | list[ContentPart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text or "" for p in self.content)


# OpenAI's four forms (a string, strings, token ids, lists of them) and llama-server's more: a list
# mixing strings, token-id lists (each one input) and `{"content"}` objects; ids and text mixed in
# one list (at the top or inside) are one input, its text tokenized in place.
EmbeddingItem = str | int | list[int | str] | EmbeddingContent
EmbeddingInput = str | list[EmbeddingItem]
Pieces = str | list[int | str]  # one input: text, or token ids and text


class EmbeddingRequest(Body):
    """`input` (OpenAI's) or `content` (llama-server's native field, answered in its shape)."""

    input: EmbeddingInput | None = None
    content: EmbeddingInput | None = None
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"

    @field_validator("input", "content")
    @classmethod
    def _input_count(cls, value: EmbeddingInput | None) -> EmbeddingInput | None:
        if isinstance(value, list) and not 1 <= len(value) <= 2048:
            raise ValueError("input must hold between 1 and 2048 strings or token lists")
        return value

    @model_validator(mode="after")
    def _one_given(self) -> Self:
        if self.input is None and self.content is None:
            raise ValueError('"input" or "content" must be provided')
        return self

    def inputs(self) -> list[Pieces]:
        """One entry per vector asked for (llama-server's reading, which holds OpenAI's forms)."""
        value = self.input if self.input is not None else self.content
        if isinstance(value, str):
            return [value]
        assert value is not None
        if any(isinstance(v, int) for v in value):  # ids, maybe with text: one input
            return [[v for v in value if isinstance(v, int | str)]]
        return [v.text() if isinstance(v, EmbeddingContent) else v for v in value if not isinstance(v, int)]


class TokenizeRequest(Body):
    content: str
    add_special: bool = False
    with_pieces: bool = False


class DetokenizeRequest(Body):
    tokens: list[int]


class ApplyTemplateRequest(ChatCompletionRequest):
    """A chat request whose prompt is only rendered (tools and template kwargs included)."""


class TgiParameters(Body):
    """Hugging Face TGI's `parameters` for SageMaker's `{"inputs", "parameters"}` body."""

    max_new_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, gt=0.0, le=100.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=1, le=2**31 - 1)
    repetition_penalty: float | None = Field(None, gt=0.0, le=100.0)
    do_sample: bool | None = None
    seed: int | None = None
    stop: list[str] = Field(default_factory=list, max_length=MAX_STOP)
    return_full_text: bool = False


class TgiRequest(Body):
    inputs: str
    parameters: TgiParameters = Field(default_factory=TgiParameters)
