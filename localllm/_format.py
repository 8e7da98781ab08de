"""Numbers and times for people: ``98 MB``, ``3 minutes ago``, ``in 4 minutes``."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

__all__ = [
    "REBUILD_FOR_THIS_CPU",
    "exit_status",
    "human_count",
    "human_duration",
    "human_since",
    "human_size",
    "human_until",
    "processor",
    "speed_figures",
    "table",
    "tokens_per_second",
]

REBUILD_FOR_THIS_CPU = (
    'rebuild llama-cpp-python for this CPU: CMAKE_ARGS="-DGGML_NATIVE=OFF" '
    "pip install --force-reinstall --no-cache-dir llama-cpp-python"
)
"""The remedy when llama.cpp's native build executes an instruction this CPU cannot run."""


def exit_status(returncode: int) -> str:
    """How a child process ended, for a sentence: ``was killed by SIGILL (illegal
    instruction)``, ``exited with status 2``."""
    if returncode < 0:
        import signal

        try:
            number = signal.Signals(-returncode)
        except ValueError:
            return f"was killed by signal {-returncode}"
        meaning = (signal.strsignal(number) or "").lower()
        # SIGKILL's one word, "killed", says nothing more; SIGILL's "illegal instruction" does.
        return f"was killed by {number.name}" + (f" ({meaning})" if " " in meaning else "")
    return f"exited with status {returncode}"


def human_count(value: object) -> str:
    """``1.2M``, ``34k``, ``512`` (downloads, likes, parameters); ``-`` when not a number."""
    if not isinstance(value, int) or isinstance(value, bool):
        return "-"
    for size, suffix in ((1_000_000_000, "B"), (1_000_000, "M"), (1_000, "k")):
        if value >= size:
            return f"{value / size:.1f}".rstrip("0").rstrip(".") + suffix
    return str(value)


def speed_figures(
    speed: Mapping[str, Any] | None,
) -> tuple[list[tuple[str, float | None, float | None]], str]:
    """From the daemon's ``speed`` (``/api/speed``, ``/api/plan``, ``/api/ps``): ``(kind,
    predicted, measured)`` tokens/s for ``decode`` and ``prefill`` where either is known,
    and why nothing is predicted (``""`` when something is)."""
    predicted = (speed or {}).get("predicted") or {}
    measured = (speed or {}).get("measured") or {}
    figures = [
        (kind, predicted.get(kind) or None, measured.get(kind) or None)
        for kind in ("decode", "prefill")
        if predicted.get(kind) or measured.get(kind)
    ]
    if predicted.get("decode"):
        return figures, ""
    return figures, str(predicted.get("why") or (speed or {}).get("why") or "")


def tokens_per_second(rate: float) -> str:
    """``48``, ``1204``; a rate under 10 keeps a decimal (``0.6``: a software device's)."""
    return f"{rate:.0f}" if rate >= 10 else f"{rate:.1f}"


def human_size(size: float) -> str:
    """Decimal units as Ollama prints them: ``98 MB``, ``4.7 GB``."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(size) < 1000 or unit == "TB":
            if unit == "B":
                return f"{int(size)} B"
            return f"{size:.1f} {unit}" if abs(size) < 10 else f"{size:.0f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


def human_duration(seconds: float) -> str:
    """``45 seconds``, ``3 minutes``, ``2 hours``, ``5 days``."""
    seconds = abs(seconds)
    scales = (
        (60, "second", 1),
        (3600, "minute", 60),
        (86400, "hour", 3600),
        (86400 * 7, "day", 86400),
        (86400 * 30, "week", 86400 * 7),
        (86400 * 365, "month", 86400 * 30),
        (float("inf"), "year", 86400 * 365),
    )
    _, unit, divisor = next(scale for scale in scales if seconds < scale[0])
    count = int(seconds // divisor)
    if unit == "second" and count < 2:
        return "a moment" if count < 1 else "1 second"
    return f"{count} {unit}{'s' if count != 1 else ''}"


def human_since(timestamp: float, now: float | None = None) -> str:
    """``3 minutes ago``."""
    elapsed = (time.time() if now is None else now) - timestamp
    if elapsed < 1:
        return "Less than a second ago"
    return f"{human_duration(elapsed)} ago"


def human_until(timestamp: float | None, now: float | None = None) -> str:
    """``4 minutes from now``; ``Forever`` for ``None``; ``Stopping...`` once past."""
    if timestamp is None:
        return "Forever"
    remaining = timestamp - (time.time() if now is None else now)
    if remaining <= 0:
        return "Stopping..."
    return f"{human_duration(remaining)} from now"


def processor(size: int, size_vram: int) -> str:
    """Where a model of ``size`` bytes with ``size_vram`` of them on GPUs runs, as ``ollama ps``
    says it: ``100% CPU``, ``100% GPU`` or ``38%/62% CPU/GPU``."""
    if size <= 0 or size_vram <= 0:
        return "100% CPU"
    if size_vram >= size:
        return "100% GPU"
    cpu = round(100 * (size - size_vram) / size)
    return f"{cpu}%/{100 - cpu}% CPU/GPU"


def table(headers: list[str], rows: list[list[str]]) -> str:
    """Left-aligned columns separated by at least three spaces, like Ollama's tables."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    lines = []
    for row in [headers, *rows]:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=True)]
        lines.append("    ".join(cells).rstrip())
    return "\n".join(lines)
