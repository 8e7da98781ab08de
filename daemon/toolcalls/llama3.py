"""Llama 3.1-3.3: bare JSON calls, and built-in tools after ``<|python_tag|>``."""

from __future__ import annotations

from . import core

__all__ = ["Llama3Parser"]


class Llama3Parser(core.ToolCallParser):
    """Llama 3.1-3.3: a bare ``{"name": "f", "parameters": {...}}`` object at the start of the
    output (or of a line, or after ``<|python_tag|>``), several separated by ``;``; built-in
    tools as ``<|python_tag|>brave_search.call(query="...")``. Untagged JSON counts as a call
    only if it names a declared tool."""

    family = "llama3"
    _TAG = "<|python_tag|>"
    _KEY_STARTS = ('"name"', '"type"', '"function"')

    @classmethod
    def matches(cls, template: str) -> bool:
        """Templates with the ``ipython`` role or ``<|python_tag|>``."""
        return "<|python_tag|>" in template or (
            "<|start_header_id|>" in template and "ipython" in template
        )

    def _find_start(self, text: str, at_start: bool) -> tuple[int | None, int]:
        tag = text.find(self._TAG)
        limit = tag if tag >= 0 else len(text)
        # a `{` opens a candidate only where a call may stand: output or line start
        line_start = at_start
        for i in range(limit):
            c = text[i]
            if line_start and c == "{":
                return i, i
            if c == "\n" or (c == ";" and self._made_calls and not text[:i].strip()):
                line_start = True
            elif not c.isspace():
                line_start = False
        if tag >= 0:
            return tag, tag
        return None, len(text) - core.held_prefix(text, (self._TAG,))

    def _parse(self, text: str, final: bool) -> core.Outcome:
        if text.startswith(self._TAG):
            return self._tagged(text, final)
        if not text.startswith("{"):
            return core.Reject(1)
        if not self._may_be_call(text):
            return core.Reject(1)
        end = self._scanner.end(text)
        if end is None:
            # a call-shaped object cut off; a bare `{` alone may be prose
            return core.more(final, bare=not text[1:].strip())
        calls = core.calls_from(core.loads(text[:end]), self.known)
        if calls is None:
            return core.Reject(end)
        if not final and not text[end:].strip():
            return core.NEED_MORE  # a `;` and another call may follow
        return core.Done(calls, self._separator(text, end))

    def _may_be_call(self, text: str) -> bool:
        """Cheap early refusal of prose in braces: the first key must be one a call has."""
        rest = text[1:].lstrip()
        if not rest:
            return True
        return any(k.startswith(rest[: len(k)]) for k in self._KEY_STARTS)

    @staticmethod
    def _separator(text: str, end: int) -> int:
        rest = text[end:]
        after = rest.lstrip()
        if after.startswith(";"):
            return end + len(rest) - len(after) + 1
        return end

    def _tagged(self, text: str, final: bool) -> core.Outcome:
        body = text[len(self._TAG) :]
        value = body.lstrip()
        offset = len(text) - len(value)
        if not value:
            return core.more(final, bare=True)
        if value[0] == "{":
            end = self._scanner.end(value)
            if end is None:
                return core.more(final)
            calls = core.calls_from(core.loads(value[:end]), None)
            if calls is None:
                return core.Drop(offset + end)
            if not final and not value[end:].strip():
                return core.NEED_MORE
            return core.Done(calls, self._separator(text, offset + end))
        # built-in tool in Python syntax; it runs to the end of the message (<|eom_id|>)
        if not final:
            return core.NEED_MORE
        calls = core.python_calls(value, None)
        if calls:
            return core.Done(calls, len(text))
        return core.Cut() if self._cut_end else core.Drop(len(text))
