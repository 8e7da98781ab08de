"""Log probabilities in the shapes the API families report them.

The runner gives every generated token as a :class:`TokenLogprob` (text, natural-log
probability under the model, bytes, and the most likely alternatives when asked). Ollama and
OpenAI's chat API put them in a list of ``{"token", "logprob", "bytes", "top_logprobs"}``;
OpenAI's legacy completions API uses parallel lists (``tokens``, ``token_logprobs``,
``top_logprobs`` as dicts, ``text_offset``). JSON has no infinity, so a token the model gave
no chance at all is reported as -9999.0, the value OpenAI uses for "very unlikely".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..errors import HTTPProblem
from ..runner.protocol import SamplingOptions, TokenLogprob

__all__ = [
    "MAX_TOP_LOGPROBS",
    "UNLIKELY",
    "LegacyLogprobs",
    "apply_logprobs",
    "chat_logprobs",
    "check_top_logprobs",
    "ollama_logprobs",
]

MAX_TOP_LOGPROBS = 20
"""The most alternatives a request may ask for (OpenAI's and Ollama's limit)."""

UNLIKELY = -9999.0
"""What a log probability of minus infinity (or NaN) is reported as."""


def _finite(value: float) -> float:
    return value if math.isfinite(value) else UNLIKELY


def check_top_logprobs(value: Any, field: str = "top_logprobs") -> int:
    """``top_logprobs`` as an int in 0..20; 400 naming ``field`` otherwise."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise HTTPProblem(400, f"{field} must be an integer", param=field)
    if not 0 <= value <= MAX_TOP_LOGPROBS:
        raise HTTPProblem(
            400, f"{field} must be between 0 and {MAX_TOP_LOGPROBS}, got {value}", param=field
        )
    return value


def apply_logprobs(options: SamplingOptions, logprobs: bool, top: int) -> None:
    """Ask the runner for log probabilities (``top`` alternatives at each position)."""
    options.logprobs = logprobs
    options.top_logprobs = top if logprobs else 0


def _entry(item: TokenLogprob) -> dict[str, Any]:
    return {"token": item.token, "logprob": _finite(item.logprob), "bytes": list(item.bytes)}


def ollama_logprobs(items: Sequence[TokenLogprob], top: int) -> list[dict[str, Any]]:
    """Ollama's ``logprobs``: ``[{"token", "logprob", "bytes", "top_logprobs"?}]``
    (``top_logprobs`` only when alternatives were asked for, as Ollama omits it)."""
    out = []
    for item in items:
        entry = _entry(item)
        if top:
            entry["top_logprobs"] = [_entry(alt) for alt in item.top_logprobs[:top]]
        out.append(entry)
    return out


def chat_logprobs(items: Sequence[TokenLogprob], top: int) -> dict[str, Any]:
    """OpenAI chat's ``choices[].logprobs``: ``{"content": [...], "refusal": null}``, each
    entry with its ``top_logprobs`` list (empty when none were asked for)."""
    content = []
    for item in items:
        entry = _entry(item)
        entry["top_logprobs"] = [_entry(alt) for alt in item.top_logprobs[:top]]
        content.append(entry)
    return {"content": content, "refusal": None}


class LegacyLogprobs:
    """OpenAI's legacy completions ``logprobs`` for one choice, built chunk by chunk so the
    ``text_offset`` of each token continues across a stream."""

    def __init__(self, top: int, offset: int = 0) -> None:
        self.top = top
        self.offset = offset
        """Characters of the choice's text before the next token (the echoed prompt)."""

    def shape(self, items: Sequence[TokenLogprob], prompt: bool = False) -> dict[str, Any]:
        """``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`` for ``items``;
        each ``top_logprobs`` dict holds the alternatives and the token itself, as OpenAI's
        may hold ``logprobs + 1`` entries. ``prompt``: the items are an echoed prompt's, whose
        first token has nothing before it: its log probability and alternatives are null, as
        OpenAI reports them."""
        tokens: list[str] = []
        values: list[float | None] = []
        tops: list[dict[str, float] | None] = []
        offsets: list[int] = []
        for index, item in enumerate(items):
            tokens.append(item.token)
            offsets.append(self.offset)
            self.offset += len(item.token)
            if prompt and index == 0:
                values.append(None)
                tops.append(None)
                continue
            values.append(_finite(item.logprob))
            alternatives = {
                alt.token: _finite(alt.logprob) for alt in item.top_logprobs[: self.top]
            }
            alternatives.setdefault(item.token, _finite(item.logprob))
            tops.append(alternatives)
        return {
            "tokens": tokens,
            "token_logprobs": values,
            "top_logprobs": tops,
            "text_offset": offsets,
        }
