"""The runner: one process per loaded model, serving llama.cpp with continuous batching.

Start it with ``python -m localllm.daemon.runner --model PATH --socket PATH [options]``
(``--help`` lists them). One engine thread owns the ``llama_context``; an asyncio server
on the Unix socket talks to it through queues.

Protocol
--------
Newline-delimited JSON over the Unix socket, both ways. Any number of requests may be in
flight on one connection; every message and event carries the request's ``id``.

Requests (client → runner)::

    {"op": "generate", "request": GenerationRequest}   stream of token events, then done
    {"op": "embed", "request": EmbeddingRequest}       one embedding event
    {"op": "cancel", "id": ID}                         the request ends with done_reason "cancel"
    {"op": "health", "id": ID}                         {"event": "health", "health": {...}}
    {"op": "stats", "id": ID}                          {"event": "stats", "stats": Stats}
    {"op": "tokenize", "id": ID, "text": STR}          {"event": "tokens", "tokens": [int]}

Events (runner → client)::

    {"event": "token", "id": ID, "text": STR}              new text, whole UTF-8 characters
    {"event": "done", "id": ID, "result": GenerationResult}
    {"event": "embedding", "id": ID, "result": EmbeddingResult}
    {"event": "error", "id": ID, "message": STR, "code": STR}

Error codes: ``bad_request``, ``context_overflow``, ``unsupported``, ``internal``. The shapes
of GenerationRequest, GenerationResult (with its Timings), EmbeddingRequest, EmbeddingResult and
Stats are the dataclasses in :mod:`localllm.daemon.runner.protocol`.

The daemon uses :class:`localllm.daemon.runner.client.RunnerProcess` to start a runner and
:class:`localllm.daemon.runner.client.RunnerClient` to talk to it; if the runner dies, every
pending request raises ``RunnerDiedError``.
"""

from .client import (
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
