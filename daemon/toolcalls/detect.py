"""Which family a chat template's tool calls belong to, recognised from the template itself as
llama.cpp's ``common/chat.cpp`` and Ollama's ``tools/template.go`` do."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from .core import ToolCallParser
from .generic import GemmaParser, GenericJsonParser
from .harmony import HarmonyParser
from .hermes import GraniteParser, HermesParser, Qwen3CoderParser
from .llama3 import Llama3Parser
from .mistral import MistralParser

__all__ = [
    "FAMILIES",
    "detect_family",
    "grammar_syntax",
    "parser_for",
    "template_supports_tools",
    "template_variables",
]


def template_variables(template: str) -> set[str] | None:
    """Variables a Jinja chat template reads without setting them (Jinja's own analysis, in
    its sandbox); None when Jinja cannot parse the template."""
    try:
        from jinja2 import meta
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        environment = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"])
        return set(meta.find_undeclared_variables(environment.parse(template)))
    except Exception:
        return None


FAMILIES: tuple[type[ToolCallParser], ...] = (
    HarmonyParser,
    GraniteParser,
    Qwen3CoderParser,
    HermesParser,
    MistralParser,
    Llama3Parser,
    GemmaParser,
)
"""Families in the order they are tested (first match wins, as in llama.cpp: many templates
mention ``<tool_call>``, so the more specific markers come first)."""


@lru_cache(maxsize=64)
def template_supports_tools(template: str | None) -> bool:
    """Whether a Jinja chat template renders the ``tools`` it is given (Ollama's "tools"
    capability). Uses Jinja's own analysis of undeclared variables; a template Jinja cannot
    parse is judged by the text, as Ollama does (``tools`` or ``tool_call`` in it)."""
    if not template:
        return False
    variables = template_variables(template)
    if variables is None:
        return "tools" in template or "tool_call" in template
    return "tools" in variables


@lru_cache(maxsize=64)
def detect_family(template: str | None) -> type[ToolCallParser] | None:
    """The tool-call parser class for a chat template; None if it takes no tools."""
    if not template_supports_tools(template):
        return None
    assert template is not None
    for family in FAMILIES:
        if family.matches(template):
            return family
    return GenericJsonParser


def parser_for(
    template: str | None, tools: Sequence[dict[str, Any]] | None
) -> ToolCallParser | None:
    """A fresh parser for one response, or None if the template takes no tools."""
    family = detect_family(template)
    return family(tools) if family is not None else None


@lru_cache(maxsize=64)
def grammar_syntax(template: str | None) -> str | None:
    """The call syntax name :func:`tool_call_grammar` and :func:`lazy_triggers` take for a
    template: its family, with Mistral split by whether calls are written ``f[ARGS]{...}``."""
    family = detect_family(template)
    if family is None:
        return None
    if family is MistralParser and template and "[ARGS]" in template:
        return "mistral-args"
    return family.family
