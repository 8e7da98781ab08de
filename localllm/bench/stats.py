"""The statistics of a benchmark: what one request saw (:class:`Sample`), one level of a sweep
summarized over its requests (:class:`Point`, by :func:`summarize`), and the nearest-rank
:func:`percentile` the benchmarks in ``benchmarks/`` use too."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Point", "Sample", "percentile", "summarize"]

_ERRORS_KEPT = 3


@dataclass
class Sample:
    """What one request saw: client-side times and the server's own timings when it sends
    them. Times in ms or s as the field names say; rates in tokens/s."""

    target: str
    """Label of the target (server and setting) that answered."""
    sweep: str
    """``concurrency``, ``prompt`` or ``conversation``."""
    clients: int
    """Requests in flight together at this level (a conversation's users)."""
    prompt_tokens_target: int
    """Prompt length asked for (the conversation sweep: the turn, from 1)."""
    cache: str = "cold"
    """``cold`` (a prompt nobody sent before) or ``warm`` (the same prompt again; a
    conversation's later turns)."""
    round: int = 0
    """Round of the level (``--rounds``)."""
    client: int = 0
    """Index of the client in its level."""
    start_s: float = 0.0
    """When the request was sent, seconds since the benchmark began."""
    ok: bool = False
    """True when the answer arrived whole."""
    error: str | None = None
    """Why it failed."""
    status: int | None = None
    """HTTP status of a refused request."""
    ttft_ms: float | None = None
    """Request sent → first text, measured here."""
    duration_s: float | None = None
    """Request sent → answer complete."""
    tokens: int = 0
    """Tokens generated (the server's count when it gives one, else text chunks)."""
    chunks: int = 0
    """Text chunks received."""
    stream_tps: float | None = None
    """Per-stream decode rate here: tokens after the first over first → last text."""
    prompt_tokens: int | None = None
    """Prompt tokens as the server counted them (evaluated plus cached)."""
    cached_tokens: int | None = None
    """Prompt tokens the server reused from its cache."""
    server_ttft_ms: float | None = None
    """TTFT as the server measured it (localllm)."""
    queue_ms: float | None = None
    """Time the request waited for a slot (localllm)."""
    load_ms: float | None = None
    """Time spent loading the model for this request."""
    prefill_tps: float | None = None
    """Prompt evaluation rate reported by the server."""
    server_decode_tps: float | None = None
    """Decode rate reported by the server."""
    draft_tokens: int | None = None
    """Speculative draft tokens proposed (localllm)."""
    draft_accepted: int | None = None
    """Draft tokens accepted."""

    def to_json(self) -> dict[str, Any]:
        """The sample as a JSON object (every field)."""
        return dataclasses.asdict(self)


@dataclass
class Point:
    """One level of a sweep for one target, summarized over its samples (all rounds)."""

    target: str
    """Label of the target."""
    sweep: str
    """``concurrency``, ``prompt`` or ``conversation``."""
    clients: int
    """Concurrent requests (a conversation's users)."""
    prompt_tokens: int
    """Prompt length asked for (the conversation sweep: the turn, from 1)."""
    cache: str
    """``cold`` or ``warm``."""
    requests: int = 0
    """Requests sent."""
    failed: int = 0
    """Requests that failed."""
    errors: list[str] = field(default_factory=list)
    """The first few distinct failure messages."""
    ttft_p50_ms: float | None = None
    """Median client-side TTFT."""
    ttft_p95_ms: float | None = None
    """95th-percentile client-side TTFT (nearest rank)."""
    stream_tps_p50: float | None = None
    """Median per-stream decode rate."""
    aggregate_tps: float | None = None
    """Tokens of all streams over the level's wall time."""
    queue_ms_p50: float | None = None
    """Median wait for a slot (servers that report it)."""
    prefill_tps_p50: float | None = None
    """Median prompt evaluation rate (servers that report it)."""
    cached_tokens_mean: float | None = None
    """Mean prompt tokens reused from the cache."""
    prompt_tokens_mean: float | None = None
    """Mean prompt tokens as the server counted them."""
    wall_s: float = 0.0
    """Wall time of the level, summed over its rounds."""

    @property
    def key(self) -> tuple[str, str, int, int, str]:
        """What identifies the point: target, sweep, clients, prompt length, cache."""
        return (self.target, self.sweep, self.clients, self.prompt_tokens, self.cache)

    def to_json(self) -> dict[str, Any]:
        """The point as a JSON object (every field)."""
        return dataclasses.asdict(self)


def percentile(values: Sequence[float], share: float) -> float | None:
    """Nearest-rank percentile (``share`` in 0..1) of ``values``; ``None`` when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(share * len(ordered)) - 1))]


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def summarize(samples: Sequence[Sample], wall_s: float, point: Point) -> Point:
    """Fill ``point`` from ``samples`` (the level's requests, all rounds) and its wall time."""
    good = [s for s in samples if s.ok]
    point.requests = len(samples)
    point.failed = len(samples) - len(good)
    errors: list[str] = []
    for sample in samples:
        if sample.error and sample.error not in errors and len(errors) < _ERRORS_KEPT:
            errors.append(sample.error)
    point.errors = errors
    point.wall_s = wall_s
    ttfts = [s.ttft_ms for s in good if s.ttft_ms is not None]
    point.ttft_p50_ms = _median(ttfts)
    point.ttft_p95_ms = percentile(ttfts, 0.95)
    point.stream_tps_p50 = _median([s.stream_tps for s in good if s.stream_tps is not None])
    tokens = sum(s.tokens for s in good)
    point.aggregate_tps = tokens / wall_s if good and wall_s > 0 else None
    point.queue_ms_p50 = _median([s.queue_ms for s in good if s.queue_ms is not None])
    point.prefill_tps_p50 = _median([s.prefill_tps for s in good if s.prefill_tps is not None])
    point.cached_tokens_mean = _mean(
        [float(s.cached_tokens) for s in good if s.cached_tokens is not None]
    )
    point.prompt_tokens_mean = _mean(
        [float(s.prompt_tokens) for s in good if s.prompt_tokens is not None]
    )
    return point
