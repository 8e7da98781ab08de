"""The help screen: every key binding, by screen, read from the bindings themselves."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import ClassVar

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Static

__all__ = ["HelpScreen", "bindings_table"]

_ABOUT = (
    "localllm talks to the local daemon (started if none runs). Chat streams answers with "
    "their timings (TTFT, prefill and decode speed, cached tokens) and keeps every branch; "
    "/image PATH, /search TEXT, /export md|json, /compare; MCP's /tools, /prompts, "
    "/resource URI. Models manages the store; Dashboard shows each loaded model live. "
    "Ctrl+P: command palette."
)


def bindings_table(
    sections: Iterable[tuple[str, Iterable[BindingType]]], key_display: Callable[[Binding], str]
) -> Table:
    """One table of ``key  action`` rows under a heading per section."""
    table = Table(box=None, show_header=False, padding=(0, 2, 0, 0), expand=False)
    table.add_column("key", style="bold", no_wrap=True)
    table.add_column("action")
    for title, entries in sections:
        table.add_row(Text(title, style="bold underline"), "")
        for binding in entries:
            if isinstance(binding, Binding) and binding.description:
                table.add_row(key_display(binding), binding.description)
        table.add_row("", "")
    return table


class HelpScreen(ModalScreen[None]):
    """Key bindings and a word about each screen; Esc, F1 or q closes it."""

    CSS_PATH = "help.tcss"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,f1,q", "close", "Close help", id="help.close")
    ]

    def __init__(self, sections: list[tuple[str, list[BindingType]]]) -> None:
        super().__init__()
        self.sections = sections
        """``(title, bindings)`` to list."""

    def compose(self) -> ComposeResult:
        """Build the widget tree."""
        with Vertical(id="help"):
            yield Label("localllm keys (Esc closes)", id="help-title")
            with VerticalScroll():
                yield Static(
                    Group(
                        Text(_ABOUT, style="dim"),
                        Text(""),
                        bindings_table(self.sections, self.app.get_key_display),
                    ),
                    id="help-body",
                )

    def action_close(self) -> None:
        """Close the help."""
        self.dismiss(None)
