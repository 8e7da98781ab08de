"""The runner's wire types: what the daemon asks a runner and what it gets back.

These dataclasses are the narrow interface between the daemon and the engine; they import
nothing from llama.cpp. On the wire each message is one JSON object per line (NDJSON) over the
runner's Unix socket; see :mod:`localllm.daemon.runner` for the protocol.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

__all__ = [
    "DoneReason",
    "EmbeddingRequest",
    "EmbeddingResult",
    "GenerationRequest",
    "GenerationResult",
    "RunnerConfig",
    "SamplingOptions",
    "SlotStats",
    "Stats",
    "Timings",
    "from_dict",
]

DoneReason = Literal["stop", "length", "cancel", "error"]


def from_dict(cls: type, data: dict[str, Any]) -> Any:
    """Build dataclass ``cls`` from ``data``, ignoring unknown keys (forward compatible)."""
    known = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class SamplingOptions:
    """Per-request sampling, with Ollama's option names and defaults."""

    temperature: float = 0.8
    """0 means greedy."""
    top_k: int = 40
    """Keep the k most likely tokens; 0 disables."""
    top_p: float = 0.9
    """Nucleus sampling; 1.0 disables."""
    min_p: float = 0.0
    """Drop tokens below min_p x the top probability; 0 disables."""
    typical_p: float = 1.0
    """Locally typical sampling; 1.0 disables."""
    repeat_penalty: float = 1.1
    """Penalty for tokens seen in the last repeat_last_n; 1.0 disables."""
    repeat_last_n: int = 64
    """How many recent tokens the penalties look at; -1 means the whole context."""
    presence_penalty: float = 0.0
    """OpenAI-style presence penalty."""
    frequency_penalty: float = 0.0
    """OpenAI-style frequency penalty."""
    seed: int = -1
    """Random seed; -1 picks one."""
    num_predict: int = -1
    """Maximum tokens to generate; -1 means until the context is full."""
    stop: list[str] = field(default_factory=list)
    """Stop strings; the matched text is not emitted."""
    grammar: str | None = None
    """A GBNF grammar constraining the output."""
    json_schema: dict[str, Any] | None = None
    """A JSON schema constraining the output (converted to GBNF by the runner)."""
    json_mode: bool = False
    """Constrain the output to any JSON value (Ollama's ``format: "json"``)."""


@dataclass
class GenerationRequest:
    """One completion or chat request for a runner."""

    id: str
    """Unique per runner connection; events carry it back."""
    prompt: str | None = None
    """Raw prompt text (used as is when ``raw`` or when no messages are given)."""
    messages: list[dict[str, Any]] | None = None
    """Chat messages ``{role, content}``; rendered with the chat template."""
    suffix: str | None = None
    """Fill-in-the-middle: text after the cursor (prompt is the text before)."""
    template: str | None = None
    """A Jinja chat template overriding the model's."""
    raw: bool = False
    """Skip the chat template; tokenize the prompt exactly."""
    add_generation_prompt: bool = True
    """End the rendered chat with the assistant's turn opener."""
    truncate: bool = False
    """If the prompt is too long, drop the oldest tokens after the system prompt."""
    options: SamplingOptions = field(default_factory=SamplingOptions)
    """Sampling options."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GenerationRequest:
        """Inverse of :meth:`to_dict`."""
        request = from_dict(cls, data)
        request.options = from_dict(SamplingOptions, data.get("options") or {})
        return request


@dataclass
class Timings:
    """Where a request's time went; prefill and decode are kept apart."""

    queued_ms: float = 0.0
    """From arrival at the runner to getting a slot."""
    ttft_ms: float = 0.0
    """From arrival to the first generated token (includes queueing and prefill)."""
    prompt_tokens: int = 0
    """Tokens in the prompt."""
    cached_tokens: int = 0
    """Prompt tokens reused from the KV cache (not evaluated again)."""
    prompt_ms: float = 0.0
    """Time spent prefilling the evaluated prompt tokens."""
    prompt_tokens_per_s: float = 0.0
    """Evaluated prompt tokens per second (cached ones excluded)."""
    completion_tokens: int = 0
    """Tokens generated."""
    decode_ms: float = 0.0
    """From the first generated token to the last."""
    decode_tokens_per_s: float = 0.0
    """Generated tokens per second after the first."""
    total_ms: float = 0.0
    """From arrival to completion."""
    draft_tokens: int = 0
    """Speculative tokens proposed."""
    draft_accepted: int = 0
    """Speculative tokens accepted."""


