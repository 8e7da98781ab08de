"""The work an engine is handed: generation and embedding jobs, prepared by the runner's
server (prompt rendered and tokenized, images encoded) and run on the engine thread.

Kept apart from :mod:`.engine` so that the slots, the drafters and the server can name a job
without importing the engine.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..lora.adapterset import NO_ADAPTERS, AdapterSet
from ..runner.protocol import (
    DoneEvent,
    ErrorEvent,
    Event,
    GenerationResult,
    SamplingOptions,
    Timings,
    TokenEvent,
)
from .reasoning import ReasoningBudget
from .scoring import PromptScore
from .vision import ImageEmbeddings

__all__ = [
    "EmbeddingJob",
    "Emit",
    "GenerationJob",
    "done_event",
    "joined_tokens",
    "stopped_error",
]

Emit = Callable[[Event], None]
"""Where a job's events go (called on the engine thread)."""


@dataclass
class GenerationJob:
    """A prepared generation request: prompt tokens and sampling, plus where events go."""

    id: str
    prompt: list[int]
    options: SamplingOptions
    grammar: str | None
    emit: Emit
    arrived: float = field(default_factory=time.perf_counter)
    cancelled: bool = False
    return_context: bool = False
    """Put prompt and generated tokens in the result (Ollama's ``context``)."""
    keep: int = 0
    """Leading tokens a context shift keeps (the system prompt)."""
    render_special: bool = False
    """Emit control tokens as their text (for tool-call and thinking parsers)."""
    images: dict[int, ImageEmbeddings] = field(default_factory=dict)
    """The prompt's images by the position where each starts (their pseudo-tokens follow)."""
    score: PromptScore | None = None
    """Collects the prompt's log probabilities (``options.prompt_logprobs``)."""
    budget: ReasoningBudget | None = None
    """Ends the reasoning when its budget is spent (``options.reasoning_budget``)."""
    adapters: AdapterSet = NO_ADAPTERS
    """The LoRA adapters it runs with (see :mod:`.adapters`)."""

    def image_start(self, position: int) -> int:
        """``position``, or the start of the image it falls inside (cached prefixes are
        reused whole images at a time)."""
        for start, image in self.images.items():
            if start < position < start + image.n_tokens:
                return start
        return position

    def text_run(self, position: int) -> int:
        """Prompt tokens from ``position`` up to the next image (0 when one starts there)."""
        end = len(self.prompt)
        for start in self.images:
            if position <= start < end:
                end = start
        return end - position


@dataclass
class EmbeddingJob:
    """Token sequences to embed."""

    id: str
    inputs: list[list[int]]
    normalize: bool
    emit: Emit
    arrived: float = field(default_factory=time.perf_counter)
    vectors: list[list[float]] = field(default_factory=list)
    """Embeddings of ``inputs[:len(vectors)]``, computed so far."""
    rank: bool = False
    """Score each input with the rank head (a reranker) instead of embedding it."""
    adapters: AdapterSet = NO_ADAPTERS
    """The LoRA adapters it embeds with."""


def stopped_error(job_id: str) -> ErrorEvent:
    """The error a job gets when the engine has stopped (or stops before running it)."""
    return ErrorEvent(id=job_id, message="the engine has stopped", code="internal")


def done_event(
    job_id: str, text: str, reason: str, timings: Timings, error: str | None = None
) -> DoneEvent:
    """A job's final event: its text, why it ended, its timings (and error)."""
    return DoneEvent(
        id=job_id,
        result=GenerationResult(
            id=job_id,
            text=text,
            done_reason=reason,
            timings=timings,
            error=error,  # type: ignore[arg-type]
        ),
    )


def joined_tokens(first: TokenEvent, then: TokenEvent) -> TokenEvent:
    """One event for two consecutive pieces of a generation's text."""
    logprobs = first.logprobs
    if then.logprobs is not None:
        logprobs = then.logprobs if logprobs is None else logprobs + then.logprobs
    return TokenEvent(first.id, first.text + then.text, logprobs)
