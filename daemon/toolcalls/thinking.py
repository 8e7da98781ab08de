"""Reasoning text in a model's output: which tags and switches a chat template uses
(:func:`thinking_style`), and :class:`ThinkingSplitter`, which splits the reasoning from the
answer incrementally."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .core import Parsed, held_prefix
from .detect import template_variables

__all__ = [
    "THINKING_SWITCHES",
    "THINK_TAGS",
    "ThinkingSplitter",
    "ThinkingStyle",
    "detect_thinking",
    "starts_thinking",
    "thinking_style",
]


THINK_TAGS: tuple[tuple[str, str], ...] = (
    ("<think>", "</think>"),  # Qwen3, QwQ, DeepSeek R1, Granite 3.2+
    ("[THINK]", "[/THINK]"),  # Magistral
    ("<|START_THINKING|>", "<|END_THINKING|>"),  # Command R7B
)


def detect_thinking(template: str | None) -> tuple[str, str] | None:
    """The (open, close) reasoning tags a template uses, or None. Harmony templates carry
    reasoning in channels instead: :class:`~.harmony.HarmonyParser` splits those."""
    if not template or "<|channel|>" in template:
        return None
    for open_tag, close_tag in THINK_TAGS:
        if open_tag in template and close_tag in template:
            return open_tag, close_tag
    return None


THINKING_SWITCHES: tuple[str, ...] = ("enable_thinking", "reasoning_effort", "thinking")
"""Template variables that turn reasoning on or off or set its level: ``enable_thinking``
(Qwen3, and every template llama.cpp renders), ``reasoning_effort`` (GPT-OSS: low, medium,
high), ``thinking`` (Granite 3.2+, DeepSeek V3.1)."""


@dataclass(frozen=True)
class ThinkingStyle:
    """How a chat template's model reasons: where the reasoning is in its output and which
    template switches control it."""

    tags: tuple[str, str] | None
    """(open, close) tags around reasoning in the output; None for harmony (channels)."""
    harmony: bool
    """GPT-OSS's channels: reasoning in ``analysis``, which cannot be switched off."""
    switches: frozenset[str]
    """Which of :data:`THINKING_SWITCHES` the template reads."""

    @property
    def takes_level(self) -> bool:
        """Whether a level (low, medium, high) changes the prompt, not just on or off."""
        return "reasoning_effort" in self.switches


@lru_cache(maxsize=64)
def thinking_style(template: str | None) -> ThinkingStyle | None:
    """The reasoning a chat template supports (Ollama's ``thinking`` capability), or None.

    As Ollama judges it: a template showing ``<think>`` and ``</think>`` (or a family's
    equivalent tags) has a model that reasons; harmony templates reason in channels. A
    template with a reasoning switch but no tags in its text gets ``<think>`` tags, the
    output convention of every family whose template hides them."""
    if not template:
        return None
    harmony = "<|channel|>" in template
    tags = detect_thinking(template)
    switches = frozenset((template_variables(template) or set()) & set(THINKING_SWITCHES))
    if harmony:
        return ThinkingStyle(tags=None, harmony=True, switches=switches)
    if tags is None and not switches:
        return None
    return ThinkingStyle(tags=tags or THINK_TAGS[0], harmony=False, switches=switches)


def starts_thinking(prompt_tail: str, open_tag: str) -> bool:
    """Whether a rendered prompt ends inside an open reasoning block (DeepSeek R1's and
    Qwen3's templates write ``<think>\\n`` themselves), so the answer starts as reasoning."""
    return prompt_tail.rstrip().endswith(open_tag)


class ThinkingSplitter:
    """Splits reasoning from the answer, incrementally.

    Reasoning is recognised only at the start of the output (after whitespace), as llama.cpp
    and Ollama do: a tag later in an answer is text the model is writing about, not its own
    reasoning. ``starts_thinking`` says the prompt already opened the block (DeepSeek R1's
    template ends with ``<think>\\n``), so output is reasoning until the close tag.
    """

    def __init__(self, open_tag: str, close_tag: str, *, starts_thinking: bool = False) -> None:
        self.open_tag = open_tag
        self.close_tag = close_tag
        self._state = "thinking" if starts_thinking else "start"
        self._buffer = ""

    def feed(self, text: str) -> Parsed:
        """Take the next piece of output."""
        self._buffer += text
        return self._step(final=False)

    def finish(self) -> Parsed:
        """The output ended: release what was held back."""
        out = self._step(final=True)
        rest, self._buffer = self._buffer, ""
        if self._state == "thinking":
            out.thinking += rest
        elif self._state != "after" or rest.strip():
            out.content += rest
        return out

    def _step(self, final: bool) -> Parsed:
        out = Parsed()
        while self._buffer:
            text = self._buffer
            if self._state == "start":
                stripped = text.lstrip()
                if stripped.startswith(self.open_tag):
                    self._buffer = stripped[len(self.open_tag) :]
                    self._state = "thinking"
                    continue
                if not final and (not stripped or self.open_tag.startswith(stripped)):
                    return out
                self._state = "content"
                continue
            if self._state == "thinking":
                at = text.find(self.close_tag)
                if at >= 0:
                    out.thinking += text[:at]
                    self._buffer = text[at + len(self.close_tag) :]
                    self._state = "after"
                    continue
                safe = len(text) - held_prefix(text, (self.close_tag,))
                out.thinking += text[:safe]
                self._buffer = text[safe:]
                return out
            if self._state == "after":
                # the blank lines templates put after the close tag are not answer text
                stripped = text.lstrip()
                if not stripped:
                    return out
                self._buffer = stripped
                self._state = "content"
                continue
            out.content += text
            self._buffer = ""
        return out
