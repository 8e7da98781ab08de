"""The runner's wire types: what the daemon asks a runner and what it gets back.

These dataclasses are the narrow interface between the daemon and the engine; they import
nothing from llama.cpp. On the wire each message is one JSON object per line (NDJSON) over the
runner's Unix socket; see :mod:`localllm.daemon.runner` for the protocol.

Both directions are typed: a request is one of the :data:`Request` classes (tagged ``op``), an
event one of the :data:`Event` classes (tagged ``event``), and :func:`encode` / :func:`decode`
are the only way either side turns them into bytes or back. Every message carries its request's
``id`` at the top level, so the side that reads it can always answer or route it, even when the
rest of the message is malformed.
"""

from __future__ import annotations

import json
import math
import types
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, ClassVar, Literal, Union

import orjson

__all__ = [
    "IMAGE_MARKER",
    "AdapterFile",
    "AdapterStats",
    "AdapterUse",
    "AdaptersEvent",
    "AdaptersOp",
    "CancelOp",
    "DetokenizeOp",
    "DoneEvent",
    "DoneReason",
    "EmbedOp",
    "EmbeddingEvent",
    "EmbeddingRequest",
    "EmbeddingResult",
    "ErrorCode",
    "ErrorEvent",
    "Event",
    "GenerateOp",
    "GenerationRequest",
    "GenerationResult",
    "HealthEvent",
    "HealthOp",
    "PromptReadyEvent",
    "ProtocolError",
    "Request",
    "RunnerConfig",
    "SamplingOptions",
    "SlotStats",
    "Stats",
    "StatsEvent",
    "StatsOp",
    "TextEvent",
    "ThreadStats",
    "ThreadsEvent",
    "ThreadsOp",
    "Timings",
    "TokenEvent",
    "TokenLogprob",
    "TokenizeOp",
    "TokensEvent",
    "decode",
    "encode",
    "from_dict",
]

IMAGE_MARKER = "<__media__>"
"""Where an image goes in a prompt (mtmd's default marker): one per entry of
:attr:`GenerationRequest.images`, in order, in the rendered prompt."""

DoneReason = Literal["stop", "length", "cancel", "error"]
ErrorCode = Literal[
    "bad_request",
    "context_overflow",
    "unsupported",
    "internal",
    "overloaded",
    "runner_died",
    "cancelled",
]


class ProtocolError(ValueError):
    """A line that is not a valid message; ``id`` is the request it names, when readable."""

    def __init__(self, message: str, request_id: str | None = None) -> None:
        super().__init__(message)
        self.id = request_id


def _nests_dataclass(hint: Any) -> bool:
    """Whether values of type ``hint`` need converting (a dataclass is somewhere inside)."""
    if isinstance(hint, type) and is_dataclass(hint):
        return True
    return any(_nests_dataclass(arg) for arg in typing.get_args(hint))


def _convert(hint: Any, value: Any) -> Any:
    """``value`` as type ``hint`` where that is a dataclass (or a list or optional of one)."""
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        return _convert(inner[0], value) if len(inner) == 1 else value
    if origin is list and isinstance(value, list):
        (item,) = typing.get_args(hint) or (Any,)
        return [_convert(item, v) for v in value]
    if isinstance(hint, type) and is_dataclass(hint):
        if not isinstance(value, dict):
            raise TypeError(f"{hint.__name__} must be an object")
        return from_dict(hint, value)
    return value


def _fields_of(cls: type) -> dict[str, Any]:
    """Field name → its type hint when values need converting, else None (cached per class:
    this runs for every token event)."""
    cached = _FIELDS.get(cls)
    if cached is None:
        hints = typing.get_type_hints(cls)
        cached = _FIELDS[cls] = {
            f.name: hints[f.name] if _nests_dataclass(hints[f.name]) else None for f in fields(cls)
        }
    return cached


_FIELDS: dict[type, dict[str, Any]] = {}


