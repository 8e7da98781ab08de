"""One message of a chat: who said it, the text (Markdown for answers), above an answer the
model's reasoning folded under "Thinking" (:class:`ThinkingBox`) when it showed any, and under
an answer its stats line (TTFT, prefill and decode speed, tokens reused from the cache).

While an answer streams it is shown by a light :class:`StreamingMarkdown` (fed through
:class:`ThrottledMarkdownStream`): pieces are gathered and shown at most
:attr:`MessageView.STREAM_REFRESHES_PER_SECOND` times a second; blocks that can no longer
change (text before a blank line outside a code fence) are rendered once, and only the last
block is rendered again. A token then costs a list append, not a render: the UI's CPU per
token stays flat however long the answer is, and the TUI does not slow the daemon it shares
the machine with. When the answer is complete, it is shown by Textual's full ``Markdown``
widget, as saved answers are. Reasoning streams the same throttled way into its box, open
while it comes; the box folds when the answer begins.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Sequence
from typing import Any, ClassVar, Protocol

from rich.console import RenderableType
from rich.markdown import Markdown as RichMarkdown
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Collapsible, Label, Markdown, Static

from ..dom import settle
from ..format import answer_stats

__all__ = [
    "MessageView",
    "StreamTarget",
    "StreamingMarkdown",
    "ThinkingBox",
    "ThrottledMarkdownStream",
    "settled_length",
]

_FENCE = re.compile(r"^ {0,3}(```|~~~)")
_TAIL_STEP = 4
"""Lines by which the streaming tail grows at once (see :class:`_Tail`)."""


def settled_length(text: str) -> int:
    """How much of ``text`` (which starts outside a code fence) can no longer change as more
    is appended: up to the last blank line outside a fenced code block, 0 when none."""
    settled = 0
    in_fence = False
    position = 0
    for line in text.splitlines(keepends=True):
        position += len(line)
        if not line.endswith("\n"):
            break  # the last line is still being written
        if _FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence and not line.strip():
            settled = position
    return settled


class _Tail(Widget):
    """The unsettled end of a streaming answer.

    Its height grows in steps of :data:`_TAIL_STEP` lines, so the transcript is laid out
    again once every few lines rather than at every refresh: with a long chat on screen a
    layout costs far more than repainting one block (every widget of the chat is arranged
    again), and repaints are bounded by the refresh rate.
    """

    DEFAULT_CSS = """
    _Tail {
        height: auto;
    }
    """

    def __init__(self) -> None:
        super().__init__(classes="tail")
        self._renderable: RenderableType = ""
        self._height = 0
        self.layouts = 0
        """Height changes so far (each one a layout of the transcript)."""

    def render(self) -> RenderableType:
        """The tail's Markdown."""
        return self._renderable

    def show(self, text: str) -> None:
        """Show ``text`` (Markdown)."""
        self._renderable = RichMarkdown(text) if text.strip() else ""
        width = self.content_region.width
        if width <= 0:  # not laid out yet: let Textual measure it
            self.refresh(layout=True)
            return
        console = self.app.console
        lines = len(console.render_lines(self._renderable, console.options.update_width(width)))
        height = -(-lines // _TAIL_STEP) * _TAIL_STEP if text.strip() else 0
        if height != self._height:
            self._height = height
            self.layouts += 1
            self.styles.height = height  # lays the transcript out again
        else:
            self.refresh()


class StreamingMarkdown(Vertical):
    """Markdown that grows at its end: settled blocks are rendered once (rich's Markdown in a
    :class:`~textual.widgets.Static` each), only the unsettled tail is rendered again."""

    DEFAULT_CSS = """
    StreamingMarkdown {
        height: auto;
        padding: 0 0 0 1;
    }
    StreamingMarkdown > Static {
        height: auto;
        margin: 0 0 1 0;
    }
    """

    def __init__(self) -> None:
        super().__init__(classes="streaming")
        self.text = ""
        """Everything shown so far."""
        self.renders = 0
        """Tail renders so far (each costs one block's worth of Markdown)."""
        self._settled = 0
        self._tail = _Tail()

    def compose(self) -> ComposeResult:
        """Build the widget tree."""
        yield self._tail

    async def show(self, text: str) -> None:
        """Show ``text``, which extends what was shown before."""
        self.text = text
        tail = text[self._settled :]
        settled = settled_length(tail)
        if settled:
            block = tail[:settled].strip("\n")
            self._settled += settled
            tail = tail[settled:]
            if block:
                await self.mount(Static(RichMarkdown(block)), before=self._tail)
        self.renders += 1
        self._tail.show(tail)


class StreamTarget(Protocol):
    """What a :class:`ThrottledMarkdownStream` writes to: an answer (:class:`MessageView`) or
    its reasoning (:class:`ThinkingBox`)."""

    async def show_streaming(self, text: str) -> None:
        """Show ``text``, everything written so far, while more may come."""

    async def finish_streaming(self, text: str) -> None:
        """Show ``text``, all there is."""


class ThrottledMarkdownStream:
    """Shows an answer as it streams, at most ``refreshes_per_second`` times a second, in the
    view's :class:`StreamingMarkdown`; :meth:`stop` hands the whole text to the view's full
    Markdown widget (the same ``write``/``stop`` interface as Textual's ``MarkdownStream``,
    which re-renders as often as the event loop lets it). Any :class:`StreamTarget` can be
    written to this way (an answer's reasoning too)."""

    def __init__(self, view: StreamTarget, refreshes_per_second: float = 5.0) -> None:
        self.view = view
        """The answer (or reasoning) written to."""
        self.interval = 1.0 / refreshes_per_second if refreshes_per_second > 0 else 0.0
        """Least time between two refreshes, in seconds."""
        self.appends = 0
        """Refreshes made so far."""
        self._pieces: list[str] = []
        self._shown = 0
        self._last = 0.0
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self._lock = asyncio.Lock()

    @property
    def text(self) -> str:
        """Everything written so far."""
        return "".join(self._pieces)

    async def write(self, fragment: str) -> None:
        """Queue ``fragment``; it shows at the next refresh (within :attr:`interval`)."""
        if self._stopped:
            raise RuntimeError("cannot write to a stopped stream")
        if not fragment:
            return
        self._pieces.append(fragment)
        if self._task is None:
            self._task = asyncio.create_task(self._refresh_soon())

    async def _refresh_soon(self) -> None:
        delay = self._last + self.interval - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        # Writes from now on schedule the next refresh (after this one: the lock).
        self._task = None
        await self._refresh()

    async def _refresh(self) -> None:
        async with self._lock:
            if len(self._pieces) == self._shown:
                return
            # Joined into one string so that the list stays one item: the next join costs
            # only the new pieces.
            text = "".join(self._pieces)
            self._pieces[:] = [text]
            self._shown = 1
            self._last = time.monotonic()
            self.appends += 1
            # Shielded: a stop() that cancels the caller must not leave a half-done refresh.
            await asyncio.shield(asyncio.ensure_future(self.view.show_streaming(text)))

    async def stop(self) -> None:
        """Show everything written, in the full Markdown widget; accept no more writes."""
        self._stopped = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        async with self._lock:
            await self.view.finish_streaming(self.text)


class ThinkingBox(Collapsible):
    """An answer's reasoning, plain text folded under a "Thinking" title (open while it
    streams, folded once the answer begins; Enter or a click on the title toggles it)."""

    DEFAULT_CSS = """
    ThinkingBox {
        background: transparent;
        border-top: none;
        padding: 0;
    }
    ThinkingBox > Contents {
        padding: 0 0 0 2;
    }
    ThinkingBox CollapsibleTitle {
        color: $text-muted;
    }
    ThinkingBox .thinking-text {
        color: $text-muted;
        text-style: italic;
    }
    """

    def __init__(self, text: str = "", *, collapsed: bool = True) -> None:
        self._body = Static(text, markup=False, classes="thinking-text")
        super().__init__(self._body, title="Thinking", collapsed=collapsed, classes="thinking")
        self.text = text
        """The reasoning shown."""

    async def show_streaming(self, text: str) -> None:
        """Show ``text``, the reasoning so far."""
        self.text = text
        self._body.update(text)

    async def finish_streaming(self, text: str) -> None:
        """Show ``text``, the whole reasoning."""
        await self.show_streaming(text)


class _ThinkingTarget:
    """The reasoning of a :class:`MessageView` as a :class:`StreamTarget`: its box appears
    with the first words (an answer without reasoning gets none)."""

    def __init__(self, view: MessageView) -> None:
        self.view = view

    async def show_streaming(self, text: str) -> None:
        """Show ``text`` in the box, mounting it first if needed."""
        await (await self.view.thinking_box()).show_streaming(text)

    async def finish_streaming(self, text: str) -> None:
        """Show the whole reasoning (nothing when there was none)."""
        if text or self.view.thinking_view is not None:
            await (await self.view.thinking_box()).finish_streaming(text)


class MessageView(Vertical):
    """A user message (plain text) or an answer (Markdown, streamed into while it comes)."""

    STREAM_REFRESHES_PER_SECOND: ClassVar[float] = 5.0
    """How often a streaming answer re-renders at most (``benchmarks/tui_stream.py`` varies
    it; 0 means on every piece, as Textual's own stream does)."""

    stats: reactive[dict[str, Any] | None] = reactive(None, init=False)
    """The answer's final timings; shown as one line under it."""
    branch: reactive[str] = reactive("", init=False)
    """Which of the branches that part here this message is (``2/3``), shown after the
    author; empty when it has no other."""

    def __init__(
        self,
        role: str,
        content: str = "",
        *,
        author: str,
        stats: dict[str, Any] | None = None,
        thinking: str = "",
        attachments: Sequence[str] = (),
        message_id: int | None = None,
        branch: str = "",
    ) -> None:
        super().__init__(classes=role)
        self.message_id = message_id
        """The saved message shown (None until it is saved)."""
        self.label_of: int | None = None
        """The message whose branch :attr:`branch` tells, when not this one's (an answer
        after tool calls, whose branch began with the call)."""
        self.set_reactive(MessageView.branch, branch)
        self._author = Label(self._heading(author, branch), classes="author")
        self.attachments = list(attachments)
        """File names of the images a question was sent with, shown above its text."""
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
        self._streaming: StreamingMarkdown | None = None
        # a saved answer's reasoning starts folded, unless it is all there is to see
        self.thinking_view: ThinkingBox | None = (
            ThinkingBox(thinking, collapsed=bool(content.strip())) if thinking else None
        )
        """The box of the answer's reasoning, if it has any."""

    def compose(self) -> ComposeResult:
        """Build the widget tree."""
        yield self._author
        if self._markdown is not None:
            if self.thinking_view is not None:
                yield self.thinking_view
            yield self._markdown
            yield self._stats
        else:
            if self.attachments:
                names = "\n".join(f"🖼 {name}" for name in self.attachments)
                yield Static(names, markup=False, classes="attachments")
            yield Static(self._content, markup=False, classes="body")

    def stream(self) -> ThrottledMarkdownStream:
        """A throttled stream into this answer (see the module docstring)."""
        return ThrottledMarkdownStream(self, self.STREAM_REFRESHES_PER_SECOND)

    def thinking_stream(self) -> ThrottledMarkdownStream:
        """A throttled stream into this answer's reasoning (its box appears with the first
        words)."""
        return ThrottledMarkdownStream(_ThinkingTarget(self), self.STREAM_REFRESHES_PER_SECOND)

    async def thinking_box(self) -> ThinkingBox:
        """The reasoning's box, mounted open above the answer if it was not there yet."""
        if self.thinking_view is None:
            self.thinking_view = ThinkingBox(collapsed=False)
            await self.mount(self.thinking_view, before=self.markdown)
        return self.thinking_view

    def fold_thinking(self) -> None:
        """Fold the reasoning (the answer has begun); nothing when there is none."""
        if self.thinking_view is not None:
            self.thinking_view.collapsed = True

    async def show_streaming(self, text: str) -> None:
        """Show ``text`` (the answer so far) in the light streaming view."""
        if self._streaming is None:
            self._streaming = StreamingMarkdown()
            await self.mount(self._streaming, before=self._stats)
            self.markdown.display = False
        await self._streaming.show(text)

    async def finish_streaming(self, text: str) -> None:
        """The answer is complete (or stopped): show ``text`` in the full Markdown widget."""
        await settle(self.markdown.update(text))
        self.markdown.display = True
        if self._streaming is not None:
            streaming, self._streaming = self._streaming, None
            await settle(streaming.remove())

    @property
    def markdown(self) -> Markdown:
        """The answer's Markdown view (answers only)."""
        assert self._markdown is not None, "a user message has no Markdown view"
        return self._markdown

    @property
    def text(self) -> str:
        """The message's text as shown now."""
        if self._streaming is not None:
            return self._streaming.text
        return self._markdown.source if self._markdown is not None else self._content

    @property
    def thinking(self) -> str:
        """The reasoning as shown now (empty when there is none)."""
        return self.thinking_view.text if self.thinking_view is not None else ""

    @property
    def stats_text(self) -> str:
        """The stats line as shown."""
        return answer_stats(self.stats)

    @staticmethod
    def _heading(author: str, branch: str) -> str:
        return f"{author}  ‹ {branch} ›" if branch else author

    def watch_branch(self, branch: str) -> None:
        """Show which branch this is after the author."""
        self._author.update(self._heading(self.author, branch))

    @property
    def heading(self) -> str:
        """The author line as shown (with the branch, when there are several)."""
        return self._heading(self.author, self.branch)

    def watch_stats(self, stats: dict[str, Any] | None) -> None:
        """Show the stats line once the answer is complete."""
        self._stats.update(answer_stats(stats))
        self.set_class(bool(stats and "error" in stats), "-error")
