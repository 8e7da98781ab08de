"""A request's tools for the prompt: checked (a 400 naming the field for anything malformed),
offered to the template, turned into a grammar when ``tool_choice`` requires a call (or a lazy
one that starts at the family's call opener), and the history's calls and results put in the
shape chat templates read (Hugging Face's ``apply_chat_template`` convention: arguments as
objects, ``role: tool`` results). The parser that reads the calls back is chosen here too
(:meth:`ToolPlan.parser`), by the template's family (:mod:`localllm.daemon.toolcalls`).
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Protocol

from localllm.store.models import LocalModel

from ..errors import HTTPProblem
from ..runner.protocol import GenerationRequest
from ..toolcalls.core import ToolCall, new_call_id
from ..toolcalls.detect import parser_for
from ..toolcalls.grammar import ToolGrammarError, lazy_triggers, tool_call_grammar
from ..toolcalls.output import OutputParser
from ..toolcalls.thinking import ThinkingSplitter
from .chat import ChatTemplate, chat_template

__all__ = [
    "ToolAsk",
    "ToolPlan",
    "check_strict",
    "plan_tools",
    "request_tools",
    "supports_tools",
]

# OpenAI allows letters, digits, _ and - (64 at most); dots and colons appear in MCP tool
# names that Ollama accepts, and every parser here reads them.
_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,64}$")
_ALNUM = string.ascii_letters + string.digits


def supports_tools(model: LocalModel) -> bool:
    """Whether ``model``'s chat template renders ``tools`` (its ``tools`` capability)."""
    try:
        return chat_template(model).takes_tools
    except Exception:  # a model whose GGUF cannot be read has no capabilities to show
        return False


@dataclass
class ToolPlan:
    """What a request's tools mean for the runner request and the answer."""

    tools: list[dict[str, Any]]
    """The tool definitions for the template (OpenAI's function shape)."""
    template: str | None
    """The chat template (its family decides the call syntax)."""
    grammar: str | None = None
    """A GBNF grammar forcing a call (``tool_choice`` required or a named function)."""
    lazy_grammar: str | None = None
    """For ``tool_choice: auto``: the calls' grammar, applied lazily from ``triggers``."""
    triggers: list[str] = field(default_factory=list)
    """Patterns (the family's call opener) that switch ``lazy_grammar`` on: prose is free,
    a call once begun is constrained to the tools' schemas."""
    parallel: bool = True
    """False: keep at most one call per answer (``parallel_tool_calls: false``)."""
    mistral_ids: bool = False
    """Mistral templates insist on call ids of 9 letters and digits."""

    def parser(self, thinking: ThinkingSplitter | None = None) -> OutputParser:
        """A fresh output parser for one answer (splitting reasoning out first, if given)."""
        return OutputParser(parser_for(self.template, self.tools), thinking)

    def finish_calls(self, calls: list[ToolCall]) -> list[ToolCall]:
        """The calls an answer reports: the first only when parallel calls are off."""
        return calls[:1] if not self.parallel else calls

    def call_id(self, call: ToolCall) -> str:
        """The id an answer gives ``call``: the model's own when it wrote one."""
        if call.id:
            return call.id
        if self.mistral_ids:
            return "".join(secrets.choice(_ALNUM) for _ in range(9))
        return new_call_id()

    def offer(self, request: GenerationRequest) -> None:
        """Put the tools, their grammar and the control-token output the call parsers read
        into the runner request (its sampling options final but for the reasoning's)."""
        request.tools = self.tools
        request.render_special = True
        if self.grammar is not None:
            request.options.grammar = self.grammar
        elif self.lazy_grammar is not None:
            request.options.grammar = self.lazy_grammar
            request.options.grammar_triggers = list(self.triggers)


def _problem(message: str, param: str, code: str = "invalid_field") -> HTTPProblem:
    return HTTPProblem(400, message, param=param, code=code)


