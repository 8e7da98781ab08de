"""Embedding jobs on the engine thread: one batch of a job's inputs between two generation
steps."""

from __future__ import annotations

import collections
import logging
import math
import time
from collections.abc import Callable

from ..devices.governor import Governor, Kind
from ..lora.adapters import Adapters, applying
from ..runner.protocol import EmbeddingEvent, EmbeddingResult, ErrorEvent
from .jobs import EmbeddingJob
from .model import LlamaModel

__all__ = ["embed_step"]

log = logging.getLogger("localllm.runner.engine")


def embed_step(
    jobs: collections.deque[EmbeddingJob],
    model: LlamaModel,
    adapters: Adapters,
    governor: Governor,
    use_threads: Callable[[Kind], int],
) -> None:
    """Embed the next batch of inputs of the oldest embedding job in ``jobs`` (it leaves the
    queue with its result or its error once done).

    A batch holds about as many tokens as a generation step's batch (at least one input,
    which must be embedded whole), so a large embedding request delays the streams
    generating meanwhile by one batch per step instead of stalling them until it is done.
    ``use_threads`` sets (and returns) the thread count ``governor`` chooses for a batch;
    the batch's time goes back to ``governor``.
    """
    job = jobs[0]
    start = len(job.vectors)
    end, tokens = start, 0
    budget = min(model.n_batch, model.n_ctx_per_slot)
    while (
        end < len(job.inputs)
        and end - start < model.embed_batch_sequences
        and (end == start or tokens + len(job.inputs[end]) <= budget)
    ):
        tokens += len(job.inputs[end])
        end += 1
    try:
        threads = use_threads("batch")
        started = time.perf_counter()
        vectors = model.embed_many(
            job.inputs[start:end], rank=job.rank, prepare=applying(adapters, job.adapters)
        )
        governor.observe("batch", threads, tokens, time.perf_counter() - started)
    except Exception as exc:
        log.exception("embedding failed")
        jobs.popleft()
        job.emit(ErrorEvent(id=job.id, message=f"embedding failed: {exc}", code="internal"))
        return
    for vector in vectors:
        if job.normalize:
            norm = math.sqrt(sum(v * v for v in vector)) or 1.0
            vector = [v / norm for v in vector]
        job.vectors.append(vector)
    if len(job.vectors) < len(job.inputs):
        return
    jobs.popleft()
    result = EmbeddingResult(
        id=job.id,
        embeddings=job.vectors,
        prompt_tokens=sum(len(t) for t in job.inputs),
        total_ms=(time.perf_counter() - job.arrived) * 1000,
    )
    job.emit(EmbeddingEvent(id=job.id, result=result))
