"""Find and export on the chat screen: :class:`SearchDialog` (Ctrl+F or ``/search TEXT``)
searches every chat's messages, every branch, and dismisses with the hit picked;
:class:`ExportDialog` (F10, or ``/export md|json [PATH]`` without it) asks where to write the
branch on screen, as Markdown or as JSON in OpenAI's messages shape."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Input, Label, OptionList, Select
from textual.widgets.option_list import Option

from localllm.chats import EXPORT_FORMATS, export_chat

from .dialogs import _Dialog

if TYPE_CHECKING:
    from ..chats import Chat, ChatStore, SearchHit

__all__ = ["ExportDialog", "SearchDialog", "default_export_path", "write_export"]

_FORMAT_NAMES = {"md": "Markdown", "json": "JSON (OpenAI messages)"}


def default_export_path(chat: Chat, form: str, folder: Path | None = None) -> Path:
    """``chat-ID-title.md`` (or ``.json``) in ``folder`` (the working directory)."""
    slug = re.sub(r"[^a-z0-9]+", "-", chat.title.lower()).strip("-")[:40] or "chat"
    return (folder or Path.cwd()) / f"chat-{chat.id}-{slug}.{form}"


async def write_export(chat: Chat, form: str, path: Path) -> Path:
    """Write ``chat``'s branch on screen to ``path`` as ``form``; the path written (``~``
    expanded). OSError when it cannot be written."""
    path = path.expanduser()
    text = export_chat(chat, form)
    await asyncio.to_thread(path.write_text, text, encoding="utf-8")
    return path


class SearchDialog(_Dialog):
    """Search every chat; dismisses with the :class:`~localllm.chats.SearchHit` picked."""

    DEFAULT_CSS = """
    SearchDialog {
        align: center middle;
    }
    SearchDialog #search-box {
        width: 90;
        max-width: 100%;
        height: 20;
        max-height: 100%;
        border: thick $primary;
        background: $surface;
        padding: 0 1;
    }
    SearchDialog #search-text {
        background: $boost;
        margin-bottom: 1;
    }
    SearchDialog #hits {
        height: 1fr;
    }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Close", id="search.close"),
        Binding("down", "hits", "Hits", show=False, id="search.hits"),
    ]

    def __init__(self, store: ChatStore, text: str = "") -> None:
        super().__init__()
        self.store = store
        """Where the chats are."""
        self.text = text
        """What to search for first."""
        self.hits: list[SearchHit] = []
        """The messages found, newest first."""
        self._searches = 0

    def compose(self) -> ComposeResult:
        """Build the widget tree."""
        with Vertical(id="search-box"):
            yield Label(
                "Search every chat (Enter opens the message, Esc closes)", classes="question"
            )
            yield Input(self.text, placeholder="Text to find", id="search-text", compact=True)
            yield OptionList(id="hits")

    async def on_mount(self) -> None:
        """Search for the text given, if any."""
        self.query_one("#search-text", Input).focus()
        if self.text.strip():
            await self.search(self.text)

    @on(Input.Changed, "#search-text")
    async def _typed(self, event: Input.Changed) -> None:
        await self.search(event.value)

    async def search(self, text: str) -> None:
        """Show the messages that contain ``text``."""
        self._searches += 1
        number = self._searches
        hits = await asyncio.to_thread(self.store.search, text)
        if number != self._searches:
            return  # a newer search was asked for while this one ran
        self.hits = hits
        listing = self.query_one("#hits", OptionList)
        listing.set_options(
            Option(f"{hit.title[:24]} · {hit.role} · {hit.snippet}", id=str(i))
            for i, hit in enumerate(hits)
        )
        if hits:
            listing.highlighted = 0
        elif text.strip():
            listing.add_option(Option(f"Nothing found for “{text.strip()}”", disabled=True))

    def action_hits(self) -> None:
        """Move from the text box to the hits."""
        self.query_one("#hits", OptionList).focus()

    @on(Input.Submitted, "#search-text")
    def _open_first(self) -> None:
        if self.hits:
            self.dismiss(self.hits[0])

    @on(OptionList.OptionSelected, "#hits")
    def _picked(self, event: OptionList.OptionSelected) -> None:
        if event.option.id is not None:
            self.dismiss(self.hits[int(event.option.id)])


class ExportDialog(_Dialog):
    """Where and how to export a chat; dismisses with ``(format, path)``."""

    DEFAULT_CSS = """
    ExportDialog {
        align: center middle;
    }
    """

    def __init__(self, chat: Chat) -> None:
        super().__init__()
        self.chat = chat
        """The chat exported (its branch on screen)."""

    def compose(self) -> ComposeResult:
        """Build the widget tree."""
        with Vertical(classes="dialog wide"):
            yield Label(
                f"Export “{self.chat.title}” (the branch on screen, "
                f"{len(self.chat.messages)} messages)",
                classes="question",
            )
            yield Select(
                [(_FORMAT_NAMES[f], f) for f in EXPORT_FORMATS],
                value="md",
                allow_blank=False,
                id="format",
                compact=True,
            )
            yield Input(str(default_export_path(self.chat, "md")), id="path", compact=True)
            with Horizontal(classes="buttons"):
                yield Button("Export", variant="primary", id="export", compact=True)
                yield Button("Cancel", classes="cancel", compact=True)

    @on(Select.Changed, "#format")
    def _format_changed(self, event: Select.Changed) -> None:
        path = self.query_one("#path", Input)
        form = str(event.value)
        path.value = str(Path(path.value).with_suffix(f".{form}"))

    @on(Input.Submitted, "#path")
    @on(Button.Pressed, "#export")
    def _export(self) -> None:
        path = self.query_one("#path", Input).value.strip()
        if path:
            self.dismiss((str(self.query_one("#format", Select).value), Path(path)))
