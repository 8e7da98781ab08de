"""Mistral's families: ``[TOOL_CALLS]`` followed by a JSON list, or by ``name[ARGS]{...}``."""

from __future__ import annotations

import re

from . import core

__all__ = ["MistralParser"]


class MistralParser(core.ToolCallParser):
    """Mistral Nemo, Small 3.x, Devstral, Magistral, Ministral: ``[TOOL_CALLS][{"name": ...,
    "arguments": {...}, "id": "..."}]`` (older templates) or ``[TOOL_CALLS]f[ARGS]{...}``
    (newer ones, optionally ``[CALL_ID]id`` before ``[ARGS]``), one marker per call."""

    family = "mistral"
    openers = ("[TOOL_CALLS]",)
    _NAME = re.compile(r"[A-Za-z0-9_.\-]+")

    @classmethod
    def matches(cls, template: str) -> bool:
        """Templates that show ``[TOOL_CALLS]``."""
        return "[TOOL_CALLS]" in template

    def _parse(self, text: str, final: bool) -> core.Outcome:
        marker = self.openers[0]
        body = text[len(marker) :]
        value = body.lstrip()
        offset = len(text) - len(value)
        if not value:
            return core.more(final, bare=True)
        if value[0] in "[{":
            end = self._scanner.end(value)
            if end is None:
                return core.more(final)
            calls = core.calls_from(core.loads(value[:end]), None)
            return core.Done(calls, offset + end) if calls else core.Drop(offset + end)
        return self._named(text, value, offset, final)

    def _named(self, text: str, value: str, offset: int, final: bool) -> core.Outcome:
        match = self._NAME.match(value)
        if match is None:
            return core.Reject(offset)
        name, rest = match.group(0), value[match.end() :]
        call_id = None
        if rest.startswith("[CALL_ID]"):
            id_match = self._NAME.match(rest, len("[CALL_ID]"))
            if id_match is None:
                return core.more(final) if rest == "[CALL_ID]" else core.Reject(offset)
            if id_match.end() == len(rest):
                return core.more(final)
            call_id = id_match.group(0)
            rest = rest[id_match.end() :]
        if not rest.startswith("[ARGS]"):
            if "[ARGS]".startswith(rest) or "[CALL_ID]".startswith(rest):
                if not final:
                    return core.NEED_MORE
                if self._cut_end:
                    return core.Cut()  # the end cut the call off after its name
            return core.Reject(offset)
        args = rest[len("[ARGS]") :]
        args_offset = len(text) - len(args)
        if not args:
            return core.more(final)
        if args[0] != "{":
            return core.Drop(args_offset)
        end = self._scanner.end(args)
        if end is None:
            return core.more(final)
        arguments = core.loads(args[:end])
        if not isinstance(arguments, dict):
            return core.Drop(args_offset + end)
        return core.Done([core.ToolCall(name, arguments, call_id)], args_offset + end)
