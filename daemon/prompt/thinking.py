"""A request's reasoning switch for the prompt: the template's variables that turn reasoning on,
off or to a level, the tags the runner watches (a grammar waits for the reasoning block to
close, a budget closes it), and the splitter that reads the reasoning back out of the answer
(:meth:`ThinkPlan.splitter`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from localllm.store.models import LocalModel

from ..errors import HTTPProblem
from ..runner.protocol import GenerationRequest, SamplingOptions
from ..toolcalls.thinking import ThinkingSplitter, ThinkingStyle, starts_thinking
from .chat import ChatTemplate, chat_template

__all__ = [
    "LEVEL_BUDGETS",
    "ThinkAsk",
    "ThinkPlan",
    "after_reasoning",
    "model_thinking",
    "output_constrained",
    "plan_thinking",
    "request_thinking",
]

LEVEL_BUDGETS: dict[str, int | None] = {"low": 1024, "medium": 4096, "high": 16384, "max": None}
"""Reasoning budgets of the levels (Ollama's ``think``, OpenAI's ``reasoning_effort``...) on a
template that has no level switch of its own (one with ``reasoning_effort`` gets the level)."""


def _problem(message: str, param: str, code: str = "invalid_field") -> HTTPProblem:
    return HTTPProblem(400, message, param=param, code=code)


def model_thinking(model: LocalModel) -> ThinkingStyle | None:
    """How ``model`` reasons, or None when its template shows no reasoning (its ``thinking``
    capability)."""
    try:
        return chat_template(model).thinking
    except Exception:  # a model whose GGUF cannot be read has no capabilities to show
        return None


@dataclass
class ThinkPlan:
    """What a request's ``think`` (or ``reasoning_effort``) means for a model that reasons."""

    style: ThinkingStyle
    """The template's reasoning style."""
    think: bool | str | None
    """The request's value: on, off, a level; None leaves the template's default (on)."""
    constrained: bool = False
    """The output is constrained from its first token (a format, a forced call): it is the
    answer, even where the template opened a reasoning block."""
    asked_switches: dict[str, Any] = field(default_factory=dict)
    """The template switches as the request asked for them, before :meth:`apply` decided
    for a constrained output (a continued prompt rendered in the daemon is rendered with
    these)."""

    @property
    def keep(self) -> bool:
        """Whether the answer reports the reasoning. Off drops it, except for harmony, whose
        reasoning cannot be switched off (Ollama reports it all the same)."""
        return self.think is not False or self.style.harmony

    def template_kwargs(self) -> dict[str, Any]:
        """The template switches for this request (only those the template reads)."""
        if self.think is None:
            return {}
        on = self.think is not False
        switches = self.style.switches
        kwargs: dict[str, Any] = {}
        if "enable_thinking" in switches:
            kwargs["enable_thinking"] = on
        if "thinking" in switches:
            kwargs["thinking"] = on
        if "reasoning_effort" in switches:
            if on:
                level = self.think if isinstance(self.think, str) else "medium"
                # harmony knows low, medium and high; max is the most it has
                kwargs["reasoning_effort"] = "high" if level == "max" else level
            elif self.style.harmony:
                kwargs["reasoning_effort"] = "low"  # harmony cannot reason less than this
        return kwargs

    def budget(self, requested: int | None, option: Any = None) -> int | None:
        """The reasoning budget: the ``requested`` one, else the ``thinking_budget`` option,
        else the level's (:data:`LEVEL_BUDGETS`) where the template cannot take the level."""
        if requested is not None:
            return requested
        if option is not None and option >= 0:
            return int(option)
        if isinstance(self.think, str) and not self.style.takes_level:
            return LEVEL_BUDGETS.get(self.think)
        return None

    def apply(self, request: GenerationRequest, budget: int | None = None) -> None:
        """Set the template switches, the control-token output the splitter reads and the
        reasoning budget (call it once the request's sampling options are final: format and
        tool grammar included).

        Output constrained by a grammar (a format, a forced call) keeps its reasoning: the
        grammar waits for the reasoning block to close (a lazy grammar triggered by the close
        tag) and constrains the answer after it, so a reasoning model can reason and answer
        valid JSON. A lazy call grammar (``tool_choice: auto``) waits for the close tag too.
        Where the template itself closes the block in the prompt (reasoning switched off),
        the runner drops that wait (``closed_triggers``). Harmony's channels and reasoning
        switched off leave the output constrained from its first token: it is the answer."""
        self.asked_switches = self.template_kwargs()
        options = request.options
        constrained = output_constrained(options)
        lazy = self.reasons_in_output and not self.style.harmony
        if constrained and not lazy:
            self.constrained = True
            if self.think is None:
                self.think = False
        request.template_kwargs.update(self.template_kwargs())
        request.render_special = True
        if not self.reasons_in_output:
            return
        assert self.style.tags is not None
        open_tag, close_tag = self.style.tags
        options.reasoning_tags = [open_tag, close_tag]
        if constrained:
            options.grammar_after_reasoning = True
        elif options.grammar_triggers:
            options.closed_triggers = list(options.grammar_triggers)
            options.grammar_triggers = [
                after_reasoning(pattern, close_tag) for pattern in options.grammar_triggers
            ]
        if budget is not None:
            options.reasoning_budget = budget

    @property
    def reasons_in_output(self) -> bool:
        """Whether the answer is expected to hold a reasoning block (tags, not switched off
        by the template): a lazy call grammar must then wait for the block to close."""
        if self.style.tags is None or self.constrained:
            return False
        switchable = bool(self.style.switches & {"enable_thinking", "thinking"})
        return not (self.think is False and switchable)

    def splitter(self, prompt_tail: str = "") -> ThinkingSplitter | None:
        """A fresh splitter for one answer (None for harmony, whose parser splits channels);
        ``prompt_tail`` tells whether the template opened the reasoning block itself."""
        if self.style.tags is None:
            return None
        open_tag, close_tag = self.style.tags
        opened = not self.constrained and starts_thinking(prompt_tail, open_tag)
        return ThinkingSplitter(open_tag, close_tag, starts_thinking=opened)