@dataclass
class GenerationResult:
    """The end of a request."""

    id: str
    """The request's id."""
    text: str
    """Everything generated (stop strings excluded)."""
    done_reason: DoneReason
    """Why generation ended."""
    timings: Timings
    """Timings and token counts."""
    error: str | None = None
    """Set when done_reason is ``error``."""


@dataclass
class EmbeddingRequest:
    """Embed one or more texts."""

    id: str
    """Unique per connection."""
    inputs: list[str]
    """Texts to embed."""
    truncate: bool = True
    """Cut inputs longer than the context instead of failing."""
    normalize: bool = True
    """L2-normalise each vector."""


@dataclass
class EmbeddingResult:
    """Vectors for an :class:`EmbeddingRequest`."""

    id: str
    """The request's id."""
    embeddings: list[list[float]]
    """One vector per input."""
    prompt_tokens: int
    """Tokens evaluated over all inputs."""
    total_ms: float
    """Time taken."""


@dataclass
class SlotStats:
    """One slot's state."""

    id: int
    """Slot (sequence) number."""
    state: Literal["idle", "prefill", "decode"]
    """What the slot is doing."""
    request_id: str | None = None
    """The request it serves."""
    cached_tokens: int = 0
    """Tokens of KV cache the slot holds."""
    prompt_tokens: int = 0
    """Prompt length of the current request."""
    prefilled_tokens: int = 0
    """How much of the prompt is done."""
    generated_tokens: int = 0
    """Tokens generated so far for the current request."""


@dataclass
class Stats:
    """A runner's gauges, for /api/ps, /metrics and the dashboard."""

    slots: list[SlotStats]
    """Every slot."""
    waiting: int
    """Requests waiting for a slot."""
    kv_cells_used: int
    """KV cache cells in use (shared prefixes count once)."""
    kv_cells_total: int
    """KV cache size in cells."""
    decode_tokens_per_s: float
    """Generated tokens per second over the last few seconds, all slots together."""
    prefill_tokens_per_s: float
    """Prompt tokens per second over the last few seconds."""
    requests_total: int = 0
    """Requests finished since the runner started."""


@dataclass
class RunnerConfig:
    """How a runner loads its model (command-line flags of the runner process)."""

    model_path: str
    """The GGUF file (the first part of a split model)."""
    extra_model_paths: list[str] = field(default_factory=list)
    """The other parts of a split model, in order."""
    n_slots: int = 4
    """Parallel sequences (n_seq_max)."""
    n_ctx_per_slot: int = 4096
    """Context length each slot may use."""
    n_batch: int = 512
    """Tokens per llama_decode call."""
    kv_cells: int = 0
    """KV cache size in cells; 0 = n_slots x n_ctx_per_slot. Smaller overcommits the unified
    cache: slots may still grow to n_ctx_per_slot while few of them are long at once."""
    n_threads: int = 0
    """0 = physical cores."""
    n_gpu_layers: int = -1
    """-1 = all layers when the build has a GPU backend, else 0."""
    kv_cache_type: str = "f16"
    """f16, q8_0 or q4_0."""
    flash_attention: str = "auto"
    """auto, on or off."""
    chat_template: str | None = None
    """Override for the GGUF's chat template."""
    log_path: str | None = None
    """Where llama.cpp's log goes."""
