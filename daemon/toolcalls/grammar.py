"""Grammars for tool calls: :func:`tool_call_grammar` builds a GBNF grammar (strict JSON, see
:mod:`localllm.daemon.engine.jsongrammar`) that forces a call to one of the given tools in a
family's syntax, for ``tool_choice: "required"`` or a named function; :func:`lazy_triggers`
gives the patterns that start a lazy grammar for ``tool_choice: "auto"``."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from .core import tool_names, tool_parameters

__all__ = ["ToolGrammarError", "lazy_triggers", "tool_call_grammar"]


class ToolGrammarError(ValueError):
    """A tool's parameter schema cannot be turned into a grammar; ``index`` is the tool."""

    def __init__(self, message: str, index: int | None = None) -> None:
        super().__init__(message)
        self.index = index


def _gbnf_literal(text: str) -> str:
    return json.dumps(text)


def _call_schema(name: str, parameters: dict[str, Any], arguments_key: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": name}, arguments_key: parameters},
        "required": ["name", arguments_key],
        "additionalProperties": False,
    }


def _rename_root(grammar: str, new_root: str) -> str:
    return re.sub(r"^root ::=", f"{new_root} ::=", grammar, count=1, flags=re.MULTILINE)


def _schema_grammar(schema: dict[str, Any], root: str, order: list[str]) -> str:
    from ..engine.jsongrammar import schema_gbnf

    try:
        grammar = schema_gbnf(schema, order)
    except Exception as exc:
        raise ToolGrammarError(f"cannot build a grammar from the tool schemas: {exc}") from exc
    return _rename_root(grammar, root)


def _selected(
    tools: Sequence[dict[str, Any]], name: str | None
) -> list[tuple[str, dict[str, Any]]]:
    chosen = []
    for tool, tool_name in zip(tools, tool_names(tools), strict=False):
        if name is None or tool_name == name:
            chosen.append((tool_name, tool_parameters(tool)))
    if not chosen:
        raise ToolGrammarError(f"no tool named {name!r}" if name else "no tools to call")
    return chosen


def tool_call_grammar(
    family: str,
    tools: Sequence[dict[str, Any]],
    *,
    name: str | None = None,
    parallel: bool = True,
) -> str:
    """A GBNF grammar whose every sentence is a call (or, with ``parallel``, one or more
    calls) to one of ``tools`` (only ``name`` when given), in ``family``'s syntax, with
    arguments valid for the tool's JSON schema. The root rule is ``root``."""
    chosen = _selected(tools, name)
    if family == "harmony":
        rules = []
        alternatives = []
        for i, (tool_name, parameters) in enumerate(chosen):
            rules.append(_schema_grammar(parameters, f"args{i}", []))
            head = f"<|channel|>commentary to=functions.{tool_name} <|constrain|>json<|message|>"
            alternatives.append(f"{_gbnf_literal(head)} args{i}")
        # one call per assistant message; the runner stops at <|call|>
        return "\n".join([f"root ::= {' | '.join(alternatives)}", *rules]) + "\n"
    if family == "qwen3-coder":
        return _qwen3_coder_grammar(chosen, parallel)
    if family == "mistral-args":
        rules = []
        alternatives = []
        for i, (tool_name, parameters) in enumerate(chosen):
            rules.append(_schema_grammar(parameters, f"args{i}", []))
            alternatives.append(f"{_gbnf_literal('[TOOL_CALLS]' + tool_name + '[ARGS]')} args{i}")
        one = "call ::= " + " | ".join(alternatives)
        root = "root ::= call+" if parallel else "root ::= call"
        return "\n".join([root, one, *rules]) + "\n"
    key = "parameters" if family == "llama3" else "arguments"
    schema = {"oneOf": [_call_schema(n, p, key) for n, p in chosen]}
    if len(chosen) == 1:
        schema = schema["oneOf"][0]
    call_rules = _schema_grammar(schema, "call", ["name", key])
    many = parallel
    if family in ("hermes",):
        wrapped = '"<tool_call>\\n" call "\\n</tool_call>"'
        root = f'root ::= {wrapped} ("\\n" {wrapped})*' if many else f"root ::= {wrapped}"
    elif family == "mistral":
        root = 'root ::= "[TOOL_CALLS][" call ' + ('("," space call)* ' if many else "") + '"]"'
    elif family == "granite":
        root = 'root ::= "<|tool_call|>[" call ' + ('("," space call)* ' if many else "") + '"]"'
    elif family == "llama3":
        root = 'root ::= call ("; " call)*' if many else "root ::= call"
    else:  # json, gemma: a bare object, or a list of them
        root = 'root ::= call | "[" call ("," space call)* "]"' if many else "root ::= call"
    return f"{root}\n{call_rules}\n"


def _qwen3_coder_grammar(chosen: list[tuple[str, dict[str, Any]]], parallel: bool) -> str:
    """Qwen3-Coder's XML-ish calls: parameter values are free text up to ``</parameter>``
    (the schema types them after parsing), so only names are constrained."""
    rules = []
    for i, (tool_name, parameters) in enumerate(chosen):
        properties = parameters.get("properties")
        keys = list(properties) if isinstance(properties, dict) else []
        params = " | ".join(
            _gbnf_literal(f"<parameter={key}>\n") + " value " + _gbnf_literal("\n</parameter>\n")
            for key in keys
        )
        head = _gbnf_literal(f"<tool_call>\n<function={tool_name}>\n")
        tail = _gbnf_literal("</function>\n</tool_call>")
        rules.append(
            f"fn{i} ::= {head} ({params})* {tail}" if params else f"fn{i} ::= {head} {tail}"
        )
    names = " | ".join(f"fn{i}" for i in range(len(chosen)))
    root = f"root ::= ({names})" + (f' ("\\n" ({names}))*' if parallel else "")
    value = 'value ::= ([^<] | "<" [^/])*'
    return "\n".join([root, *rules, value]) + "\n"


def lazy_triggers(family: str) -> list[str]:
    """Regex patterns (llama.cpp's lazy-grammar ``trigger_patterns``) that switch a lazy
    tool-call grammar on for ``tool_choice: "auto"``: the grammar is fed from the first
    capture group, i.e. from the family's call opener. Empty when the family has no opener
    a grammar can wait for (bare JSON: Llama 3.x, the generic family)."""
    openers = {
        "hermes": "<tool_call>",
        "qwen3-coder": "<tool_call>",
        "mistral": "[TOOL_CALLS]",
        "mistral-args": "[TOOL_CALLS]",
        "granite": "<|tool_call|>",
        "harmony": "<|channel|>commentary to=functions.",
    }
    opener = openers.get(family)
    if opener is None:
        return []
    return [r"^[\s\S]*?(" + re.escape(opener) + r")[\s\S]*"]
