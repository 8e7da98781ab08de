"""One response's output read whole: reasoning split first, then tool calls parsed."""

from __future__ import annotations

from .core import Parsed, ToolCallParser
from .harmony import HarmonyParser
from .thinking import ThinkingSplitter

__all__ = ["OutputParser"]


class OutputParser:
    """Thinking split and tool-call parsing together, as one response needs them.

    Reasoning comes first in the output, so the splitter sees the text first and its
    ``content`` goes on to the tool-call parser; harmony's parser does both itself.
    """

    def __init__(
        self,
        tools: ToolCallParser | None = None,
        thinking: ThinkingSplitter | None = None,
    ) -> None:
        self.tools = tools
        self.thinking = thinking if not isinstance(tools, HarmonyParser) else None

    def feed(self, text: str) -> Parsed:
        """Take the next piece of output."""
        return self._through(self.thinking.feed(text) if self.thinking else Parsed(text))

    def finish(self, cut: bool = False) -> Parsed:
        """The output ended (``cut``: by the token limit)."""
        out = self._through(self.thinking.finish() if self.thinking else Parsed())
        if self.tools is not None:
            out.add(self.tools.finish(cut))
        return out

    def _through(self, parsed: Parsed) -> Parsed:
        if self.tools is None or not parsed.content:
            return parsed
        out = self.tools.feed(parsed.content)
        out.thinking = parsed.thinking + out.thinking
        return out
