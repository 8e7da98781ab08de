"""Tool calling and reasoning at the API edge, for the family modules and the request core:
the request values every family decodes the same way (Ollama's ``think``, OpenAI's
``reasoning_effort``, a flat tool definition) and the answer read back as an API reports it
(:class:`AnswerStream`: reasoning split out, calls parsed by the parser the prompt plan chose).
What a request's tools and reasoning mean for the prompt is planned in
:mod:`localllm.daemon.prompt`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import HTTPProblem
from ..prompt.thinking import ThinkPlan
from ..prompt.tools import ToolPlan
from ..toolcalls.core import Parsed
from ..toolcalls.harmony import HarmonyParser
from ..toolcalls.output import OutputParser

__all__ = [
    "THINK_LEVELS",
    "AnswerStream",
    "flat_tool",
    "parse_think",
    "reasoning_effort_think",
    "split_output",
]


def _problem(message: str, param: str, code: str = "invalid_field") -> HTTPProblem:
    return HTTPProblem(400, message, param=param, code=code)


def flat_tool(
    tool: Any, where: str, keys: set[str], kinds: Sequence[str | None], refusal: str
) -> dict[str, Any]:
    """A flat tool definition (Anthropic's and Responses' ``{name, ...}``) checked: an object
    whose ``type`` is one of ``kinds`` (``refusal`` says why another is not taken) and whose
    keys are all in ``keys`` (no field is silently ignored)."""
    if not isinstance(tool, dict):
        raise _problem(f"{where} must be an object", where)
    kind = tool.get("type", kinds[0])
    if kind not in kinds:
        raise _problem(f"{where}.type {kind!r}{refusal}", f"{where}.type")
    extra = sorted(set(tool) - keys)
    if extra:
        raise _problem(f"{where}.{extra[0]}: unknown field of a tool", f"{where}.{extra[0]}")
    return tool


def split_output(
    plan: ToolPlan | None, text: str, think: ThinkPlan | None = None, prompt_tail: str = ""
) -> Parsed:
    """A whole answer parsed at once (non-streamed responses); see :class:`AnswerStream`."""
    return AnswerStream(plan, think, prompt_tail).whole(text)


# --- thinking -------------------------------------------------------------------------------

THINK_LEVELS = ("low", "medium", "high", "max")
"""Ollama's reasoning levels (``think: "high"``); ``true`` means medium."""


def parse_think(value: Any, field: str = "think") -> bool | str | None:
    """Ollama's ``think``: true, false, or a level; None when not given; 400 otherwise."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        word = value.strip().lower()
        if word in ("true", "false"):
            return word == "true"
        if word in THINK_LEVELS:
            return word
    raise _problem(
        f'{field} must be true, false, "low", "medium", "high" or "max", got {value!r}', field
    )


_EFFORTS = {
    "none": False,
    "minimal": "low",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "max",
    "max": "max",
}


def reasoning_effort_think(value: Any, field: str = "reasoning_effort") -> bool | str | None:
    """OpenAI's ``reasoning_effort`` as a ``think`` value, mapped as Ollama maps it
    (``none`` switches reasoning off, ``minimal`` is low, ``xhigh`` is max)."""
    if value is None:
        return None
    if isinstance(value, str) and value.lower() in _EFFORTS:
        return _EFFORTS[value.lower()]
    raise _problem(f"{field} must be one of {', '.join(_EFFORTS)}, got {value!r}", field)


class AnswerStream:
    """One answer's output as an API reports it: reasoning split out, tool calls parsed (at
    most one when parallel calls are off), reasoning dropped when it was switched off.

    Feed it the generated text as it comes; without tools or reasoning it passes the text
    through as content."""

    def __init__(
        self,
        tools: ToolPlan | None = None,
        think: ThinkPlan | None = None,
        prompt_tail: str = "",
    ) -> None:
        self.tools = tools
        self.think = think
        splitter = think.splitter(prompt_tail) if think is not None else None
        self._parser: OutputParser | None = None
        if tools is not None:
            self._parser = tools.parser(splitter)
        elif think is not None and think.style.harmony:
            self._parser = OutputParser(HarmonyParser())
        elif splitter is not None:
            self._parser = OutputParser(None, splitter)
        self.calls_made = 0
        """Calls reported so far."""

    def feed(self, text: str) -> Parsed:
        """What the next piece of output is, as far as it is certain."""
        if self._parser is None:
            return Parsed(content=text)
        return self._shape(self._parser.feed(text))

    def finish(self, cut: bool = False) -> Parsed:
        """The output ended (``cut``: by the token limit, so a call it was writing is cut
        off): the rest."""
        if self._parser is None:
            return Parsed()
        return self._shape(self._parser.finish(cut))

    def whole(self, text: str) -> Parsed:
        """A whole answer at once (non-streamed responses)."""
        return self.feed(text).add(self.finish())

    def _shape(self, parsed: Parsed) -> Parsed:
        if self.tools is not None and not self.tools.parallel:
            parsed.calls = parsed.calls[: max(1 - self.calls_made, 0)]
        self.calls_made += len(parsed.calls)
        if self.think is not None and not self.think.keep:
            parsed.thinking = ""
        return parsed