def after_reasoning(pattern: str, close_tag: str) -> str:
    """A lazy-grammar trigger (``^[\\s\\S]*?(<opener>)...``) that fires only after the
    reasoning block closed: a model that writes its family's call opener while reasoning
    (Qwen3 may mention ``<tool_call>`` in its thoughts) is not forced into a call there, and
    the call it makes after reasoning is constrained as usual."""
    lead = r"^[\s\S]*?"
    if not pattern.startswith(lead):
        return pattern
    return lead + re.escape(close_tag) + pattern[len("^") :]


def output_constrained(options: SamplingOptions) -> bool:
    """Whether a grammar constrains the output from its first token (``format``,
    ``response_format``, a forced tool call); a lazy grammar waits for its trigger."""
    forced = options.grammar is not None and not options.grammar_triggers
    return options.json_mode or options.json_schema is not None or forced


def plan_thinking(
    chat: ChatTemplate, think: bool | str | None, *, field: str = "think"
) -> ThinkPlan | None:
    """The thinking plan of a request whose ``think`` was parsed by :func:`parse_think` (or
    :func:`reasoning_effort_think`) for the model whose template is ``chat``; None for a model
    that does not reason.

    Asking a model that does not reason to think is Ollama's 400 (``"<model>" does not
    support thinking``); asking it not to is fine."""
    if chat.thinking is None:
        if think not in (None, False):
            raise _problem(
                f'"{chat.model}" does not support thinking', field, "thinking_unsupported"
            )
        return None
    return ThinkPlan(style=chat.thinking, think=think)


class ThinkAsk(Protocol):
    """What the reasoning switch reads of a request (the core's ``Ask`` has these fields)."""

    @property
    def think(self) -> bool | str | None: ...
    @property
    def think_field(self) -> str: ...
    @property
    def thinking_budget(self) -> int | None: ...
    @property
    def options(self) -> dict[str, Any]: ...


def request_thinking(
    chat: ChatTemplate, ask: ThinkAsk, request: GenerationRequest
) -> ThinkPlan | None:
    """The reasoning plan of ``ask`` for the model whose template is ``chat``
    (:func:`plan_thinking`), applied to the runner ``request`` with its budget (call it once
    the request's tools have set their grammar); None for a model that does not reason."""
    think = plan_thinking(chat, ask.think, field=ask.think_field)
    if think is not None:
        think.apply(request, think.budget(ask.thinking_budget, ask.options.get("thinking_budget")))
    return think
