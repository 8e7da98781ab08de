"""Request bodies of the Ollama-compatible API (``/api/*``), as pydantic models.

Field names and defaults follow Ollama's api/types.go. Unknown fields are ignored, so newer
clients keep working; known fields with a wrong type are a 400 naming the field.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ChatMessage",
    "ChatRequest",
    "CopyRequest",
    "CreateAdapter",
    "CreateRequest",
    "DeleteRequest",
    "EmbedRequest",
    "EmbeddingsRequest",
    "GenerateRequest",
    "Options",
    "PullRequest",
    "ShowRequest",
]

KeepAlive = str | float | None
Format = str | dict[str, Any] | None


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Options(BaseModel):
    """Ollama's ``options`` (documented here; validated in :mod:`localllm.daemon.options`)."""

    model_config = ConfigDict(extra="allow")

    num_ctx: int | None = Field(None, description="Context length per request slot (tokens).")
    num_predict: int | None = Field(None, description="Maximum tokens to generate; -1 no limit.")
    temperature: float | None = Field(None, description="Sampling temperature; 0 is greedy.")
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    typical_p: float | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: list[str] | str | None = None
    num_keep: int | None = None
    num_batch: int | None = None
    num_gpu: int | None = None
    main_gpu: int | None = None
    use_mmap: bool | None = None
    use_mlock: bool | None = None
    mirostat: int | None = Field(None, description="Mirostat sampling: 0 off, 1 or 2.")
    mirostat_tau: float | None = Field(None, description="Mirostat's target surprise.")
    mirostat_eta: float | None = Field(None, description="Mirostat's learning rate.")
    num_thread: int | None = None
    thinking_budget: int | None = Field(
        None,
        description="Most tokens of reasoning: then the reasoning block is closed (its close "
        "tag inserted) and the answer follows; -1 no limit.",
    )


class _ModelBody(_Body):
    model: str = Field("", description="Model name, e.g. smollm2:135m.")
    name: str | None = Field(None, description="Deprecated alias of model.")

    def model_name(self) -> str:
        """``model``, falling back to the deprecated ``name``."""
        return self.model or self.name or ""


class _Generating(_ModelBody):
    """What /api/generate and /api/chat both take."""

    stream: bool | None = True
    format: Format = None
    options: Options | None = None
    keep_alive: KeepAlive = None
    think: bool | str | None = Field(
        None, description='Reasoning: true, false, or a level ("low", "medium", "high", "max").'
    )
    logprobs: bool | None = Field(None, description="Report each token's log probability.")
    top_logprobs: int | None = Field(
        None, description="With logprobs: this many most likely tokens at each position (0-20)."
    )
    shift: bool | None = Field(
        None, description="false: end with done_reason length at the end of the context."
    )


class GenerateRequest(_Generating):
    """POST /api/generate."""

    prompt: str | None = None
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = Field(
        None,
        description="Tokens of an earlier exchange (an answer's context) that this prompt "
        "continues; refused with raw (Ollama's rule).",
    )
    raw: bool | None = False
    images: list[str] | None = None
    truncate: bool | None = Field(
        None, description="true: cut a prompt longer than the context instead of a 400."
    )


class ChatMessage(_Body):
    """One chat message."""

    role: str
    content: str | None = ""
    images: list[str] | None = None
    tool_calls: list[dict[str, Any]] | None = Field(
        None, description="An assistant's calls: {function: {name, arguments (an object)}}."
    )
    tool_name: str | None = Field(None, description="The tool a tool message answers for.")
    tool_call_id: str | None = Field(None, description="The call a tool message answers.")
    thinking: str | None = None


class ChatRequest(_Generating):
    """POST /api/chat."""

    messages: list[ChatMessage] | None = None
    tools: list[dict[str, Any]] | None = None
    truncate: bool | None = Field(
        None,
        description="Unless false: drop the oldest turns (system messages kept) of a chat "
        "longer than the context, as Ollama does; false: a 400 naming the sizes.",
    )


class EmbedRequest(_ModelBody):
    """POST /api/embed."""

    input: str | list[str] = ""
    truncate: bool | None = True
    dimensions: int | None = Field(None, ge=1)
    options: Options | None = None
    keep_alive: KeepAlive = None


class EmbeddingsRequest(_ModelBody):
    """POST /api/embeddings (legacy)."""

    prompt: str = ""
    options: Options | None = None
    keep_alive: KeepAlive = None


class ShowRequest(_ModelBody):
    """POST /api/show."""

    verbose: bool | None = False


class CopyRequest(_Body):
    """POST /api/copy."""

    source: str
    destination: str


class DeleteRequest(_ModelBody):
    """DELETE /api/delete."""


class PullRequest(_ModelBody):
    """POST /api/pull."""

    insecure: bool | None = False
    quantize: str | None = Field(
        None, description="localllm: quantize the pulled model to this type (q4_K_M, q8_0, ...)."
    )
    stream: bool | None = True


class CreateAdapter(_Body):
    """One adapter of POST /api/create with its scale (localllm's form)."""

    from_: str = Field(alias="from", description="An uploaded blob's digest or a GGUF path.")
    scale: float = Field(1.0, description="How strongly it applies (1.0 as trained).")


class CreateRequest(_ModelBody):
    """POST /api/create."""

    from_: str | None = Field(
        None,
        alias="from",
        description="An existing model's name, or a path to a GGUF file the daemon can read.",
    )
    files: dict[str, str] | None = Field(None, description="File name → blob digest.")
    template: str | None = None
    system: str | None = None
    license: str | list[str] | None = None
    parameters: dict[str, Any] | None = None
    messages: list[ChatMessage] | None = None
    quantize: str | None = None
    allow_requantize: bool | None = Field(
        False, description="localllm: quantize a source that is already quantized (loses quality)."
    )
    adapters: dict[str, str | CreateAdapter] | None = Field(
        None,
        description="LoRA adapters (Modelfile ADAPTER), in order: file name → an uploaded "
        "blob's digest (Ollama's form) or a GGUF path the daemon can read; localllm also takes "
        '{"from": digest or path, "scale": 0.5}. Each is checked against the model\'s weights.',
    )
    draft: str | None = Field(
        None,
        description="localllm: the draft model for speculative decoding (Modelfile DRAFT; "
        "stored as a layer of type application/vnd.ollama.image.draft): a model's name, a "
        "GGUF path the daemon can read, or an uploaded blob's digest. Its vocabulary must "
        "match the model's.",
    )
    stream: bool | None = True
