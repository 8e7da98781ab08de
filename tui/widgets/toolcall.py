"""A tool call in the chat: :class:`ToolCallBlock` shows the server and tool, the arguments,
then the result (folded when long) and how the call ended with its time; while the call
waits for the person, :class:`ApprovalPrompt` asks under it (Yes / No / Always for this tool
/ Stop, or the keys y, n, a, s)."""

from __future__ import annotations

import asyncio
import json
from typing import Any, ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Collapsible, Label, Static

__all__ = ["ApprovalPrompt", "ToolCallBlock", "call_summary"]

_FOLD_LINES = 6
_FOLD_CHARS = 500
_MARKS = {
    "done": "✓",
    "error": "✗",
    "timeout": "✗",
    "declined": "–",
    "skipped": "–",
    "stopped": "–",
    "running": "…",
    "asking": "?",
    "pending": "…",
}


def call_summary(status: str, seconds: float, notes: list[str] | None = None) -> str:
    """``✓ done in 15 ms``, ``✗ timeout after 2.0 s``, ``– declined``, plus the notes."""
    mark = _MARKS.get(status, "?")
    took = f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"
    if status == "done":
        text = f"{mark} done in {took}"
    elif status in ("error", "timeout"):
        text = f"{mark} {status} after {took}"
    else:
        text = f"{mark} {status}"
    return " · ".join([text, *(notes or [])])


class ToolCallBlock(Vertical):
    """One call: the heading, the arguments, then the result and its status line."""

    DEFAULT_CSS = """
    ToolCallBlock {
        height: auto;
        margin: 1 0 0 2;
        padding: 0 1;
        border-left: outer $secondary;
    }
    ToolCallBlock .tool-title {
        text-style: bold;
        color: $secondary;
    }
    ToolCallBlock .tool-args {
        color: $text-muted;
    }
    ToolCallBlock .tool-status {
        color: $text-muted;
    }
    ToolCallBlock.-error .tool-status {
        color: $error;
    }
    ToolCallBlock Collapsible {
        background: transparent;
        border-top: none;
        padding: 0;
    }
    ToolCallBlock Collapsible > Contents {
        padding: 0 0 0 1;
    }
    """

    def __init__(
        self,
        title: str,
        arguments: Any,
        *,
        call_id: str = "",
        result: tuple[str, str, float, list[str]] | None = None,
    ) -> None:
        """``result`` (text, status, seconds, notes) shows a finished call (a saved chat)."""
        super().__init__(classes="tool-call")
        self.title = title
        """``server · tool``."""
        self.arguments = arguments
        """The arguments the model gave."""
        self.call_id = call_id
        """The call's id."""
        self.result_text = ""
        """The result as shown (what the model got)."""
        self.status = "pending"
        """How the call ended (or ``pending``, ``asking``, ``running``)."""
        self._status = Label("", classes="tool-status")
        self._result: Vertical | None = None
        if result is not None:
            text, status, seconds, notes = result
            self.result_text = text
            self._result = self._result_view(text)
            self.set_status(status, call_summary(status, seconds, notes))

    def compose(self) -> ComposeResult:
        """Build the widget tree."""
        yield Label(f"⚙ {self.title}", classes="tool-title", markup=False)
        text = json.dumps(self.arguments, ensure_ascii=False, indent=None)
        yield Static(text, classes="tool-args", markup=False)
        if self._result is not None:
            yield self._result
        yield self._status

    @staticmethod
    def _result_view(text: str) -> Vertical:
        body = Static(text, classes="tool-result", markup=False)
        if text.count("\n") >= _FOLD_LINES or len(text) > _FOLD_CHARS:
            lines = text.count("\n") + 1
            title = f"Result ({lines} lines, {len(text):,} characters)"
            return Collapsible(body, title=title, collapsed=True)
        box = Vertical(body, classes="tool-result-box")
        box.styles.height = "auto"
        return box

    def set_status(self, status: str, text: str | None = None) -> None:
        """Show ``status`` (``running``, ``asking``...) on the status line."""
        self.status = status
        self._status.update(text if text is not None else _MARKS.get(status, "") + f" {status}")
        self.set_class(status in ("error", "timeout"), "-error")

    async def show_result(
        self, text: str, status: str, seconds: float, notes: list[str] | None = None
    ) -> None:
        """Show the result (folded when long) and how the call ended."""
        self.result_text = text
        if self._result is not None:
            await self._result.remove()
        self._result = self._result_view(text)
        await self.mount(self._result, before=self._status)
        self.set_status(status, call_summary(status, seconds, notes))

    @property
    def folded(self) -> bool:
        """True when the result is folded away (a long one)."""
        return isinstance(self._result, Collapsible) and self._result.collapsed


class ApprovalPrompt(Vertical):
    """ "Run it?" under a call (or a sampling request), answered by a button or a key; the
    answer resolves :attr:`answer`."""

    DEFAULT_CSS = """
    ApprovalPrompt {
        height: auto;
        margin: 0 0 0 2;
        padding: 0 1;
        background: $boost;
    }
    ApprovalPrompt Horizontal {
        height: auto;
    }
    ApprovalPrompt Button {
        margin: 0 1 0 0;
        min-width: 8;
    }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer('yes')", "Yes", id="approval.yes"),
        Binding("n", "answer('no')", "No", id="approval.no"),
        Binding("a", "answer('always')", "Always", id="approval.always"),
        Binding("s", "answer('stop')", "Stop", id="approval.stop"),
    ]
    can_focus = True

    def __init__(self, question: str, *, always: str = "Always") -> None:
        super().__init__(classes="approval")
        self.question = question
        """What is asked."""
        self.answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        """Resolved with ``yes``, ``no``, ``always`` or ``stop``."""
        self._always = always

    def compose(self) -> ComposeResult:
        """Build the widget tree."""
        yield Label(self.question, markup=False)
        with Horizontal():
            yield Button("Yes (y)", id="approve-yes", variant="success", compact=True)
            yield Button("No (n)", id="approve-no", variant="error", compact=True)
            yield Button(f"{self._always} (a)", id="approve-always", compact=True)
            yield Button("Stop (s)", id="approve-stop", compact=True)

    def on_mount(self) -> None:
        """Take the focus so that a key answers at once."""
        self.focus()

    def action_answer(self, value: str) -> None:
        """Answer ``value``."""
        if not self.answer.done():
            self.answer.set_result(value)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.action_answer((event.button.id or "approve-no").removeprefix("approve-"))
