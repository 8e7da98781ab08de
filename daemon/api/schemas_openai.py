"""Request bodies of the OpenAI-compatible API (``/v1/*``), as pydantic models.

Only what a local model can honour is declared; other fields OpenAI SDKs send (``user``,
``metadata``...) are accepted and ignored. Ranges follow OpenAI's documentation.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ChatCompletionRequest",
    "CompletionRequest",
    "ContentPart",
    "EmbeddingRequest",
    "Message",
    "ResponseFormat",
    "StreamOptions",
]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ContentPart(_Body):
    """A piece of message content: ``text``, or ``image_url`` (a ``data:`` URL) for a model
    with vision."""

    type: str
    text: str | None = None
    image_url: Any = Field(
        None,
        description='{"url": "data:image/png;base64,...", "detail": "auto|low|high"} (or the '
        "URL string); remote http(s) URLs are refused.",
    )


class Message(_Body):
    """A chat message."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = Field(
        None, description="An assistant's calls: {id, type: function, function: {name, arguments}}."
    )
    tool_call_id: str | None = Field(None, description="Which call a tool message answers.")
    reasoning_content: str | None = Field(
        None, description="An assistant's reasoning (llama-server's and DeepSeek's name)."
    )
    reasoning: str | None = Field(None, description="An assistant's reasoning (vLLM's name).")


class StreamOptions(_Body):
    """``stream_options``."""

    include_usage: bool | None = False


class JSONSchemaFormat(_Body):
    """``response_format.json_schema``."""

    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    """``response_format``: text, json_object or json_schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None


class _Sampling(_Body):
    model: str = Field(..., min_length=1)
    max_tokens: int | None = Field(None, ge=1, le=1 << 24)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    n: int | None = Field(
        None, ge=1, le=16, description="Choices to generate from the one prompt (at most 16)."
    )
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = Field(
        None, description="Token id (as a string) → bias from -100 to 100 added to its logit."
    )
    # llama-server's and vLLM's sampling extensions, under Ollama's option names: honoured
    # (an ignored one would change the answer without a word), checked as options are.
    top_k: int | None = Field(None, description="Sample from the k likeliest tokens (0: all).")
    min_p: float | None = Field(None, description="Drop tokens below this share of the top one.")
    typical_p: float | None = Field(None, description="Locally typical sampling (1: off).")
    repeat_penalty: float | None = Field(
        None, description="Penalty for tokens of the last repeat_last_n (1: off; default 1.1)."
    )
    repeat_last_n: int | None = Field(None, description="Tokens the repeat penalty looks at.")
    mirostat: int | None = Field(None, description="Mirostat sampling: 0 off, 1 or 2.")
    mirostat_tau: float | None = Field(None, description="Mirostat's target surprise.")
    mirostat_eta: float | None = Field(None, description="Mirostat's learning rate.")
    lora: list[dict[str, Any]] | None = Field(
        None,
        description='llama-server\'s per-request LoRA: [{"id": 0, "scale": 0.5}] (ids as the '
        "model lists its adapters; those not listed are off). Ollama's options.adapters.",
    )


class ChatCompletionRequest(_Sampling):
    """POST /v1/chat/completions."""

    messages: list[Message] = Field(..., min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=1 << 24)
    response_format: ResponseFormat | None = None
    tools: list[dict[str, Any]] | None = Field(
        None, description='Function tools: {"type": "function", "function": {name, parameters}}.'
    )
    tool_choice: str | dict[str, Any] | None = Field(
        None,
        description='"none", "auto", "required", {"type": "function", "function": {"name"}} or '
        '{"type": "allowed_tools", "allowed_tools": {"mode", "tools"}}.',
    )
    parallel_tool_calls: bool | None = Field(
        None, description="false: at most one call per answer (default true)."
    )
    logprobs: bool | None = Field(None, description="Report each token's log probability.")
    top_logprobs: int | None = Field(
        None, description="With logprobs: this many most likely tokens at each position (0-20)."
    )
    reasoning_effort: str | None = Field(
        None,
        description="none, minimal, low, medium, high, xhigh or max: the model's reasoning "
        "(none switches it off); a model that does not reason takes only none.",
    )
    chat_template_kwargs: dict[str, Any] | None = Field(
        None,
        description="Extra variables for the chat template, as llama-server takes them "
        '(e.g. {"enable_thinking": false}).',
    )


class CompletionRequest(_Sampling):
    """POST /v1/completions."""

    prompt: str | list[str] | list[int] | list[list[int]] = Field(
        "",
        description="A prompt, a list of prompts, or prompts as the model's token ids (one "
        "list of ids, or a list of them); each prompt gets n choices.",
    )
    max_tokens: int | None = Field(
        None,
        ge=0,
        le=1 << 24,
        description="0: evaluate the prompt only (with echo and logprobs: score it).",
    )
    suffix: str | None = None
    echo: bool | None = Field(
        False, description="Answer the prompt too (with logprobs: its tokens' log probabilities)."
    )
    logprobs: int | None = Field(
        None, description="Log probabilities of each token and this many alternatives (0-20)."
    )
    best_of: int | None = Field(
        None, ge=1, description="Only best_of equal to n (or absent) is supported."
    )


class EmbeddingRequest(_Body):
    """POST /v1/embeddings."""

    model: str = Field(..., min_length=1)
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] | None = "float"
    dimensions: int | None = Field(None, ge=1)
