"""One message of a chat: who said it, the text (Markdown for answers) and, under an answer,
its stats line (TTFT, prefill and decode speed, tokens reused from the cache)."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widgets import Label, Markdown, Static

from ..format import answer_stats

__all__ = ["MessageView"]


class MessageView(Vertical):
    """A user message (plain text) or an answer (Markdown, streamed into while it comes)."""

    stats: reactive[dict[str, Any] | None] = reactive(None, init=False)
    """The answer's final timings; shown as one line under it."""

    def __init__(
        self, role: str, content: str = "", *, author: str, stats: dict[str, Any] | None = None
    ) -> None:
        super().__init__(classes=role)
        self.role = role
        """``user`` or ``assistant``."""
        self.author = author
        """The heading: ``You`` or the model's name."""
        self._content = content
        self.streamed_chunks = 0
        """How many pieces of the answer arrived separately while it streamed."""
        self.set_reactive(MessageView.stats, stats)
        self._stats = Label(answer_stats(stats), classes="stats")
        self._markdown = Markdown(content, classes="body") if role == "assistant" else None

    def compose(self) -> ComposeResult:
        """Build the widget tree."""
        yield Label(self.author, classes="author")
        if self._markdown is not None:
            yield self._markdown
            yield self._stats
        else:
            yield Static(self._content, markup=False, classes="body")

    @property
    def markdown(self) -> Markdown:
        """The answer's Markdown view (answers only)."""
        assert self._markdown is not None, "a user message has no Markdown view"
        return self._markdown

    @property
    def text(self) -> str:
        """The message's text as shown now."""
        return self._markdown.source if self._markdown is not None else self._content

    @property
    def stats_text(self) -> str:
        """The stats line as shown."""
        return answer_stats(self.stats)

    def watch_stats(self, stats: dict[str, Any] | None) -> None:
        """Show the stats line once the answer is complete."""
        self._stats.update(answer_stats(stats))
        self.set_class(bool(stats and "error" in stats), "-error")