def from_dict(cls: type, data: dict[str, Any]) -> Any:
    """Build dataclass ``cls`` from ``data``, nested dataclasses included; unknown keys are
    ignored (forward compatible). Missing required fields raise ``TypeError``."""
    known = _fields_of(cls)
    values = {}
    for key, value in data.items():
        if key in known:
            hint = known[key]
            values[key] = value if hint is None else _convert(hint, value)
    return cls(**values)


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
    mirostat: int = 0
    """Mirostat sampling (1 or 2) aims at a steady surprise ``mirostat_tau`` instead of cutting
    the distribution with top-k/top-p; 0 disables."""
    mirostat_tau: float = 5.0
    """Mirostat's target surprise (cross-entropy): lower is more focused."""
    mirostat_eta: float = 0.1
    """Mirostat's learning rate: how fast it follows the text's actual surprise."""
    seed: int = -1
    """Random seed; -1 picks one."""
    num_predict: int = -1
    """Maximum tokens to generate; -1 means no limit (the context shifts when full)."""
    num_keep: int = -1
    """Prompt tokens a context shift keeps; -1 means the system prompt (or the BOS token)."""
    shift: bool = True
    """When a generation reaches the end of its context, drop the oldest half of the tokens
    after ``num_keep`` and go on (Ollama's context shift); False ends it with ``length``."""
    stop: list[str] = field(default_factory=list)
    """Stop strings; the matched text is not emitted."""
    grammar: str | None = None
    """A GBNF grammar constraining the output."""
    json_schema: dict[str, Any] | None = None
    """A JSON schema constraining the output (converted to GBNF by the runner)."""
    json_mode: bool = False
    """Constrain the output to any JSON value (Ollama's ``format: "json"``)."""
    grammar_triggers: list[str] = field(default_factory=list)
    """Make ``grammar`` lazy: free text until one of these regular expressions matches the
    whole output so far (llama.cpp's lazy grammar patterns, for example
    ``[\\s\\S]*?(<tool_call>)[\\s\\S]*``), then the grammar constrains the rest from the
    first group's start. Tool calls use this: prose is free, a call once begun is valid."""
    num_draft: int = -1
    """Most speculative draft tokens per step; 0 turns speculation off for this
    request, -1 takes the runner's default."""
    logprobs: bool = False
    """Report each generated token's log probability (from the model's own distribution)."""
    top_logprobs: int = 0
    """With ``logprobs``: also the this many most likely tokens at each position (0-20)."""
    logit_bias: dict[str, float] = field(default_factory=dict)
    """Added to the logits of token ids (keys are ids as strings, as OpenAI sends them);
    -100 or less bans a token."""
    prompt_logprobs: bool = False
    """Report every prompt token's log probability given the tokens before it (with
    ``top_logprobs`` alternatives), from the prefill's own logits; the prompt is then
    evaluated whole, without a cached prefix."""
    prefill_only: bool = False
    """Evaluate the prompt and generate nothing (a scoring request's ``max_tokens: 0``):
    the generation ends with ``length`` and no token."""
    reasoning_tags: list[str] = field(default_factory=list)
    """``[open, close]``: the tags of the model's reasoning block, when the answer may hold
    one (for ``reasoning_budget`` and ``closed_triggers``)."""
    reasoning_budget: int = -1
    """Most tokens of reasoning (-1: no limit). When they are spent, the close tag is
    inserted in place of sampled tokens (llama-server's way) and the answer follows."""
    closed_triggers: list[str] | None = None
    """The grammar's triggers when the rendered prompt already closed the reasoning block
    (the template switched reasoning off): they replace ``grammar_triggers``, which wait for
    the close tag."""
    grammar_after_reasoning: bool = False
    """The grammar (a format, a forced call) constrains the answer after the reasoning
    block: lazy, triggered by the close tag; from the first token where the rendered prompt
    already closed the block."""


