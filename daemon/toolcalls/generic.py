"""Templates that take tools but show no call syntax (JSON at a line start or in a fenced
block), and Gemma's ```tool_code blocks."""

from __future__ import annotations

from . import core

__all__ = ["GemmaParser", "GenericJsonParser"]


class GenericJsonParser(core.ToolCallParser):
    """Templates that take tools but show no call syntax: a JSON call object (or list of
    them) at the start of a line, or inside a fenced block (```json, ```tool_code,
    ```tool_call); ```tool_code blocks may also hold Python-style calls (``f(x=1)``). A call
    must name a declared tool."""

    family = "json"
    _FENCE_LABELS = ("json", "tool_code", "tool_call")
    _KEY_STARTS = ('"name"', '"type"', '"function"')

    @classmethod
    def matches(cls, template: str) -> bool:
        """The fallback for any template that renders ``tools``."""
        return True

    def _find_start(self, text: str, at_start: bool) -> tuple[int | None, int]:
        line_start = at_start
        for i, c in enumerate(text):
            if line_start and c in "{[`":
                if c == "`":
                    tail = text[i:]
                    if tail.startswith("```") or "```".startswith(tail):
                        return i, i
                else:
                    return i, i
            if c == "\n":
                line_start = True
            elif not c.isspace():
                line_start = False
        return None, len(text)

    def _parse(self, text: str, final: bool) -> core.Outcome:
        if text.startswith("`"):
            return self._fenced(text, final)
        rest = text[1:].lstrip()
        if text[0] == "[":
            if rest and rest[0] != "{":
                return core.Reject(1)
            rest = rest[1:].lstrip()
        if rest and not any(k.startswith(rest[: len(k)]) for k in self._KEY_STARTS):
            return core.Reject(1)
        end = self._scanner.end(text)
        if end is None:
            return core.more(final, bare=not rest)
        calls = core.calls_from(core.loads(text[:end]), self.known)
        return core.Done(calls, end) if calls else core.Reject(end)

    def _fenced(self, text: str, final: bool) -> core.Outcome:
        if len(text) < 3:
            return (
                core.NEED_MORE if not final and "```".startswith(text) else core.Reject(len(text))
            )
        if not text.startswith("```"):
            return core.Reject(1)
        newline = text.find("\n")
        if newline < 0:
            label = text[3:].strip()
            if final or not any(f.startswith(label) for f in self._FENCE_LABELS):
                return core.Reject(len(text))
            return core.NEED_MORE
        label = text[3:newline].strip()
        if label not in self._FENCE_LABELS:  # other code blocks stream as they come
            return core.Reject(newline + 1)
        close = text.find("```", newline + 1)
        if close < 0:
            return core.NEED_MORE if not final else core.Reject(len(text))
        inner = text[newline + 1 : close]
        calls = core.calls_from(core.loads(inner), self.known) if inner.strip() else None
        if calls is None and label == "tool_code":
            calls = core.python_calls(inner, self.known)
        return core.Done(calls, close + 3) if calls else core.Reject(close + 3)


class GemmaParser(GenericJsonParser):
    """Gemma-style prompting: calls in a ```tool_code block (Python-style or JSON), or a
    plain JSON object naming a declared tool."""

    family = "gemma"

    @classmethod
    def matches(cls, template: str) -> bool:
        """Templates that mention ``tool_code``."""
        return "tool_code" in template
