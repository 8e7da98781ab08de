"""Progress events of pulls and quantizations, shaped like the lines of Ollama's ``/api/pull``.

A :class:`PullProgress` serialises (:meth:`PullProgress.to_json`) to exactly what Ollama streams
(``status``, ``digest``, ``total``, ``completed``) plus ``bytes_per_second``, which Ollama
clients ignore. The daemon streams the JSON unchanged; the CLI renders events the same way
whether they come from this library or back from the daemon (:meth:`PullProgress.from_json`).

The statuses of a pull, in order (Ollama's)::

    pulling manifest
    pulling <12 hex digits of the digest>     digest, total, completed, bytes_per_second
    verifying sha256 digest
    writing manifest
    success

plus a few informative ones without a digest (which Hugging Face file was picked, importing the
bundled starter model, ``quantizing F16 model to Q4_K_M`` with total/completed in bytes).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "STATUS_MANIFEST",
    "STATUS_SUCCESS",
    "STATUS_VERIFYING",
    "STATUS_WRITING_MANIFEST",
    "ProgressCallback",
    "PullProgress",
    "RateMeter",
    "pulling_status",
]

STATUS_MANIFEST = "pulling manifest"
STATUS_VERIFYING = "verifying sha256 digest"
STATUS_WRITING_MANIFEST = "writing manifest"
STATUS_SUCCESS = "success"


def pulling_status(digest: str) -> str:
    """``pulling 3f2b9c1d4e5a``: Ollama's status for one layer (12 hex digits of its digest)."""
    return f"pulling {digest.removeprefix('sha256:')[:12]}"


@dataclass(frozen=True, slots=True)
class PullProgress:
    """One progress event. Fields left ``None`` are omitted from the JSON, as Ollama does."""

    status: str
    """What is happening, in Ollama's words (``pulling manifest``, ``pulling <hex12>``...)."""
    digest: str | None = None
    """``sha256:<hex>`` of the blob being transferred, for per-layer events."""
    total: int | None = None
    """Bytes of the blob (or of the work, for quantization)."""
    completed: int | None = None
    """Bytes done so far."""
    bytes_per_second: float | None = None
    """Recent transfer rate, measured over the last few seconds."""

    @property
    def eta_seconds(self) -> float | None:
        """Seconds left at the current rate, when it can be told."""
        if self.total is None or self.completed is None or not self.bytes_per_second:
            return None
        return max(0.0, (self.total - self.completed) / self.bytes_per_second)

    def to_json(self) -> dict[str, Any]:
        """The event as one NDJSON object of ``/api/pull``."""
        data: dict[str, Any] = {"status": self.status}
        if self.digest is not None:
            data["digest"] = self.digest
        if self.total is not None:
            data["total"] = self.total
        if self.completed is not None:
            data["completed"] = self.completed
        if self.bytes_per_second is not None:
            data["bytes_per_second"] = round(self.bytes_per_second, 1)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PullProgress:
        """Read an event back from a ``/api/pull`` line; unknown keys are ignored."""

        def integer(key: str) -> int | None:
            value = data.get(key)
            return int(value) if isinstance(value, int | float) else None

        rate = data.get("bytes_per_second")
        digest = data.get("digest")
        return cls(
            status=str(data.get("status", "")),
            digest=digest if isinstance(digest, str) and digest else None,
            total=integer("total"),
            completed=integer("completed"),
            bytes_per_second=float(rate) if isinstance(rate, int | float) else None,
        )


ProgressCallback = Callable[[PullProgress], None]
"""Receives progress events; always called on the thread that started the operation."""


class RateMeter:
    """Bytes per second over a sliding window (a single stall shows up within the window)."""

    def __init__(self, window: float = 3.0) -> None:
        self._window = window
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, completed: int, now: float | None = None) -> None:
        """Record that ``completed`` bytes were done at ``now``."""
        now = time.monotonic() if now is None else now
        self._samples.append((now, completed))
        # Keep one sample older than the window so the rate spans the whole window.
        while len(self._samples) > 2 and self._samples[1][0] < now - self._window:
            self._samples.popleft()

    def rate(self) -> float | None:
        """Bytes per second over the window, or ``None`` before two samples exist."""
        if len(self._samples) < 2:
            return None
        (t0, c0), (t1, c1) = self._samples[0], self._samples[-1]
        if t1 <= t0:
            return None
        return max(0.0, (c1 - c0) / (t1 - t0))