def _normalize_tools(tools: list[Any], field: str) -> list[dict[str, Any]]:
    """Tool definitions in OpenAI's function shape; 400 naming the field otherwise."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for index, tool in enumerate(tools):
        where = f"{field}[{index}]"
        if not isinstance(tool, dict):
            raise _problem(f"{where} must be an object", where)
        kind = tool.get("type", "function")
        if kind != "function":
            raise _problem(
                f"{where}.type {kind!r} is not supported: only function tools are", f"{where}.type"
            )
        function = tool.get("function")
        if not isinstance(function, dict):
            raise _problem(f"{where}.function must be an object", f"{where}.function")
        name = function.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise _problem(
                f"{where}.function.name must be 1-64 letters, digits, '_', '-', '.' or ':'",
                f"{where}.function.name",
            )
        if name in seen:
            raise _problem(f"two tools are named {name!r}", f"{where}.function.name")
        seen.add(name)
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise _problem(
                f"{where}.function.parameters must be a JSON schema object",
                f"{where}.function.parameters",
            )
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise _problem(
                f"{where}.function.description must be a string", f"{where}.function.description"
            )
        clean: dict[str, Any] = {"name": name}
        if description is not None:
            clean["description"] = description
        clean["parameters"] = (
            parameters if parameters is not None else {"type": "object", "properties": {}}
        )
        out.append({"type": "function", "function": clean})
    return out


def _choice(
    tool_choice: str | dict[str, Any] | None, tools: list[dict[str, Any]]
) -> tuple[str, str | None, list[dict[str, Any]]]:
    """(mode, forced name, tools) for OpenAI's ``tool_choice``."""
    names = [t["function"]["name"] for t in tools]
    if tool_choice is None:
        return "auto", None, tools
    if isinstance(tool_choice, str):
        if tool_choice not in ("none", "auto", "required"):
            raise _problem(
                'tool_choice must be "none", "auto", "required" or a function', "tool_choice"
            )
        return tool_choice, None, tools
    kind = tool_choice.get("type")
    if kind == "function":
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or name not in names:
            raise _problem(
                f"tool_choice.function.name must name one of the tools ({', '.join(names)})",
                "tool_choice.function.name",
            )
        return "required", name, tools
    if kind == "allowed_tools":
        allowed = tool_choice.get("allowed_tools")
        if not isinstance(allowed, dict):
            raise _problem("tool_choice.allowed_tools must be an object", "tool_choice")
        mode = allowed.get("mode", "auto")
        if mode not in ("auto", "required"):
            raise _problem(
                'tool_choice.allowed_tools.mode must be "auto" or "required"',
                "tool_choice.allowed_tools.mode",
            )
        wanted = []
        for index, item in enumerate(allowed.get("tools") or []):
            function = item.get("function") if isinstance(item, dict) else None
            name = function.get("name") if isinstance(function, dict) else None
            if name not in names:
                raise _problem(
                    f"tool_choice.allowed_tools.tools[{index}] names no tool of the request",
                    f"tool_choice.allowed_tools.tools[{index}]",
                )
            wanted.append(name)
        if not wanted:
            raise _problem("tool_choice.allowed_tools.tools is empty", "tool_choice")
        return mode, None, [t for t in tools if t["function"]["name"] in wanted]
    raise _problem('tool_choice.type must be "function" or "allowed_tools"', "tool_choice.type")


class ToolAsk(Protocol):
    """What the tools read of a request (the core's ``Ask`` has these fields)."""

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
    def format(self) -> str | dict[str, Any] | None: ...


def request_tools(chat: ChatTemplate, ask: ToolAsk, request: GenerationRequest) -> ToolPlan | None:
    """The tools of ``ask`` for the model whose template is ``chat``, checked
    (:func:`plan_tools`) and offered in the runner ``request`` (:meth:`ToolPlan.offer`); None
    when the request offers none."""
    if ask.tools is None and ask.tool_choice is None:
        return None
    plan = plan_tools(
        chat,
        ask.tools,
        tool_choice=ask.tool_choice,
        parallel=ask.parallel,
        constrained_output=ask.format is not None,
        strict=ask.strict,
        renames=ask.tool_renames,
    )
    if plan is not None:
        plan.offer(request)
    return plan


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