@dataclass
class TokenLogprob:
    """A generated token's log probability, in the shape both API families use."""

    token: str
    """The token's text (a partial UTF-8 character shows as U+FFFD)."""
    logprob: float
    """Natural log of its probability under the model (before sampling transforms)."""
    bytes: list[int]
    """The token's bytes."""
    top_logprobs: list[TokenLogprob] = field(default_factory=list)
    """The most likely tokens at this position, best first (as many as asked for)."""


@dataclass
class AdapterUse:
    """A LoRA adapter a request runs with: one the runner loaded (:class:`AdaptersOp`)."""

    digest: str
    """``sha256:<hex>`` of the adapter's GGUF."""
    scale: float = 1.0
    """How strongly it applies (0: not at all)."""


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
    context: list[int] | None = None
    """Tokens of an earlier exchange (Ollama's ``context``), put before the prompt."""
    return_context: bool = False
    """Return the prompt and generated tokens in the result's ``context``."""
    tools: list[dict[str, Any]] | None = None
    """Tool definitions (OpenAI's ``{"type": "function", "function": {...}}``), rendered by the
    chat template as Hugging Face's ``apply_chat_template(tools=...)`` does."""
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra variables for the chat template (``enable_thinking``, ``reasoning_effort``...)."""
    render_special: bool = False
    """Emit control tokens (``<|python_tag|>``, ``[TOOL_CALLS]``, ``<think>``...) as their text,
    for the API's tool-call and thinking parsers; end-of-generation tokens never appear."""
    images: list[str] = field(default_factory=list)
    """Standard base64 (no ``data:`` prefix) of each image file's bytes (PNG, JPEG, GIF, BMP),
    one per :data:`IMAGE_MARKER` in the rendered prompt, in order of appearance. Needs a runner
    with a vision projector (``unsupported`` otherwise); a count mismatch or an image that
    cannot be decoded is ``bad_request`` naming the image."""
    adapters: list[AdapterUse] = field(default_factory=list)
    """The LoRA adapters to run with (none: the base model alone); each must be loaded
    (``bad_request`` otherwise). Requests of different adapter sets take turns by step."""


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
    """From the first generated token to the last (``parked_ms`` included)."""
    parked_ms: float = 0.0
    """Waiting for a slot after the first token: a prompt prefilled while every slot was
    busy gets its first token at once, then decodes once a slot frees (0: it did not)."""
    sample_ms: float = 0.0
    """Sampling the first token, from the end of the step that gave its logits."""
    detokenize_ms: float = 0.0
    """Turning the first token into text."""
    decode_tokens_per_s: float = 0.0
    """Generated tokens per second after the first (``parked_ms`` excluded)."""
    total_ms: float = 0.0
    """From arrival to completion."""
    draft_tokens: int = 0
    """Speculative tokens proposed."""
    draft_accepted: int = 0
    """Speculative tokens accepted."""
    drafter: str = ""
    """What drafted them: ``ngram`` or ``draft:<draft model>`` (empty when none were)."""
    threads_min: int = 0
    """Fewest CPU threads a decode step of this request ran with (0: not known)."""
    threads_max: int = 0
    """Most CPU threads a decode step of this request ran with."""
    threads_of: int = 0
    """The runner's own thread count: fewer means the governor held some back."""
    threads_why: str = ""
    """Why it ran with fewer than ``threads_of`` (the governor's reason; empty when it did
    not)."""


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
    context: list[int] | None = None
    """Prompt and generated tokens, when the request asked (Ollama's ``context``)."""
    stop_sequence: str | None = None
    """The stop string that ended the generation (done_reason ``stop``), if one did."""
    prompt_logprobs: list[TokenLogprob] | None = None
    """With ``prompt_logprobs``: one entry per prompt token; the first has nothing before it
    (its ``logprob`` is 0.0 and means nothing)."""
    budget_exhausted: bool = False
    """The reasoning budget ran out: the close tag was inserted there."""


