"""The prompt of one request, planned once: template, tools and thinking in, one
:class:`PromptPlan` out.

The request core (:mod:`localllm.daemon.api.core`) calls :func:`plan_prompt` once with the
neutral request and its sampling options; everything the prompt needs is decided here, in
this order: the tools (checked, their grammar), the reasoning switch (the template's
variables, the tags a grammar waits for, the budget), the conversation as the template reads
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

from ..errors import HTTPProblem
from ..runner.protocol import GenerationRequest, SamplingOptions
from .history import PromptTurn, conversation
from .template import TemplateRenderError, model_template, render_chat
from .thinking import LEVEL_BUDGETS, ThinkPlan, plan_thinking
from .tools import ToolPlan, plan_tools

__all__ = ["PromptAsk", "PromptPlan", "check_strict", "plan_prompt"]


class PromptAsk(Protocol):
    """What the prompt reads of a request (the core's ``Ask`` has these fields)."""

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
    def tools(self) -> list[Any] | None: ...
    @property
    def tool_choice(self) -> str | dict[str, Any] | None: ...
    @property
    def parallel(self) -> bool | None: ...
    @property
    def strict(self) -> bool: ...
    @property
    def tool_renames(self) -> Sequence[tuple[str, str]]: ...
    @property
    def think(self) -> bool | str | None: ...
    @property
    def think_field(self) -> str: ...
    @property
    def thinking_budget(self) -> int | None: ...
    @property
    def format(self) -> str | dict[str, Any] | None: ...
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


def check_strict(tools: ToolPlan | None, strict: bool, field: str = "tools") -> None:
    """Strict tools need every call checked against its schema: by the forced call's grammar
    or the lazy one that starts at the family's call opener. Without either, a 400."""
    if strict and tools is not None and tools.grammar is None and tools.lazy_grammar is None:
        raise HTTPProblem(
            400,
            "strict tools: calls cannot be checked against their schemas here (this model's "
            "call syntax has no opener to start checking at, or the output has a format); "
            "drop strict, or force a call with tool_choice",
            param=field,
        )


def _plan_tools(ask: PromptAsk, template: str | None) -> ToolPlan | None:
    """:func:`plan_tools` with its 400s naming the fields as the family spells them."""
    try:
        tools = plan_tools(
            ask.model,
            ask.tools,
            tool_choice=ask.tool_choice,
            parallel=ask.parallel,
            constrained_output=ask.format is not None,
            template=template,
        )
    except HTTPProblem as exc:
        if not ask.tool_renames:
            raise
        message, param = exc.message, exc.param
        for old, new in ask.tool_renames:
            message = message.replace(old, new)
            param = param.replace(old, new) if param else param
        raise HTTPProblem(exc.status, message, param=param, code=exc.code) from None
    check_strict(tools, ask.strict)
    return tools


# The runner's template for a model that has none (its prepare() falls back to the same).
_PLAIN_TEMPLATE = "{% for message in messages %}{{ message['content'] }}\n\n{% endfor %}"


def _continuation(ask: PromptAsk, template: str | None, kwargs: dict[str, Any]) -> str:
    """The templated prompt of a request that continues ``context``.

    Ollama renders the new prompt and puts it after the context's tokens; the runner takes
    ``context`` only before a prompt it does not template, so the template is rendered here
    (in the same sandbox the runner uses). The model's default system prompt was part of
    the earlier exchange and is not repeated; a ``system`` in the request is. The prompt
    continues a sequence, so the template's BOS text is left out (``bos_token`` is empty).
    """
    messages: list[dict[str, Any]] = []
    if ask.system:
        messages.append({"role": "system", "content": ask.system})
    messages.append({"role": "user", "content": ask.prompt or ""})
    try:
        return render_chat(
            template or ask.model.info.chat_template or _PLAIN_TEMPLATE,
            messages,
            add_generation_prompt=True,
            extra=kwargs,
        )
    except TemplateRenderError as exc:
        raise HTTPProblem(400, str(exc), param="template") from None


def _budget(ask: PromptAsk, think: ThinkPlan) -> int | None:
    """The reasoning budget: the request's, else the ``thinking_budget`` option, else its
    level's where the template cannot take the level itself."""
    if ask.thinking_budget is not None:
        return ask.thinking_budget
    option = ask.options.get("thinking_budget")
    if option is not None and option >= 0:
        return int(option)
    if isinstance(ask.think, str) and not think.style.takes_level:
        return LEVEL_BUDGETS.get(ask.think)
    return None


def _offer(request: GenerationRequest, tools: ToolPlan) -> None:
    """Put the tools, their grammar and the control-token output the call parsers read into
    the runner request (its sampling options final but for the reasoning's fields)."""
    request.tools = tools.tools
    request.render_special = True
    if tools.grammar is not None:
        request.options.grammar = tools.grammar
    elif tools.lazy_grammar is not None:
        request.options.grammar = tools.lazy_grammar
        request.options.grammar_triggers = list(tools.triggers)


def plan_prompt(ask: PromptAsk, sampling: SamplingOptions) -> PromptPlan:
    """Plan the prompt of ``ask`` whose sampling options (format included) are ``sampling``
    (left as they are: the plan holds a copy with the grammar plan set). Every problem with
    the request's tools, reasoning, history or template is a 400 here, before anything
    runs."""
    model = ask.model
    # The templates are looked up once: the Modelfile's Jinja TEMPLATE, else the GGUF's
    # (effective_template()) decides the tools' call syntax; the request's own template, else
    # the Modelfile's, is the one rendered (None: the runner renders the GGUF's).
    modelfile = model_template(model)
    effective = modelfile or model.info.chat_template
    template = ask.template or modelfile
    tools = None
    if ask.tools is not None or ask.tool_choice is not None:
        tools = _plan_tools(ask, effective)
    templated = not (ask.raw or ask.suffix is not None or ask.prompt_tokens is not None)
    think: ThinkPlan | None = None
    if templated:
        think = plan_thinking(
            model, ask.think, field=ask.think_field, template=template or effective
        )
    elif ask.raw and ask.think:
        # no template to switch: the reasoning the model writes is split out
        think = plan_thinking(model, ask.think, field=ask.think_field, template=effective)
    # The tool and reasoning plans set their fields on a runner request (they are applied
    # in this order, as the reasoning plan reads the grammar the tools set).
    request = GenerationRequest(id="", options=dataclasses.replace(sampling))
    if ask.turns is not None:
        request.messages = conversation(model, ask.turns, ask.system, tools)
        request.template = template
    elif ask.prompt_tokens is not None:
        request.prompt, request.raw, request.context = "", True, list(ask.prompt_tokens)
    elif not templated:
        request.prompt, request.raw, request.suffix = ask.prompt or "", ask.raw, ask.suffix
    elif ask.context:
        kwargs = think.template_kwargs() if think is not None else {}
        request.prompt, request.raw = _continuation(ask, template, kwargs), True
        request.context = list(ask.context)
    else:
        request.messages = conversation(model, None, ask.system, None, prompt=ask.prompt or "")
        request.template = template
    if tools is not None:
        _offer(request, tools)
    if think is not None:
        think.apply(request, _budget(ask, think))
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
