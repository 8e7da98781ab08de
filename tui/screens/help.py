"""The help screen: every key binding, by screen, read from the bindings themselves."""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Markdown

__all__ = ["HelpScreen", "bindings_markdown"]

_ABOUT = """\
localllm talks to the local daemon (it is started if none runs). **Chat** streams answers
with their timings: TTFT (time to first token), prefill and decode speed, and the prompt
tokens reused from the cache. **Models** manages the store; **Dashboard** shows what each
loaded model is doing, live. Chats are saved and come back on the next start.
"""


def _bindings(entries: Iterable[BindingType]) -> list[Binding]:
    return [b for b in entries if isinstance(b, Binding) and b.description]


def bindings_markdown(sections: Iterable[tuple[str, Iterable[BindingType]]], key_display) -> str:  # type: ignore[no-untyped-def]
    """One Markdown table per section of ``(title, bindings)``."""
    parts = [_ABOUT]
    for title, entries in sections:
        parts += [f"### {title}", "", "| Key | Action |", "|---|---|"]
        for binding in _bindings(entries):
            parts.append(f"| `{key_display(binding)}` | {binding.description} |")
        parts.append("")
    return "\n".join(parts)


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
        with Vertical(id="help"):
            yield Label("localllm — keys  (Esc closes)", id="help-title")
            with VerticalScroll():
                yield Markdown(bindings_markdown(self.sections, self.app.get_key_display))

    def action_close(self) -> None:
        """Close the help."""
        self.dismiss(None)