def plan_tools(
    chat: ChatTemplate,
    tools: list[Any] | None,
    *,
    tool_choice: str | dict[str, Any] | None = None,
    parallel: bool | None = None,
    constrained_output: bool = False,
    field: str = "tools",
    strict: bool = False,
    renames: Sequence[tuple[str, str]] = (),
) -> ToolPlan | None:
    """Check a request's tools for the model whose template is ``chat``; None when there are
    none to offer the model.

    A model whose template takes no tools answers Ollama's 400 (``<model> does not support
    tools``) unless ``tool_choice`` is ``none``, which drops the tools. ``constrained_output``
    says the request already constrains the output (``format``, ``response_format``), which
    cannot be combined with a required call. ``strict`` tools must be checkable against their
    schemas (:func:`check_strict`). ``renames`` (old, new) spell the fields of a 400 as the
    request's family does."""
    try:
        plan = _plan_tools(chat, tools, tool_choice, parallel, constrained_output, field)
    except HTTPProblem as exc:
        if not renames:
            raise
        message, param = exc.message, exc.param
        for old, new in renames:
            message = message.replace(old, new)
            param = param.replace(old, new) if param else param
        raise HTTPProblem(exc.status, message, param=param, code=exc.code) from None
    check_strict(plan, strict, field)
    return plan


def _plan_tools(
    chat: ChatTemplate,
    tools: list[Any] | None,
    tool_choice: str | dict[str, Any] | None,
    parallel: bool | None,
    constrained_output: bool,
    field: str,
) -> ToolPlan | None:
    if tools is not None and not isinstance(tools, list):
        raise _problem(f"{field} must be a list", field)
    definitions = _normalize_tools(tools or [], field)
    mode, forced, offered = _choice(tool_choice, definitions)
    if tool_choice is not None and not definitions:
        raise _problem("tool_choice needs tools", "tool_choice")
    if not definitions or mode == "none":
        return None
    if chat.family is None:
        raise _problem(
            f"{chat.model} does not support tools: its chat template does not render "
            "them (use a model whose template does, or set a TEMPLATE that does)",
            field,
            "tools_unsupported",
        )
    plan = ToolPlan(tools=offered, template=chat.effective, parallel=parallel is not False)
    plan.mistral_ids = chat.family is not None and chat.family.family == "mistral"
    if mode == "required" and constrained_output:
        raise _problem(
            "a required tool call cannot be combined with a response format", "tool_choice"
        )
    if mode == "required" or not constrained_output:
        # auto: prose stays free; once the model writes its family's call opener, the lazy
        # grammar keeps the call valid for the schemas (llama.cpp's lazy grammar). A format
        # already constrains the whole output, and bare-JSON families have no opener to wait
        # for: those parse what the model writes unconstrained.
        key = json.dumps(offered, ensure_ascii=False)
        grammar, triggers, error = _grammar(
            chat.syntax or "json", key, mode == "required", forced, plan.parallel
        )
        if error is not None:
            raise _problem(f"{field}: {error}", field)
        if mode == "required":
            plan.grammar = grammar
        elif triggers:
            plan.lazy_grammar, plan.triggers = grammar, list(triggers)
    return plan


@lru_cache(maxsize=32)
def _grammar(
    syntax: str, tools: str, required: bool, name: str | None, parallel: bool
) -> tuple[str | None, tuple[str, ...], str | None]:
    """The calls' grammar for ``tools`` (JSON text) in the call ``syntax``: forced
    (``required``) or lazy, with the triggers that start it (none: no opener to wait for, no
    grammar), and why a grammar cannot be built (raised naming the request's field).

    Cached: an agent sends the same tools on every turn, and turning their schemas into a
    grammar is the costliest part of planning a prompt (the schemas converted to GBNF)."""
    triggers = () if required else tuple(lazy_triggers(syntax))
    if not required and not triggers:
        return None, (), None
    try:
        grammar = tool_call_grammar(syntax, json.loads(tools), name=name, parallel=parallel)
    except ToolGrammarError as exc:
        return None, triggers, str(exc)
    return grammar, triggers, None
