"""The top line of every screen: where you are, and whether the daemon answers."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Label

__all__ = ["MORE_SCREENS", "SCREENS", "StatusBar", "connection_text"]

SCREENS = (("chat", "Chat", "F2"), ("models", "Models", "F3"), ("dashboard", "Dashboard", "F4"))
"""(mode, title, key) of the three main screens, in order."""
MORE_SCREENS = {"bench": ("Bench", "F9")}
"""(title, key) by mode of the screens whose tab shows only while they are open (the other
screens' bars stay as they were)."""

_STATE_TEXT = {
    "connecting": ("◌", "connecting…", "yellow"),
    "starting": ("◌", "starting the daemon…", "yellow"),
    "connected": ("●", "daemon {version}", "green"),
    "lost": ("✖", "daemon went away, reconnecting…", "red"),
    "offline": ("✖", "daemon not running, retrying…", "red"),
}


def connection_text(state: str, version: str | None) -> Text:
    """``● daemon 0.1.0`` or what is wrong, colored."""
    glyph, words, style = _STATE_TEXT.get(state, ("?", state, ""))
    return Text.assemble((glyph + " ", style), words.format(version=version or ""))


class StatusBar(Horizontal):
    """Screen tabs on the left, the connection state on the right."""

    def __init__(self, current: str) -> None:
        super().__init__()
        self.current = current
        """The mode of the screen this bar sits on."""

    def compose(self) -> ComposeResult:
        """Build the widget tree."""
        tabs = Text.assemble(("localllm ", "bold"))
        tabs_shown = list(SCREENS)
        if self.current in MORE_SCREENS:
            tabs_shown.append((self.current, *MORE_SCREENS[self.current]))
        for mode, title, key in tabs_shown:
            style = "reverse bold" if mode == self.current else "dim"
            tabs.append(f" {title} ", style=style)
            tabs.append(f"{key}  ", style="dim")
        if self.current not in MORE_SCREENS:  # no room beside a fourth tab at 80 columns
            # the footer may run out of room for it at 80 columns: said here
            tabs.append(" Help ", style="dim")
            tabs.append("F1  ", style="dim")
        yield Label(tabs, classes="tabs")
        yield Label("", classes="connection")

    def on_mount(self) -> None:
        """Follow the app's connection state."""
        self.watch(self.app, "connection", self._show_connection)

    def _show_connection(self, state: str) -> None:
        version = getattr(self.app, "daemon_version", None)
        self.query_one(".connection", Label).update(connection_text(state, version))
        self.set_class(state != "connected", "-offline")