@dataclass
class EmbeddingRequest:
    """Embed one or more texts."""

    id: str
    """Unique per connection."""
    inputs: list[str]
    """Texts to embed."""
    token_inputs: list[list[int]] | None = None
    """Inputs given as the model's token ids instead of texts (then ``inputs`` is empty)."""
    truncate: bool = True
    """Cut inputs longer than the context instead of failing."""
    normalize: bool = True
    """L2-normalise each vector."""
    rank_pairs: list[list[str]] | None = None
    """``[query, document]`` pairs to score instead (a reranker: rank pooling): each one's
    "embedding" is its relevance score alone (then ``inputs`` is empty)."""
    adapters: list[AdapterUse] = field(default_factory=list)
    """The LoRA adapters to embed with (as :attr:`GenerationRequest.adapters`)."""


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
class AdapterStats:
    """One LoRA adapter a runner holds on its base model."""

    digest: str
    """``sha256:<hex>`` of its GGUF."""
    size: int
    """Bytes its tensors take (llama.cpp's buffers; counted once, whatever uses it)."""
    alpha: float = 0.0
    """``adapter.lora.alpha``."""
    slots: int = 0
    """Slots serving a request that runs with it now."""
    requests_total: int = 0
    """Requests that ran with it since it loaded."""


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
    saved_prefix_ram_bytes: int = 0
    """Idle prefixes' KV state kept in host RAM."""
    saved_prefix_disk_bytes: int = 0
    """Idle prefixes' KV state kept on disk for this model."""
    prefix_restores: int = 0
    """Saved prefixes restored into a slot since the runner started."""
    engine_seconds: float = 0.0
    """Seconds since the engine thread started; the next four say where they went."""
    engine_idle_seconds: float = 0.0
    """Of those, waiting for work with no slot busy."""
    engine_step_seconds: float = 0.0
    """Of those, in steps (one generation decode each, with the prefix copies, image decodes,
    planning, sampling, detokenizing and event hand-over around it); the rest is admitting
    requests, the prefix cache's tiers and embeddings."""
    engine_decode_seconds: float = 0.0
    """Of the steps' time, inside ``llama_decode``."""
    engine_decodes: int = 0
    """Generation decodes (steps) run."""
    threads: ThreadStats | None = None
    """What the CPU governor does now (None from a runner without one)."""
    adapters: list[AdapterStats] = field(default_factory=list)
    """The LoRA adapters loaded on the base model."""
    adapter_switches: int = 0
    """Times a step ran with another adapter set than the step before (each costs llama.cpp
    a scheduler reserve)."""


