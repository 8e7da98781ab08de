"""The shapes of the daemon's answers, as the clients return them (typed dicts), and
:data:`Think`, the reasoning switch of :meth:`~localllm.client.Client.chat` and
:meth:`~localllm.client.Client.generate`."""

from __future__ import annotations

from typing import Any, Literal, TypedDict

# No __all__: every name here is exported by localllm.client, whose __all__ lists them.


Think = bool | Literal["low", "medium", "high", "max"]
"""``think`` on :meth:`Client.chat` and :meth:`Client.generate`: reasoning on or off, or its
level (``True`` is medium); not sending it (``None``) leaves the model's default. A model
whose template does not reason refuses anything but off with :class:`~localllm.APIError`
(400, ``"<model>" does not support thinking``)."""


# -- response shapes -------------------------------------------------------------------------


class ModelDetails(TypedDict, total=False):
    """``details`` of a model."""

    parent_model: str
    format: str
    family: str
    families: list[str] | None
    parameter_size: str
    quantization_level: str


class ModelSummary(TypedDict, total=False):
    """One entry of :meth:`Client.list_models`."""

    name: str
    model: str
    modified_at: str
    size: int
    digest: str
    details: ModelDetails


class LoadedModelInfo(TypedDict, total=False):
    """One entry of :meth:`Client.ps`; ``slots``, ``active_requests``, ``queued_requests``,
    ``runner_pid``, ``devices`` and ``rpc_dropped`` are localllm's additions."""

    name: str
    model: str
    size: int
    size_vram: int
    digest: str
    details: ModelDetails
    expires_at: str
    context_length: int
    slots: int
    active_requests: int
    queued_requests: int
    runner_pid: int
    loaded_at: str
    devices: list[dict[str, Any]]
    """For a model split across RPC workers: each device (``name``, ``kind``, ``endpoint``,
    ``layers``, ``first_layer``, ``output``, ``free``, ``total``), the local CPU first."""
    rpc_dropped: list[str]
    """Workers lost mid-request that this load went without."""
    pinned: bool


class ShowResponse(TypedDict, total=False):
    """:meth:`Client.show`."""

    license: str
    modelfile: str
    parameters: str
    template: str
    system: str
    details: ModelDetails
    model_info: dict[str, Any]
    capabilities: list[str]
    modified_at: str
    messages: list[dict[str, Any]]
    projector_info: dict[str, Any]
    """A vision model's projector GGUF metadata."""


class ChatMessage(TypedDict, total=False):
    """A chat message."""

    role: str
    content: str
    thinking: str
    """An answer's reasoning (sent back in the history as Ollama's CLI does)."""
    images: list[str]
    """Standard base64 of each image file's bytes (needs a model with vision)."""
    tool_calls: list[dict[str, Any]]
    """An answer's calls: ``{"id", "function": {"name", "arguments" (an object)}}``."""
    tool_name: str
    """On a tool message: the tool whose result it is."""
    tool_call_id: str
    """On a tool message: the call it answers."""


class _Final(TypedDict, total=False):
    done: bool
    done_reason: str
    total_duration: int
    load_duration: int
    prompt_eval_count: int
    prompt_eval_duration: int
    eval_count: int
    eval_duration: int
    ttft_duration: int
    queue_duration: int
    prompt_cached_count: int
    prompt_evaluated_count: int
    prompt_eval_rate: float
    eval_rate: float


class GenerateChunk(_Final, total=False):
    """A chunk of :meth:`Client.generate_stream`; the last (``done``) one has the timings:
    Ollama's nanosecond fields plus ``ttft_duration``, ``prompt_cached_count``,
    ``prompt_eval_rate`` and ``eval_rate``."""

    model: str
    created_at: str
    response: str
    thinking: str


class ChatChunk(_Final, total=False):
    """A chunk of :meth:`Client.chat_stream` (same timing fields as :class:`GenerateChunk`)."""

    model: str
    created_at: str
    message: ChatMessage


class ProgressLine(TypedDict, total=False):
    """A status line of :meth:`Client.pull` or :meth:`Client.create`."""

    status: str
    digest: str
    total: int
    completed: int


class EmbedResponse(TypedDict, total=False):
    """:meth:`Client.embed`."""

    model: str
    embeddings: list[list[float]]
    total_duration: int
    load_duration: int
    prompt_eval_count: int


class StatsSnapshot(TypedDict, total=False):
    """:meth:`Client.stats`: each loaded model's slots, KV use and rates, and the queue."""

    time: float
    queue_depth: int
    max_queue: int
    models: list[dict[str, Any]]
