"""Tool calling and reasoning at the API layer, for the request core (:mod:`.core`).

A request's ``tools`` are checked here (400 naming the field for anything malformed), the
chat history's calls and results are put in the shape chat templates expect (Hugging Face's
``apply_chat_template`` convention: arguments as objects, ``role: tool`` results), the
``tool_choice`` becomes a grammar when a call is required, and the model's output is parsed
back into calls by the template family's parser (:mod:`localllm.daemon.toolcalls`).
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import string
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from localllm.store.models import LocalModel

from ..errors import HTTPProblem
from ..prompt.template import is_go_template
from ..runner.protocol import GenerationRequest, SamplingOptions
from ..toolcalls.core import Parsed, ToolCall, new_call_id
from ..toolcalls.detect import detect_family, grammar_syntax, parser_for, template_supports_tools
from ..toolcalls.grammar import ToolGrammarError, lazy_triggers, tool_call_grammar
from ..toolcalls.harmony import HarmonyParser
from ..toolcalls.output import OutputParser
from ..toolcalls.thinking import ThinkingSplitter, ThinkingStyle, starts_thinking, thinking_style

__all__ = [
    "THINK_LEVELS",
    "AnswerStream",
    "ThinkPlan",
    "ToolPlan",
    "after_reasoning",
    "effective_template",
    "flat_tool",
    "history_tool_calls",
    "jinja_override",
    "map_call_id",
    "model_template",
    "model_thinking",
    "output_constrained",
    "parse_think",
    "plan_thinking",
    "plan_tools",
    "reasoning_effort_think",
    "split_output",
    "supports_tools",
]

# OpenAI allows letters, digits, _ and - (64 at most); dots and colons appear in MCP tool
# names that Ollama accepts, and every parser here reads them.
_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,64}$")
_ALNUM = string.ascii_letters + string.digits


def jinja_override(text: str | None) -> str | None:
    """``text`` if it is a Jinja template the runner can render, None for Ollama's Go
    templates (``{{ .Prompt }}``)."""
    # Ollama's template layers are Go templates ({{ .Prompt }}); only Jinja can go to the
    # runner, which otherwise renders the GGUF's own chat template.
    if not text or is_go_template(text):
        return None
    return text


def model_template(model: LocalModel) -> str | None:
    """A Modelfile ``TEMPLATE`` written in Jinja, which the runner renders instead of the
    GGUF's chat template; None when the model has none (or only a Go template)."""
    from localllm.store.manifest import MEDIA_TEMPLATE

    layer = model.entry.manifest.layer(MEDIA_TEMPLATE)
    return jinja_override(model.template) if layer is not None else None


def effective_template(model: LocalModel) -> str | None:
    """The Jinja chat template the runner renders for ``model``: a Modelfile ``TEMPLATE``
    written in Jinja, else the GGUF's own (Go templates cannot be rendered, so the GGUF's
    template is used for those, and is the one whose tool syntax counts)."""
    return model_template(model) or model.info.chat_template


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

    def apply(self, request: GenerationRequest) -> None:
        """Put the tools, their grammar and the control-token output the parsers read into
        a runner request (its sampling options must be final, format included)."""
        request.tools = self.tools
        request.render_special = True
        if self.grammar is not None:
            request.options.grammar = self.grammar
        elif self.lazy_grammar is not None:
            request.options.grammar = self.lazy_grammar
            request.options.grammar_triggers = list(self.triggers)

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
) -> ToolPlan | None:
    """Check a request's tools; None when there are none to offer the model.

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
    syntax = grammar_syntax(template) or "json"
    if mode == "required":
        if constrained_output:
            raise _problem(
                "a required tool call cannot be combined with a response format",
                "tool_choice",
            )
        try:
            plan.grammar = tool_call_grammar(syntax, offered, name=forced, parallel=plan.parallel)
        except ToolGrammarError as exc:
            raise _problem(f"{field}: {exc}", field) from None
    elif not constrained_output and (triggers := lazy_triggers(syntax)):
        # auto: prose stays free; once the model writes its family's call opener, the lazy
        # grammar keeps the call valid for the schemas (llama.cpp's lazy grammar). A format
        # already constrains the whole output, and bare-JSON families have no opener to wait
        # for: those parse what the model writes unconstrained.
        try:
            plan.lazy_grammar = tool_call_grammar(syntax, offered, parallel=plan.parallel)
        except ToolGrammarError as exc:
            raise _problem(f"{field}: {exc}", field) from None
        plan.triggers = triggers
    return plan


def _arguments(value: Any, where: str) -> dict[str, Any]:
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise _problem(f"{where} is not valid JSON", where) from None
    if not isinstance(value, dict):
        raise _problem(f"{where} must be a JSON object", where)
    return value


def _mistral_id(value: str) -> str:
    """Any call id as the 9 letters and digits Mistral templates require (stable per id)."""
    if len(value) == 9 and value.isalnum():
        return value
    digest = int.from_bytes(hashlib.sha256(value.encode()).digest()[:8], "big")
    out = []
    for _ in range(9):
        digest, rest = divmod(digest, len(_ALNUM))
        out.append(_ALNUM[rest])
    return "".join(out)


def history_tool_calls(
    calls: Sequence[Any], where: str, plan: ToolPlan | None
) -> list[dict[str, Any]]:
    """An assistant message's calls as templates read them: ``{"id", "type": "function",
    "function": {"name", "arguments": {...}}}`` (Ollama sends arguments as an object, OpenAI
    as a JSON string; templates write them with ``tojson``, so they get the object)."""
    out = []
    for index, call in enumerate(calls):
        at = f"{where}[{index}]"
        if not isinstance(call, dict):
            raise _problem(f"{at} must be an object", at)
        function = call.get("function")
        if not isinstance(function, dict):
            raise _problem(f"{at}.function must be an object", f"{at}.function")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise _problem(f"{at}.function.name is required", f"{at}.function.name")
        item: dict[str, Any] = {
            "type": "function",
            "function": {
                "name": name,
                "arguments": _arguments(function.get("arguments"), f"{at}.function.arguments"),
            },
        }
        call_id = call.get("id")
        if isinstance(call_id, str) and call_id:
            item["id"] = map_call_id(call_id, plan)
        out.append(item)
    return out


def map_call_id(call_id: str, plan: ToolPlan | None) -> str:
    """A call id from the history as the template needs it."""
    return _mistral_id(call_id) if plan is not None and plan.mistral_ids else call_id


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


def model_thinking(model: LocalModel, template: str | None = None) -> ThinkingStyle | None:
    """How ``model`` (with ``template`` instead of its own, when given) reasons, or None when
    its template shows no reasoning (its ``thinking`` capability)."""
    try:
        return thinking_style(template or effective_template(model))
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
    model: LocalModel,
    think: bool | str | None,
    *,
    field: str = "think",
    template: str | None = None,
) -> ThinkPlan | None:
    """The thinking plan of a request whose ``think`` was parsed by :func:`parse_think` (or
    :func:`reasoning_effort_think`); None for a model that does not reason.

    Asking a model that does not reason to think is Ollama's 400 (``"<model>" does not
    support thinking``); asking it not to is fine."""
    style = model_thinking(model, template)
    if style is None:
        if think not in (None, False):
            raise _problem(
                f'"{model.name.short}" does not support thinking', field, "thinking_unsupported"
            )
        return None
    return ThinkPlan(style=style, think=think)


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