@dataclass
class ThreadStats:
    """What a runner's CPU governor does now (see :mod:`.governor`)."""

    decode: int
    """Threads a decode step (generating tokens only) uses now."""
    batch: int
    """Threads a step with prompt tokens (prefill, embeddings) uses now."""
    max: int
    """The runner's own thread count: the most it may use."""
    budget: int
    """The daemon's share of the cores for this runner (``max`` while it works alone)."""
    budget_reason: str
    """Why the daemon gave that share."""
    others: float | None
    """Cores other processes used over the last half second (None: not known here)."""
    mode: Literal["auto", "fixed"]
    """``auto``: governed; ``fixed``: a thread count was asked for or the governor is off."""
    reason: str
    """Why the decode count is what it is, in a few words."""
    limit: Literal["max", "cpu", "budget", "tuner", "fixed"] = "max"
    """What holds the decode count where it is: the runner's own count, other processes'
    CPU use, the daemon's share, the tuner (fewer ran faster), or a fixed count."""
    last_change: str | None = None
    """The latest change of either count, as ``2 → 1: CPU busy (...)``."""
    last_change_at: float | None = None
    """When it happened (seconds since the epoch)."""
    changes: int = 0
    """Changes of either count since the runner started."""

    def describe(self) -> str:
        """``2 of 2``, ``1 of 2 (CPU busy: other processes use 1.0 of 2 cores)``."""
        if self.decode >= self.max or not self.reason:
            return f"{self.decode} of {self.max}"
        return f"{self.decode} of {self.max} ({self.reason})"


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
    """Context length each slot may use; 0 lets the memory plan choose (``memory_plan``)."""
    n_batch: int = 512
    """Tokens per llama_decode call."""
    kv_cells: int = 0
    """KV cache size in cells; 0 = n_slots x n_ctx_per_slot. Smaller overcommits the unified
    cache: slots may still grow to n_ctx_per_slot while few of them are long at once."""
    n_ahead: int = 0
    """KV sequences beyond the slots where waiting prompts are prefilled for their first
    token while every slot is busy (each as large as a slot's; they never decode)."""
    n_threads: int = 0
    """0 = physical cores."""
    fixed_threads: bool = False
    """Keep ``n_threads`` whatever the machine does (a thread count the request or Modelfile
    asked for, or ``LOCALLLM_GOVERNOR=off``); else the CPU governor adjusts it between steps."""
    n_gpu_layers: int = -1
    """-1 = all layers when the build has a GPU backend (as many as fit, with
    ``memory_plan``), else 0."""
    main_gpu: int = 0
    """The GPU that holds the model (or, split by layer, its small tensors and the KV scratch)."""
    use_mmap: bool = True
    """Map the GGUF into memory (pages load on demand and are shared) instead of reading it."""
    use_mlock: bool = False
    """Lock the weights in RAM so the system never swaps them out (needs the memlock limit)."""
    kv_cache_type: str = "f16"
    """f16, q8_0 or q4_0."""
    flash_attention: str = "auto"
    """auto, on or off."""
    chat_template: str | None = None
    """Override for the GGUF's chat template."""
    log_path: str | None = None
    """Where llama.cpp's log goes."""
    num_draft: int = 0
    """Default most draft tokens per step for speculative decoding (0: off)."""
    draft_model: str | None = None
    """A draft model's GGUF (same vocabulary, smaller): it drafts instead of n-gram lookup."""
    draft_name: str | None = None
    """The draft model's name, for reports (its file name when not given)."""
    kv_cache_dir: str | None = None
    """Root folder of saved prompt prefixes (None: no disk tier)."""
    kv_cache_ram: int = 0
    """Bytes of host RAM for saved prefixes (0: no RAM tier)."""
    kv_cache_disk: int = 0
    """Bytes of disk for saved prefixes, over the whole folder (0: no disk tier)."""
    projector: str | None = None
    """The vision projector GGUF (``mmproj``) that lets the model read images (None: text only)."""
    cpu_repack: bool | None = None
    """Repack weights into llama.cpp's extra CPU buffer types (AMX, CPU_REPACK); None: as the
    CPU probe decides (:func:`.cpu.decide`). The daemon always passes its decision."""
    rpc_workers: list[str] = field(default_factory=list)
    """``host:port`` of RPC workers (``localllm worker``) whose devices take a share of the
    layers, by free memory; each must answer before the load (see :mod:`.rpc`)."""
    rpc_lost: list[str] = field(default_factory=list, compare=False)
    """Workers of ``rpc_workers`` that died under this model's previous runner: this load goes
    on without those still down when the model fits on the rest. Not part of the config's
    identity, so the next request naming the same workers does not reload again."""
    memory_plan: bool = False
    """Plan the load against free memory first (:mod:`localllm.daemon.memory.plan`): choose the
    context and GPU layers left open, and refuse before allocating what cannot fit."""
    memory_reserved: dict[str, int] = field(default_factory=dict)
    """Bytes per device that other loaded models may still grow into (not free for this one)."""
    mapped_ram: int = 0
    """Bytes of other runners' mapped weights, which MemAvailable counts as reclaimable."""
    adapters: list[AdapterUse] = field(default_factory=list, compare=False)
    """The LoRA adapters (and scales) a request runs with: not how the runner loads, so not
    part of the config's identity (models sharing the base share the runner)."""
    gpu_memory: int = 0
    """The most bytes the memory plan puts on each local GPU (``LOCALLLM_GPU_MEMORY``; 0: what
    is free)."""
    cpu_only: bool = False
    """Run without any GPU: the runner starts with every GPU backend's devices hidden (the
    scheduler's fallback after the GPU failed twice)."""


