"""One message of a chat: who said it, the text (Markdown for answers) and, under an answer,
its stats line (TTFT, prefill and decode speed, tokens reused from the cache).

An answer streams in through :class:`ThrottledMarkdownStream`: pieces are gathered and appended
to the Markdown at most :attr:`MessageView.STREAM_REFRESHES_PER_SECOND` times a second, and
Textual's ``Markdown.append`` re-parses only the last block. A token then costs a list append,
not a render: the UI's CPU per token stays flat however fast, long or deep in a long chat the
answer is, and the TUI does not slow the daemon it shares the machine with.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, ClassVar

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widgets import Label, Markdown, Static

from ..format import answer_stats

__all__ = ["MessageView", "ThrottledMarkdownStream"]


class ThrottledMarkdownStream:
    """Appends streamed text to a :class:`~textual.widgets.Markdown` widget, at most
    ``refreshes_per_second`` times a second (the same ``write``/``stop`` interface as
    Textual's ``MarkdownStream``, which appends as often as the event loop lets it)."""

    def __init__(self, markdown: Markdown, refreshes_per_second: float = 10.0) -> None:
        self.markdown = markdown
        """The widget written to."""
        self.interval = 1.0 / refreshes_per_second if refreshes_per_second > 0 else 0.0
        """Least time between two appends, in seconds."""
        self.appends = 0
        """Appends made so far (each one a re-render of the last block)."""
        self._pending: list[str] = []
        self._last = 0.0
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    async def write(self, fragment: str) -> None:
        """Queue ``fragment``; it shows at the next append (within :attr:`interval`)."""
        if self._stopped:
            raise RuntimeError("cannot write to a stopped stream")
        if not fragment:
            return
        self._pending.append(fragment)
        if self._task is None:
            self._task = asyncio.create_task(self._append_soon())

    async def _append_soon(self) -> None:
        delay = self._last + self.interval - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        # Writes from now on schedule the next append (after this one: the widget's lock).
        self._task = None
        await self._append()

    async def _append(self) -> None:
        if not self._pending:
            return
        text = "".join(self._pending)
        self._pending.clear()
        self._last = time.monotonic()
        self.appends += 1
        # Shielded: a stop() that cancels the caller must not leave a half-appended block.
        await asyncio.shield(asyncio.ensure_future(self.markdown.append(text)))

    async def stop(self) -> None:
        """Append what is still queued now, and accept no more writes."""
        self._stopped = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._append()


class MessageView(Vertical):
    """A user message (plain text) or an answer (Markdown, streamed into while it comes)."""

    STREAM_REFRESHES_PER_SECOND: ClassVar[float] = 10.0
    """How often a streaming answer re-renders at most (``benchmarks/tui_stream.py`` varies
    it; 0 means on every piece, as Textual's own stream does)."""

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

    def stream(self) -> ThrottledMarkdownStream:
        """A stream that appends to the answer's Markdown, throttled."""
        return ThrottledMarkdownStream(self.markdown, self.STREAM_REFRESHES_PER_SECOND)

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
