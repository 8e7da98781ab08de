"""The runner: one process per loaded model, serving llama.cpp with continuous batching.

Start it with ``python -m localllm.daemon.runner --model PATH --socket PATH [options]``
(``--help`` lists them). One engine thread owns the ``llama_context``; an asyncio server
on the Unix socket talks to it through queues.

Protocol
--------
Newline-delimited JSON over the Unix socket, both ways. Any number of requests may be in
flight on one connection. Every message is a typed dataclass of
:mod:`localllm.daemon.runner.protocol`, encoded and decoded only by its ``encode``/``decode``
pair, and carries its request's ``id`` at the top level.

Requests (client → runner), tagged ``op``::

    {"op": "generate", "id": ID, "request": GenerationRequest}
        → prompt_ready (or error), token..., done
    {"op": "embed", "id": ID, "request": EmbeddingRequest}   → embedding (or error)
    {"op": "cancel", "id": ID}                 the request ends with done_reason "cancel"
    {"op": "health", "id": ID}                 → health
    {"op": "stats", "id": ID}                  → stats
    {"op": "threads", "id": ID, "threads": N, "reason": STR, "cpus": [int] | null}
                                               → threads (the daemon's share of the cores)
    {"op": "adapters", "id": ID, "adapters": [{"digest": D, "path": P}]}  → adapters
                                               (LoRA adapters loaded on the base model)
    {"op": "tokenize", "id": ID, "text": STR, "add_special": B, "parse_special": B} → tokens
    {"op": "detokenize", "id": ID, "tokens": [int]}                                → text

Events (runner → client), tagged ``event``::

    {"event": "prompt_ready", "id": ID, "prompt_tokens": N}  the request can no longer be refused
    {"event": "token", "id": ID, "text": STR}                new text, whole UTF-8 characters
    {"event": "done", "id": ID, "result": GenerationResult}
    {"event": "embedding", "id": ID, "result": EmbeddingResult}
    {"event": "error", "id": ID, "message": STR, "code": STR}
    {"event": "health" | "stats" | "threads" | "tokens" | "text", "id": ID, ...}

Every request ends: a generation with ``done`` (also when cancelled, or when the engine stops)
or ``error``; everything else with its answer or ``error``. A line the runner cannot read is
answered with an ``error`` naming its id when the id is readable. If the engine thread dies,
the runner process exits, so the daemon sees it die and starts a new one.

LoRA: a generation or embedding request's ``adapters`` (``[{"digest": D, "scale": S}]``) must
name adapters loaded by an ``adapters`` op (``bad_request`` otherwise); requests of different
adapter sets take turns step by step (see :mod:`.adapters`).

Error codes: ``bad_request``, ``context_overflow``, ``unsupported``, ``internal``.

Images: a runner started with ``--projector MMPROJ`` (``RunnerConfig.projector``) reads images.
A generation request's ``images`` are base64 image files (PNG, JPEG, GIF, BMP), one per
``IMAGE_MARKER`` (``<__media__>``) in the rendered prompt, in order. Without a projector such a
request is ``unsupported``; a marker count that does not match, or an image that cannot be
decoded (``image 2 could not be decoded``), is ``bad_request``. Each image takes as many
prompt tokens as it has embeddings (``prompt_tokens`` counts them). Health says ``vision``.

The daemon uses :class:`localllm.daemon.runner.client.ProcessRunner` (a process and a
:class:`~localllm.daemon.runner.client.RunnerClient` connected to it); if the runner dies,
every pending request raises ``RunnerDiedError``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .client import (
        GenerationStream,
        ProcessRunner,
        RunnerClient,
        RunnerDiedError,
        RunnerError,
        RunnerProcess,
        RunnerStartError,
        TokenChunk,
    )
from .protocol import (
    EmbeddingRequest,
    EmbeddingResult,
    GenerationRequest,
    GenerationResult,
    RunnerConfig,
    SamplingOptions,
    SlotStats,
    Stats,
    Timings,
)

__all__ = [
    "EmbeddingRequest",
    "EmbeddingResult",
    "GenerationRequest",
    "GenerationResult",
    "GenerationStream",
    "ProcessRunner",
    "RunnerClient",
    "RunnerConfig",
    "RunnerDiedError",
    "RunnerError",
    "RunnerProcess",
    "RunnerStartError",
    "SamplingOptions",
    "SlotStats",
    "Stats",
    "Timings",
    "TokenChunk",
]

# The daemon's side (the client) is imported on first use: a runner process imports this
# package for its own modules and has no use for the client, which brings the store's model
# records and the device listings (60 ms of every runner's start).
_CLIENT_NAMES = frozenset(
    {
        "GenerationStream",
        "ProcessRunner",
        "RunnerClient",
        "RunnerDiedError",
        "RunnerError",
        "RunnerProcess",
        "RunnerStartError",
        "TokenChunk",
    }
)


def __getattr__(name: str) -> Any:
    if name not in _CLIENT_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(".client", __name__), name)
    globals()[name] = value
    return value