# -- messages -----------------------------------------------------------------------------------


@dataclass
class _Message:
    """What every message carries first: the ``id`` of the request it is about."""

    id: str


@dataclass
class _Op(_Message):
    """A request (daemon → runner); its class's ``op`` is its tag on the wire."""

    op: ClassVar[str]


@dataclass
class _Event(_Message):
    """An event (runner → daemon); its class's ``event`` is its tag on the wire."""

    event: ClassVar[str]


# -- messages: requests (daemon → runner) -------------------------------------------------------


@dataclass
class GenerateOp(_Op):
    """Start a generation: ``prompt_ready`` (or an error), ``token`` events, then ``done``."""

    op: ClassVar[str] = "generate"
    request: GenerationRequest


@dataclass
class EmbedOp(_Op):
    """Embed texts: one ``embedding`` event (or an error)."""

    op: ClassVar[str] = "embed"
    request: EmbeddingRequest


@dataclass
class CancelOp(_Op):
    """Cancel request ``id``; it ends with a ``done`` event whose reason is ``cancel``."""

    op: ClassVar[str] = "cancel"


@dataclass
class HealthOp(_Op):
    """Ask for the loaded model's facts: one ``health`` event."""

    op: ClassVar[str] = "health"


@dataclass
class StatsOp(_Op):
    """Ask for the engine's gauges: one ``stats`` event."""

    op: ClassVar[str] = "stats"


@dataclass
class ThreadsOp(_Op):
    """The daemon's share of the cores for this runner: one ``threads`` event.

    The runner's governor uses at most ``threads`` from its next step on; ``cpus`` (when
    given) are the CPUs its threads may run on, None leaving them as they are."""

    op: ClassVar[str] = "threads"
    threads: int
    reason: str
    cpus: list[int] | None = None


@dataclass
class AdapterFile:
    """A LoRA adapter GGUF for a runner to load."""

    digest: str
    """``sha256:<hex>`` of the file: how requests name it."""
    path: str
    """The file (a store blob)."""


@dataclass
class AdaptersOp(_Op):
    """Load LoRA adapters on the base model (those loaded already are kept): one ``adapters``
    event with every adapter loaded, or an error naming the one llama.cpp refused."""

    op: ClassVar[str] = "adapters"
    adapters: list[AdapterFile]


@dataclass
class TokenizeOp(_Op):
    """Tokenize text: one ``tokens`` event."""

    op: ClassVar[str] = "tokenize"
    text: str
    add_special: bool = False
    """Add BOS (when the model wants one)."""
    parse_special: bool = False
    """Turn special-token text (``<|im_start|>``) into those tokens."""


@dataclass
class DetokenizeOp(_Op):
    """Turn token ids back into text: one ``text`` event."""

    op: ClassVar[str] = "detokenize"
    tokens: list[int]


Request = (
    GenerateOp
    | EmbedOp
    | CancelOp
    | HealthOp
    | StatsOp
    | ThreadsOp
    | AdaptersOp
    | TokenizeOp
    | DetokenizeOp
)


# -- messages: events (runner → daemon) ---------------------------------------------------------


@dataclass
class PromptReadyEvent(_Event):
    """The prompt of a generation is rendered and tokenized and the request is queued: errors in
    the request itself (template, grammar, length) can no longer happen after this."""

    event: ClassVar[str] = "prompt_ready"
    prompt_tokens: int
    prompt_tail: str = ""
    """The end of the rendered prompt (up to 200 characters): whether it opens a reasoning
    block (``<think>``) or a tool call tells the API's parsers how the answer starts."""
    dropped_messages: int = 0
    """Older chat messages truncation left out to fit the context."""
    dropped_tokens: int = 0
    """Prompt tokens truncation left out (those messages' included)."""
    template_ms: float = 0.0
    """Time the runner spent rendering the chat template."""
    tokenize_ms: float = 0.0
    """Time the runner spent tokenizing the prompt."""
    read_at: int = 0
    """When the runner read the request (``time.perf_counter_ns``: one clock for the
    processes of a machine, so the daemon can tell the hand-over from the engine's work)."""
    ready_at: int = 0
    """When the runner sent this event (``time.perf_counter_ns``)."""


