"""The prompt of one request, planned once: template, tools and thinking in, one
:class:`PromptPlan` out.

The request core (:mod:`localllm.daemon.api.core`) calls :func:`plan_prompt` once with the
neutral request and its sampling options; everything the prompt needs is decided here, in
this order: the model's chat template, read once into a frozen value
(:class:`~.chat.ChatTemplate`: which template, its call family, its reasoning style, the
Modelfile's SYSTEM and MESSAGEs) that the other parts take instead of the model; the tools
(checked, their grammar), the reasoning switch (the template's variables, the tags a grammar
waits for, the budget), the conversation as the template reads
it (or the prompt text itself, for a raw prompt, a fill-in-the-middle or a continued
``context``), and the sampling options with the grammar and reasoning fields set. The runner
renders a conversation with the chat template itself (it knows the BOS/EOS text and drops old
turns to fit the context); a continued ``context`` is rendered here, in the same sandbox.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from localllm.store.models import LocalModel

from ..runner.protocol import GenerationRequest, SamplingOptions
from .chat import chat_template
from .history import PromptTurn, continuation, conversation
from .thinking import ThinkPlan, request_thinking
from .tools import ToolAsk, ToolPlan, request_tools

__all__ = ["PromptAsk", "PromptPlan", "plan_prompt"]


class PromptAsk(ToolAsk, Protocol):
    """What the prompt reads of a request (the core's ``Ask`` has these fields): the tools'
    fields (:class:`~.tools.ToolAsk`) and these."""

    @property
    def model(self) -> LocalModel: ...
    @property
    def turns(self) -> Sequence[PromptTurn] | None: ...
    @property
    def prompt(self) -> str | None: ...
    @property
    def prompt_tokens(self) -> list[int] | None: ...
    @property
    def raw(self) -> bool: ...
    @property
    def system(self) -> str | None: ...
    @property
    def suffix(self) -> str | None: ...
    @property
    def context(self) -> list[int] | None: ...
    @property
    def template(self) -> str | None: ...
    @property
    def think(self) -> bool | str | None: ...
    @property
    def think_field(self) -> str: ...
    @property
    def thinking_budget(self) -> int | None: ...
    @property
    def options(self) -> dict[str, Any]: ...
    @property
    def template_kwargs(self) -> dict[str, Any]: ...


@dataclass
class PromptPlan:
    """A request's prompt, planned: what the runner request carries, and how to read the
    answer back (the tool-call parser and the reasoning splitter)."""

    options: SamplingOptions
    """The request's sampling options with the grammar plan set: a forced call's grammar or
    the lazy one and its triggers, the reasoning tags a grammar waits for, the budget."""
    messages: list[dict[str, Any]] | None = None
    """The conversation the runner renders with the chat template (None: a prompt text)."""
    template: str | None = None
    """The Jinja template the runner renders (the request's or the Modelfile's; None: the
    GGUF's own)."""
    text: str | None = None
    """The prompt text (a raw prompt, the text before a fill-in-the-middle cursor, a
    continuation rendered here); None for a conversation."""
    raw: bool = False
    """The text is the whole input: the runner applies no template."""
    suffix: str | None = None
    """Fill in the middle: the text after the cursor."""
    context: list[int] | None = None
    """Tokens that come before the text (a continued exchange, or a prompt given as ids)."""
    tool_definitions: list[dict[str, Any]] | None = None
    """The tools the template renders."""
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Template variables: the reasoning switches, then the request's own (which win)."""
    render_special: bool = False
    """The runner writes control tokens as text (the call and reasoning parsers read them)."""
    tools: ToolPlan | None = None
    """The tools offered, their grammar and the call parser (None: no tools)."""
    think: ThinkPlan | None = None
    """The reasoning switch and the splitter (None: a model that does not reason, or a
    prompt that is not templated)."""


def plan_prompt(ask: PromptAsk, sampling: SamplingOptions) -> PromptPlan:
    """Plan the prompt of ``ask`` whose sampling options (format included) are ``sampling``
    (left as they are: the plan holds a copy with the grammar plan set). Every problem with
    the request's tools, reasoning, history or template is a 400 here, before anything
    runs.

    Each part of the room is asked once, in this order: the chat template (what it is and
    says, :func:`chat_template`), the tools (checked, their grammar offered), the reasoning
    switch (it reads the grammar the tools set), then the conversation or the prompt text."""
    templated = not (ask.raw or ask.suffix is not None or ask.prompt_tokens is not None)
    # the request's own template counts only where a template is applied
    chat = chat_template(ask.model, ask.template if templated else None)
    request = GenerationRequest(id="", options=dataclasses.replace(sampling))
    tools = request_tools(chat, ask, request)
    think: ThinkPlan | None = None
    # a raw prompt has no template to switch: the reasoning the model writes is split out
    if templated or (ask.raw and ask.think):
        think = request_thinking(chat, ask, request)
    if ask.turns is not None or (templated and not ask.context):
        # the request's turns, or its prompt as one user turn
        prompt = ask.prompt or ""
        request.messages = conversation(chat, ask.turns, ask.system, tools, prompt=prompt)
        request.template = chat.rendered
    elif ask.prompt_tokens is not None:
        request.prompt, request.raw, request.context = "", True, list(ask.prompt_tokens)
    elif not templated:
        request.prompt, request.raw, request.suffix = ask.prompt or "", ask.raw, ask.suffix
    else:
        switches = think.asked_switches if think is not None else {}
        request.prompt = continuation(chat, ask.system, ask.prompt or "", switches)
        request.raw, request.context = True, list(ask.context or ())
    # explicit template variables win over the ones the reasoning switch sets
    request.template_kwargs.update(ask.template_kwargs)
    return PromptPlan(
        options=request.options,
        messages=request.messages,
        template=request.template,
        text=request.prompt,
        raw=request.raw,
        suffix=request.suffix,
        context=request.context,
        tool_definitions=request.tools,
        template_kwargs=request.template_kwargs,
        render_special=request.render_special,
        tools=tools,
        think=think,
    )
