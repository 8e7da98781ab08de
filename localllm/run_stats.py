"""The ``--verbose`` block printed after an answer: Ollama's timing lines plus TTFT and cache reuse.

Fed with the final (``done``) chunk of ``/api/chat`` or ``/api/generate``: Ollama's nanosecond
fields and localllm's extras (``ttft_duration``, ``prompt_cached_count``,
``prompt_evaluated_count``, ``prompt_eval_rate``, ``eval_rate``, ``queue_duration``, the CPU
threads the steps ran with: ``threads_min``, ``threads_max``, ``threads_of``, ``threads_why``; and
``ttft_breakdown``, where the time to the first token went, phase by phase). The
prompt (prefill) and generation (decode) phases are reported apart, since they have different
bottlenecks: "prompt eval count" counts only the tokens evaluated, and the tokens reused from
the KV cache have their own line, so the prompt rate is not inflated by the cache.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["format_duration", "format_timings"]


def format_duration(nanoseconds: float) -> str:
    """``1.532s``, ``48.21ms``, ``310µs``, ``2m3.4s``: short, with a unit."""
    seconds = nanoseconds / 1e9
    if seconds >= 60:
        minutes, rest = divmod(seconds, 60)
        return f"{int(minutes)}m{rest:.1f}s"
    if seconds >= 1:
        return f"{seconds:.3f}s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f}ms"
    return f"{seconds * 1e6:.0f}µs"


def _number(final: Mapping[str, Any], key: str) -> float:
    value = final.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _rate(final: Mapping[str, Any], key: str, count: float, duration_key: str) -> float:
    if isinstance(final.get(key), int | float):
        return _number(final, key)
    duration = _number(final, duration_key)
    return count / (duration / 1e9) if duration > 0 else 0.0


def _threads(final: Mapping[str, Any]) -> str | None:
    """``2 of 2``, ``1 of 2 (CPU busy: ...)``, ``1-2 of 2 (...)``: the CPU threads the answer's
    steps ran with, so that its rates are read against what the machine gave it."""
    most, low, high = (_number(final, key) for key in ("threads_of", "threads_min", "threads_max"))
    if not most or not high:
        return None
    used = f"{low:.0f}" if low == high else f"{low:.0f}-{high:.0f}"
    why = final.get("threads_why")
    note = f" ({why})" if isinstance(why, str) and why and low < most else ""
    return f"{used} of {most:.0f}{note}"


def _phases(final: Mapping[str, Any]) -> str | None:
    """``parse 410µs, plan 120µs, ...``: the phases of the first token the daemon measured
    (those under a microsecond left out), from ``ttft_breakdown`` (nanoseconds)."""
    breakdown = final.get("ttft_breakdown")
    if not isinstance(breakdown, Mapping):
        return None
    parts = [
        f"{name} {format_duration(ns)}"
        for name, ns in breakdown.items()
        if name != "ttft" and isinstance(ns, int | float) and ns >= 1000
    ]
    return ", ".join(parts) or None


def format_timings(final: Mapping[str, Any]) -> str:
    """The aligned block of timing lines for one answer's final chunk."""
    prompt_total = _number(final, "prompt_eval_count")
    cached = _number(final, "prompt_cached_count")
    evaluated = (
        _number(final, "prompt_evaluated_count")
        if "prompt_evaluated_count" in final
        else max(prompt_total - cached, 0)
    )
    generated = _number(final, "eval_count")
    rows: list[tuple[str, str]] = [
        ("total duration", format_duration(_number(final, "total_duration"))),
        ("load duration", format_duration(_number(final, "load_duration"))),
    ]
    if _number(final, "queue_duration") >= 1e6:  # worth a line from a millisecond on
        rows.append(("queue duration", format_duration(_number(final, "queue_duration"))))
    if "ttft_duration" in final:
        rows.append(("time to first token", format_duration(_number(final, "ttft_duration"))))
    if (phases := _phases(final)) is not None:
        rows.append(("first token phases", phases))
    rows.append(("prompt eval count", f"{evaluated:.0f} token(s)"))
    if "prompt_cached_count" in final:
        rows.append(("prompt cached count", f"{cached:.0f} token(s) reused from cache"))
    prompt_rate = _rate(final, "prompt_eval_rate", evaluated, "prompt_eval_duration")
    rows += [
        ("prompt eval duration", format_duration(_number(final, "prompt_eval_duration"))),
        ("prompt eval rate", f"{prompt_rate:.2f} tokens/s"),
        ("eval count", f"{generated:.0f} token(s)"),
        ("eval duration", format_duration(_number(final, "eval_duration"))),
        ("eval rate", f"{_rate(final, 'eval_rate', generated, 'eval_duration'):.2f} tokens/s"),
    ]
    drafted = _number(final, "draft_count")
    if drafted:
        accepted = _number(final, "draft_accepted_count")
        drafter = final.get("drafter")
        how = f"speculative, {drafter}" if isinstance(drafter, str) and drafter else "speculative"
        rows.append(
            (
                "draft tokens",
                f"{accepted:.0f} of {drafted:.0f} accepted ({accepted / drafted:.0%}, {how})",
            )
        )
    if (threads := _threads(final)) is not None:
        rows.append(("threads", threads))
    width = max(len(label) for label, _ in rows) + 2
    return "\n".join(f"{label + ':':<{width}}{value}" for label, value in rows)