@dataclass
class TokenEvent(_Event):
    """New text of a generation: whole UTF-8 characters."""

    event: ClassVar[str] = "token"
    text: str
    logprobs: list[TokenLogprob] | None = None
    """When asked for: one entry per token generated since the previous event (text may lag
    tokens: partial characters and possible stop strings are held back)."""


@dataclass
class DoneEvent(_Event):
    """A generation ended (any reason, including ``cancel`` and ``error``)."""

    event: ClassVar[str] = "done"
    result: GenerationResult


@dataclass
class EmbeddingEvent(_Event):
    """The vectors of an embedding request."""

    event: ClassVar[str] = "embedding"
    result: EmbeddingResult


@dataclass
class ErrorEvent(_Event):
    """Request ``id`` failed before producing its result; it is over."""

    event: ClassVar[str] = "error"
    id: str | None  # type: ignore[assignment]  # None: the line named no readable request
    message: str
    code: ErrorCode = "internal"


@dataclass
class HealthEvent(_Event):
    """The answer to :class:`HealthOp`."""

    event: ClassVar[str] = "health"
    health: dict[str, Any]


@dataclass
class StatsEvent(_Event):
    """The answer to :class:`StatsOp`."""

    event: ClassVar[str] = "stats"
    stats: Stats


@dataclass
class ThreadsEvent(_Event):
    """The answer to :class:`ThreadsOp`: the governor as it stands (the new share applies from
    the next step)."""

    event: ClassVar[str] = "threads"
    threads: ThreadStats


@dataclass
class AdaptersEvent(_Event):
    """The answer to :class:`AdaptersOp`: every adapter the runner holds."""

    event: ClassVar[str] = "adapters"
    adapters: list[AdapterStats]


@dataclass
class TokensEvent(_Event):
    """The answer to :class:`TokenizeOp`."""

    event: ClassVar[str] = "tokens"
    tokens: list[int]


@dataclass
class TextEvent(_Event):
    """The answer to :class:`DetokenizeOp`."""

    event: ClassVar[str] = "text"
    text: str


Event = (
    PromptReadyEvent
    | TokenEvent
    | DoneEvent
    | EmbeddingEvent
    | ErrorEvent
    | HealthEvent
    | StatsEvent
    | ThreadsEvent
    | AdaptersEvent
    | TokensEvent
    | TextEvent
)

# The unions above are the only lists of the message classes: the tags are read from them.
_REQUESTS: dict[str, type] = {cls.op: cls for cls in typing.get_args(Request)}
_EVENTS: dict[str, type] = {cls.event: cls for cls in typing.get_args(Event)}


def _shallow(value: Any) -> dict[str, Any]:
    """A dataclass as a dict of its fields, for json.dumps to walk (no deep copy)."""
    cls = type(value)
    names = _NAMES.get(cls)
    if names is None:
        if not is_dataclass(cls):
            raise TypeError(f"{cls.__name__} is not JSON serialisable")
        names = _NAMES[cls] = tuple(f.name for f in fields(cls))
    return {name: getattr(value, name) for name in names}


_NAMES: dict[type, tuple[str, ...]] = {}


_ENCODER = json.JSONEncoder(separators=(",", ":"), default=_shallow)


