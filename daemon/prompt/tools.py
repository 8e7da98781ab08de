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
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from localllm.store.models import LocalModel

from ..errors import HTTPProblem
from ..toolcalls.core import ToolCall, new_call_id
from ..toolcalls.detect import detect_family, grammar_syntax, parser_for, template_supports_tools
from ..toolcalls.grammar import ToolGrammarError, lazy_triggers, tool_call_grammar
from ..toolcalls.output import OutputParser
from ..toolcalls.thinking import ThinkingSplitter
from .template import effective_template

__all__ = [
    "ToolPlan",
    "plan_tools",
    "supports_tools",
]

# OpenAI allows letters, digits, _ and - (64 at most); dots and colons appear in MCP tool
# names that Ollama accepts, and every parser here reads them.
_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,64}$")
_ALNUM = string.ascii_letters + string.digits


def supports_tools(model: LocalModel) -> bool:
    """Whether ``model``'s chat template renders ``tools`` (its ``tools`` capability)."""
    try:
        return template_supports_tools(effective_template(model))
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


def plan_tools(
    model: LocalModel,
    tools: list[Any] | None,
    *,
    tool_choice: str | dict[str, Any] | None = None,
    parallel: bool | None = None,
    constrained_output: bool = False,
    field: str = "tools",
    template: str | None = None,
) -> ToolPlan | None:
    """Check a request's tools; None when there are none to offer the model. ``template``
    is the model's effective template when the caller has it (None: looked up here).

    A model whose template takes no tools answers Ollama's 400 (``<model> does not support
    tools``) unless ``tool_choice`` is ``none``, which drops the tools. ``constrained_output``
    says the request already constrains the output (``format``, ``response_format``), which
    cannot be combined with a required call.
    """
    if tools is not None and not isinstance(tools, list):
        raise _problem(f"{field} must be a list", field)
    definitions = _normalize_tools(tools or [], field)
    mode, forced, offered = _choice(tool_choice, definitions)
    if tool_choice is not None and not definitions:
        raise _problem("tool_choice needs tools", "tool_choice")
    if not definitions or mode == "none":
        return None
    if template is None:
        template = effective_template(model)
    if not template_supports_tools(template):
        raise _problem(
            f"{model.name.short} does not support tools: its chat template does not render "
            "them (use a model whose template does, or set a TEMPLATE that does)",
            field,
            "tools_unsupported",
        )
    plan = ToolPlan(tools=offered, template=template, parallel=parallel is not False)
    family = detect_family(template)
    plan.mistral_ids = family is not None and family.family == "mistral"
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
            template, key, mode == "required", forced, plan.parallel
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
    template: str, tools: str, required: bool, name: str | None, parallel: bool
) -> tuple[str | None, tuple[str, ...], str | None]:
    """The calls' grammar for ``tools`` (JSON text) in ``template``'s call syntax: forced
    (``required``) or lazy, with the triggers that start it (none: no opener to wait for, no
    grammar), and why a grammar cannot be built (raised naming the request's field).

    Cached: an agent sends the same tools on every turn, and turning their schemas into a
    grammar is the costliest part of planning a prompt (the schemas converted to GBNF)."""
    syntax = grammar_syntax(template) or "json"
    triggers = () if required else tuple(lazy_triggers(syntax))
    if not required and not triggers:
        return None, (), None
    try:
        grammar = tool_call_grammar(syntax, json.loads(tools), name=name, parallel=parallel)
    except ToolGrammarError as exc:
        return None, triggers, str(exc)
    return grammar, triggers, None
