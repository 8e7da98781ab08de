"""The message box of the chat screen: Enter sends, Ctrl+J (or Shift+Enter) starts a new line."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from textual import events
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import TextArea

__all__ = ["PromptArea"]

# Most terminals cannot tell Shift+Enter from Enter; Ctrl+J (a plain line feed) and Alt+Enter
# reach every terminal, so they insert a newline too.
_NEWLINE_KEYS = ("shift+enter", "ctrl+j", "alt+enter")


class PromptArea(TextArea):
    """A multi-line input whose Enter key sends the text instead of breaking the line."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "submit", "Send", id="prompt.send"),
        # Not in the footer (short of room at 80 columns): the box's placeholder tells it.
        Binding(
            ",".join(_NEWLINE_KEYS),
            "newline",
            "Newline",
            key_display="^J",
            show=False,
            id="prompt.newline",
        ),
    ]

    @dataclass
    class Submitted(Message):
        """The user pressed Enter; ``text`` is what the box held (it is not cleared here)."""

        prompt: PromptArea
        """The box that sent it."""
        text: str
        """Its text."""

        @property
        def control(self) -> PromptArea:
            """The box, for ``@on(PromptArea.Submitted, "#id")`` selectors."""
            return self.prompt

    def __init__(self, *, id: str | None = None, placeholder: str = "") -> None:
        super().__init__(
            id=id, placeholder=placeholder, soft_wrap=True, tab_behavior="focus", compact=True
        )

    async def _on_key(self, event: events.Key) -> None:
        # TextArea would insert a line break for Enter; leave these keys to the bindings above.
        if event.key == "enter" or event.key in _NEWLINE_KEYS:
            event.prevent_default()

    def action_submit(self) -> None:
        """Send the text to whoever listens (the chat screen)."""
        self.post_message(self.Submitted(self, self.text))

    def action_newline(self) -> None:
        """Insert a line break at the cursor."""
        self.insert("\n")