def encode(message: Request | Event) -> bytes:
    """One NDJSON line for ``message``: its tag (``op`` or ``event``), its ``id``, its fields."""
    if message.__class__ is TokenEvent and message.logprobs is None:  # type: ignore[union-attr]
        # The line written for every generated token: spliced, the text encoded by orjson.
        try:
            return _TOKEN_LINE % (orjson.dumps(message.id), orjson.dumps(message.text))  # type: ignore[union-attr]
        except orjson.JSONEncodeError:
            pass  # a lone surrogate: the general path escapes it
    if message.__class__ is GenerateOp and _plain(message.request):  # type: ignore[union-attr]
        # Every generation's way to the runner: orjson writes the dataclasses itself (38
        # against 105 us after an idle gap), for a request with no number it would write
        # otherwise (see _plain).
        try:
            return _GENERATE_LINE + orjson.dumps(message)[1:] + b"\n"
        except orjson.JSONEncodeError:
            pass  # a lone surrogate, an integer over 64 bits: the general path
    if message.__class__ is PromptReadyEvent:
        # The acceptance, written while the engine thread waits for the GIL to admit the
        # request: orjson writes a dataclass itself (the same line; 28 against 73 us after an
        # idle gap). Its numbers are counts and measured times, never NaN or infinite (which
        # orjson would write as null).
        try:
            return _READY_LINE + orjson.dumps(message)[1:] + b"\n"
        except orjson.JSONEncodeError:
            pass  # a lone surrogate in the prompt's tail: the general path escapes it
    tag = "op" if hasattr(message, "op") else "event"
    body = {tag: getattr(message, tag), **_shallow(message)}
    # A lone surrogate in client text must not make the line unencodable: JSON escapes it.
    return (_ENCODER.encode(body) + "\n").encode()


_TOKEN_LINE = b'{"event":"token","id":%b,"text":%b,"logprobs":null}\n'
_GENERATE_LINE = b'{"op":"generate",'
# The sampling options held as floats: orjson writes a NaN or an infinity as null, where the
# general path writes them for the runner to read back.
_FLOAT_OPTIONS = tuple(f.name for f in fields(SamplingOptions) if f.type in ("float", float))


def _plain(request: GenerationRequest) -> bool:
    """Whether ``request`` holds only finite numbers where it holds floats, and none of the
    free-form JSON (tools, template variables, a schema, a message's structured parts) a
    client may have put a NaN or an infinity in."""
    options = request.options
    if request.tools or request.template_kwargs or options.json_schema is not None:
        return False
    for message in request.messages or ():
        for value in message.values():
            if value is not None and value.__class__ is not str:
                return False
    return (
        all(math.isfinite(getattr(options, name)) for name in _FLOAT_OPTIONS)
        and all(math.isfinite(bias) for bias in options.logit_bias.values())
        and all(math.isfinite(adapter.scale) for adapter in request.adapters)
    )


_READY_LINE = b'{"event":"prompt_ready",'


def _loads(line: bytes | str) -> Any:
    """JSON from one line: orjson, or the standard library for what only it reads (NaN and
    infinities, which the general encoder writes; lone surrogate escapes)."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        return json.loads(line)


def decode(line: bytes | str) -> Request | Event:
    """The message on one NDJSON line; :class:`ProtocolError` (carrying the request id when it
    can be read) for anything that is not a valid message."""
    try:
        data = _loads(line)
    except ValueError:
        raise ProtocolError("malformed message: not JSON") from None
    if not isinstance(data, dict):
        raise ProtocolError("malformed message: not an object")
    raw_id = data.get("id")
    request_id = raw_id if isinstance(raw_id, str) else None
    if data.get("event") == "token" and request_id is not None and data.get("logprobs") is None:
        # Every generated token: skip the generic field mapping.
        text = data.get("text")
        if isinstance(text, str) and "op" not in data:
            return TokenEvent(request_id, text)
    if "op" in data:
        cls = _REQUESTS.get(data["op"])
        kind = f"op {data['op']!r}"
    else:
        cls = _EVENTS.get(data.get("event"))  # type: ignore[arg-type]
        kind = f"event {data.get('event')!r}"
    if cls is None:
        raise ProtocolError(f"unknown {kind}", request_id)
    if request_id is None and not (cls is ErrorEvent and raw_id is None):
        raise ProtocolError(f"{kind} without a string id", None)
    try:
        return from_dict(cls, data)  # type: ignore[no-any-return]
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed {kind}: {exc}", request_id) from None
