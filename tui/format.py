"""Text for the screens: answer stats, rates, countdowns, transfer progress.

Pure functions (no Textual), so they are easy to test and the same numbers read the same way
everywhere in the UI. Sizes and relative dates come from :mod:`localllm._format`, as in the CLI.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from localllm._format import human_since, human_size
from localllm.progress_display import _eta_text

__all__ = [
    "answer_stats",
    "chat_title",
    "countdown",
    "duration_ms",
    "modified",
    "rate",
    "transfer_line",
]

_TITLE_LENGTH = 32


def duration_ms(milliseconds: float) -> str:
    """``85 ms``, ``1.24 s``."""
    if milliseconds < 1000:
        return f"{milliseconds:.0f} ms"
    return f"{milliseconds / 1000:.2f} s"


def rate(tokens_per_second: float) -> str:
    """``95.2 tok/s``, ``1,204 tok/s``."""
    if tokens_per_second >= 100:
        return f"{tokens_per_second:,.0f} tok/s"
    return f"{tokens_per_second:.1f} tok/s"


def answer_stats(stats: dict[str, Any] | None) -> str:
    """The line under an answer, from its final chunk: TTFT, prefill and decode speed, tokens
    reused from the prompt cache. Empty while the answer is still coming."""
    if not stats:
        return ""
    if "error" in stats:
        return f"error: {stats['error']}"
    if stats.get("done_reason") == "stopped":
        return "stopped"
    parts = []
    if "ttft_duration" in stats:
        parts.append(f"TTFT {duration_ms(stats['ttft_duration'] / 1e6)}")
    if "prompt_eval_rate" in stats:
        parts.append(f"prefill {rate(stats['prompt_eval_rate'])}")
    if "eval_rate" in stats:
        parts.append(f"decode {rate(stats['eval_rate'])}")
    if "prompt_cached_count" in stats:
        parts.append(f"{stats['prompt_cached_count']} cached")
    if "eval_count" in stats:
        parts.append(f"{stats['eval_count']} tokens")
    if stats.get("done_reason") == "length":
        parts.append("cut at the token limit")
    if stats.get("loop"):  # an answer that used tools: where the loop's time went
        parts.append(str(stats["loop"]))
    return " · ".join(parts)


def chat_title(first_question: str) -> str:
    """A chat's name in the list: the first line of its first question, shortened."""
    line = first_question.strip().splitlines()[0] if first_question.strip() else "New chat"
    return line if len(line) <= _TITLE_LENGTH else line[: _TITLE_LENGTH - 1].rstrip() + "…"


def countdown(expires_at: float | None, now: float) -> str:
    """Keep-alive left: ``unloads in 4:32``; ``stays loaded`` when it never expires."""
    if expires_at is None:
        return "stays loaded"
    left = int(expires_at - now)
    if left <= 0:
        return "unloading"
    hours, rest = divmod(left, 3600)
    minutes, seconds = divmod(rest, 60)
    clock = f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"
    return f"unloads in {clock}"


def transfer_line(completed: int, total: int, bytes_per_second: float | None) -> str:
    """``12 MB / 45 MB · 3.1 MB/s · 11s left``."""
    parts = [f"{human_size(completed)} / {human_size(total)}"]
    if bytes_per_second:
        parts.append(f"{human_size(bytes_per_second)}/s")
        if completed < total:
            parts.append(f"{_eta_text((total - completed) / bytes_per_second)} left")
    return " · ".join(parts)


def modified(timestamp: str | None, now: float) -> str:
    """An ISO time from the API as ``3 minutes ago``, relative to ``now``."""
    if not timestamp:
        return ""
    try:
        when = datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return timestamp
    return human_since(when, now=now)
