"""The families that write a call as an opening tag, JSON and a closing tag: Hermes (and Qwen
2.5/3, QwQ), Granite (and Phi-4-mini), and Qwen3-Coder, whose body is XML-ish instead of
JSON."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, ClassVar

from . import core

__all__ = ["GraniteParser", "HermesParser", "Qwen3CoderParser"]


class _TaggedJsonParser(core.ToolCallParser):
    """Calls as ``<open>`` + JSON (object or array) + optional ``<close>``."""

    opener: ClassVar[str] = ""
    closer: ClassVar[str] = ""

    def __init__(self, tools: Sequence[dict[str, Any]] | None = None) -> None:
        super().__init__(tools)
        self.openers = (self.opener,)

    @classmethod
    def matches(cls, template: str) -> bool:
        """Templates that show the family's opener to the model."""
        return cls.opener in template

    def _parse(self, text: str, final: bool) -> core.Outcome:
        if len(text) < len(self.opener):
            return core.NEED_MORE if not final else core.Reject(len(text))
        body_start = len(self.opener)
        body = text[body_start:]
        value = body.lstrip()
        offset = body_start + len(body) - len(value)
        if not value:
            return core.more(final, bare=True)
        if value[0] not in "{[":
            return self._other_body(text, offset, final)
        end = self._scanner.end(value)
        if end is None:
            return core.more(final)
        calls = core.calls_from(core.loads(value[:end]), None)
        consumed = core.past_closer(text, offset + end, self.closer, final)
        if consumed is None:
            return core.NEED_MORE  # the closing marker may still come
        # JSON after the opener that is not a call is broken markup, not text
        return core.Done(calls, consumed) if calls is not None else core.Drop(consumed)

    def _other_body(self, text: str, offset: int, final: bool) -> core.Outcome:
        """A body that does not start with JSON: by default, the opener was plain text."""
        return core.Reject(len(self.opener))


class HermesParser(_TaggedJsonParser):
    """Hermes, Qwen 2.5, Qwen 3, QwQ: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n
    </tool_call>``, one tag pair per call."""

    family = "hermes"
    opener = "<tool_call>"
    closer = "</tool_call>"


class Qwen3CoderParser(HermesParser):
    """Qwen3-Coder and Qwen 3.5: ``<tool_call><function=f><parameter=x>value</parameter>
    </function></tool_call>``; values are raw text, typed by the tool's JSON schema."""

    family = "qwen3-coder"
    _FUNCTION = re.compile(r"<function=([^>\s]+)>")
    _PARAMETER = re.compile(r"<parameter=([^>\s]+)>\n?(.*?)\n?</parameter>", re.DOTALL)

    @classmethod
    def matches(cls, template: str) -> bool:
        """Templates with ``<tool_call>`` that write ``<function=`` and ``<parameter=``."""
        return "<tool_call>" in template and "<function=" in template and "<parameter=" in template

    def _other_body(self, text: str, offset: int, final: bool) -> core.Outcome:
        body = text[offset:]
        if not body.startswith("<function="):
            if "<function=".startswith(body):
                return core.more(final)
            return core.Reject(len(self.opener))
        end = body.find("</function>")
        if end < 0:
            return core.more(final)
        consumed = core.past_closer(text, offset + end + len("</function>"), self.closer, final)
        if consumed is None:
            return core.NEED_MORE
        match = self._FUNCTION.match(body)
        if match is None:
            return core.Drop(consumed)
        name = match.group(1)
        schema = self._schema(name)
        arguments = {}
        for parameter in self._PARAMETER.finditer(body, match.end(), end):
            key, raw = parameter.group(1), parameter.group(2)
            arguments[key] = self._typed(raw, schema.get(key))
        return core.Done([core.ToolCall(name, arguments)], consumed)

    def _schema(self, name: str) -> dict[str, Any]:
        for tool, tool_name in zip(self.tools, core.tool_names(self.tools), strict=False):
            if tool_name == name:
                properties = core.tool_parameters(tool).get("properties")
                return properties if isinstance(properties, dict) else {}
        return {}

    @staticmethod
    def _typed(raw: str, schema: Any) -> Any:
        kind = schema.get("type") if isinstance(schema, dict) else None
        if kind == "string" or (isinstance(kind, list) and "string" in kind):
            return raw
        value = core.loads(raw)
        return raw if value is None and raw.strip() != "null" else value


class GraniteParser(_TaggedJsonParser):
    """Granite 3.x: ``<|tool_call|>[{"name": ..., "arguments": {...}}]``; Phi-4-mini writes
    the same marker around one object (``<|tool_call|>{...}<|/tool_call|>``)."""

    family = "granite"
    opener = "<|tool_call|>"
    closer = "<|/tool_call|>"
