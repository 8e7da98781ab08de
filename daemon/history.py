"""TTFT and decode-rate history since the daemon started, per model, in bounded memory.

The dashboard's sparklines show it, so it has to be there when the screen opens: the daemon
keeps it, not the screen. Each finished request that generated tokens adds one sample
``(time, ttft_ms, decode_tps)`` to its model's series. A series holds at most ``capacity``
entries; when full, neighbouring entries are merged in pairs (weighted means), so the series
always spans the whole time since the daemon started, at a resolution that halves as it
grows. Memory is bounded by ``capacity`` times ``max_models``.

:meth:`RequestHistory.series` is what the stats stream sends for a model (``/api/stats``,
``models[i].history``)::

    {"since": 1718000000.0,          # when the history began (daemon start), epoch seconds
     "requests": 1234,               # requests recorded for the model since then
     "time": [epoch seconds, ...],   # end of each bucket (about as many requests each)
     "ttft_ms": [float, ...],        # mean TTFT of the requests in each bucket
     "decode_tps": [float, ...]}     # mean decode tokens/s in each bucket

All three lists have the same length, at most ``points``; empty before the first request.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

__all__ = ["HistorySample", "RequestHistory"]


@dataclass
class HistorySample:
    """One entry of a series: the mean of ``weight`` requests, the last ending at ``time``."""

    time: float
    """When the last request of the entry finished (epoch seconds)."""
    ttft_ms: float
    """Mean time to first token."""
    decode_tps: float
    """Mean decode tokens/s."""
    weight: int = 1
    """Requests merged into this entry."""

    def merge(self, other: HistorySample) -> HistorySample:
        """This entry and the next one as one (weighted means, the later time)."""
        total = self.weight + other.weight
        return HistorySample(
            time=max(self.time, other.time),
            ttft_ms=(self.ttft_ms * self.weight + other.ttft_ms * other.weight) / total,
            decode_tps=(self.decode_tps * self.weight + other.decode_tps * other.weight) / total,
            weight=total,
        )


class RequestHistory:
    """Per-model TTFT and decode-rate history since ``started_at`` (default: now).

    Thread-safe: requests finish on the event loop, and a test or the metrics may read from
    elsewhere.
    """

    def __init__(
        self, capacity: int = 512, max_models: int = 32, started_at: float | None = None
    ) -> None:
        if capacity < 2:
            raise ValueError("capacity must be at least 2")
        self.capacity = capacity
        """Most entries kept per model before pairs are merged."""
        self.max_models = max_models
        """Most models kept; the one that finished a request longest ago is forgotten first."""
        self.started_at = time.time() if started_at is None else started_at
        """When the history began."""
        self._series: OrderedDict[str, list[HistorySample]] = OrderedDict()
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def record(
        self,
        model: str,
        ttft_ms: float,
        decode_tps: float,
        tokens: int = 1,
        when: float | None = None,
    ) -> None:
        """Add a finished request of ``model``; requests that generated no token (a load, an
        error before the first token) have no TTFT or rate and are left out."""
        if tokens <= 0 or ttft_ms < 0 or decode_tps < 0:
            return
        sample = HistorySample(time.time() if when is None else when, ttft_ms, decode_tps)
        with self._lock:
            series = self._series.get(model)
            if series is None:
                series = self._series[model] = []
                while len(self._series) > self.max_models:
                    forgotten, _ = self._series.popitem(last=False)
                    self._counts.pop(forgotten, None)
            self._series.move_to_end(model)
            series.append(sample)
            self._counts[model] = self._counts.get(model, 0) + 1
            if len(series) > self.capacity:
                series[:] = _halve(series)

    def models(self) -> list[str]:
        """Models with a history, the most recently active last."""
        with self._lock:
            return list(self._series)

    def series(self, model: str, points: int = 60) -> dict[str, Any]:
        """``model``'s history in at most ``points`` buckets (see the module docstring)."""
        with self._lock:
            entries = list(self._series.get(model, ()))
            requests = self._counts.get(model, 0)
        buckets = _bucket(entries, max(1, points))
        return {
            "since": self.started_at,
            "requests": requests,
            "time": [round(b.time, 3) for b in buckets],
            "ttft_ms": [round(b.ttft_ms, 2) for b in buckets],
            "decode_tps": [round(b.decode_tps, 2) for b in buckets],
        }


def _halve(entries: list[HistorySample]) -> list[HistorySample]:
    """Merge neighbours in pairs (an odd last entry stays as it is)."""
    merged = [entries[i].merge(entries[i + 1]) for i in range(0, len(entries) - 1, 2)]
    if len(entries) % 2:
        merged.append(entries[-1])
    return merged


def _bucket(entries: list[HistorySample], points: int) -> list[HistorySample]:
    """``entries`` in at most ``points`` consecutive groups of about as many requests each
    (by weight: older entries may already stand for many requests)."""
    if len(entries) <= points:
        return entries
    per_bucket = sum(e.weight for e in entries) / points
    buckets: list[HistorySample] = []
    current: HistorySample | None = None
    for entry in entries:
        current = entry if current is None else current.merge(entry)
        if current.weight >= per_bucket:
            buckets.append(current)
            current = None
    if current is not None:
        buckets.append(current)
    return buckets
