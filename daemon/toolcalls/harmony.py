"""GPT-OSS's harmony format, whose channels carry reasoning, the answer and calls."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from . import core

__all__ = ["HarmonyParser"]


class HarmonyParser(core.ToolCallParser):
    """GPT-OSS (the harmony format): messages ``<|channel|>analysis<|message|>...<|end|>``
    (reasoning), ``<|channel|>final<|message|>...`` (the answer) and
    ``<|channel|>commentary to=functions.f <|constrain|>json<|message|>{...}<|call|>``
    (a call). The recipient may also follow the role: ``<|start|>assistant to=functions.f``."""

    family = "harmony"
    _ENDS = ("<|end|>", "<|call|>", "<|return|>", "<|start|>")
    _HEADER_OPENERS = ("<|channel|>", "<|start|>")
    _RECIPIENT = re.compile(r"to=([^\s<]+)")
    _CHANNEL = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")

    @classmethod
    def matches(cls, template: str) -> bool:
        """Templates with ``<|channel|>``."""
        return "<|channel|>" in template

    def __init__(self, tools: Sequence[dict[str, Any]] | None = None) -> None:
        super().__init__(tools)
        self._state = "header"
        self._channel = "final"
        self._recipient: str | None = None
        self._body = ""

    def _parse(self, text: str, final: bool) -> core.Outcome:  # pragma: no cover - not used
        raise NotImplementedError

    def feed(self, text: str) -> core.Parsed:
        """Take the next piece of output; return what is now certain."""
        self._buffer += text
        return self._step(final=False)

    def finish(self, cut: bool = False) -> core.Parsed:
        """The output ended (``<|call|>`` and ``<|return|>`` usually stop generation;
        ``cut``: the token limit ended it, so an open call was cut off)."""
        self._cut_end = cut
        out = self._step(final=True)
        if self._state == "header" and self._buffer:
            head = self._buffer.lstrip()
            if cut and any(head.startswith(m) or m.startswith(head) for m in self._HEADER_OPENERS):
                out.dropped += self._buffer  # a header cut off: markup, not text
                out.cut = True
            else:
                out.content += self._buffer  # not harmony after all
        elif self._state == "body":
            self._end_message(out, self._buffer, cut=cut)
        self._buffer = ""
        self._state = "header"
        return out

    def _step(self, final: bool) -> core.Parsed:
        out = core.Parsed()
        while self._buffer:
            if self._state == "header":
                text = self._buffer
                stripped = text.lstrip()
                if not stripped:
                    return out
                if not any(
                    stripped.startswith(m) or m.startswith(stripped) for m in self._HEADER_OPENERS
                ):
                    # plain text where a header was expected: the model skipped the format
                    self._channel, self._recipient, self._state = "final", None, "body"
                    continue
                at = text.find("<|message|>")
                if at < 0:
                    if len(text) > 4096:  # not a header a model writes
                        self._channel, self._recipient, self._state = "final", None, "body"
                        continue
                    return out
                header = text[:at]
                channel = self._CHANNEL.search(header)
                recipient = self._RECIPIENT.search(header)
                self._channel = channel.group(1) if channel else "final"
                self._recipient = recipient.group(1) if recipient else None
                self._buffer = text[at + len("<|message|>") :]
                self._body = ""
                self._state = "body"
            else:
                text = self._buffer
                ends = [(i, m) for m in self._ENDS if (i := text.find(m)) >= 0]
                if ends:
                    index, marker = min(ends)
                    self._end_message(out, text[:index])
                    # <|start|> begins the next message's header; the others close this one
                    rest = text[index:] if marker == "<|start|>" else text[index + len(marker) :]
                    self._buffer = rest
                    self._state = "header"
                    continue
                safe = len(text) if final else len(text) - core.held_prefix(text, self._ENDS)
                self._body_text(out, text[:safe])
                self._buffer = text[safe:]
                return out
        return out

    def _is_call(self) -> bool:
        return bool(self._recipient and self._recipient.startswith("functions."))

    def _body_text(self, out: core.Parsed, text: str) -> None:
        if self._is_call():
            self._body += text
        elif self._channel == "analysis":
            out.thinking += text
        else:
            out.content += text

    def _end_message(self, out: core.Parsed, text: str, cut: bool = False) -> None:
        self._body_text(out, text)
        if self._is_call():
            assert self._recipient is not None
            name = self._recipient.removeprefix("functions.")
            arguments = core.loads(self._body.strip() or "{}")
            if isinstance(arguments, dict):
                out.calls.append(core.ToolCall(name, arguments))
            else:  # not valid JSON (or cut off): call markup, never content
                out.dropped += self._body
                out.cut = out.cut or cut
        self._body = ""
        self._recipient = None
        self._channel = "final"
