"""The library of saved system prompts (Ctrl+S on the chat screen): create, edit, rename,
delete, and pick one for the chat. They live with the chats (:mod:`localllm.chats`), so
``localllm run --system-prompt NAME`` finds the same ones."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Footer, Input, Label, OptionList, TextArea
from textual.widgets.option_list import Option

from localllm._exceptions import LocalLLMError

from .dialogs import ConfirmDialog, _Dialog

if TYPE_CHECKING:
    from ..chats import ChatStore, SavedPrompt

__all__ = ["PromptLibrary"]


class PromptLibrary(_Dialog):
    """The saved system prompts; dismisses with the one picked for the chat, or None."""

    DEFAULT_CSS = """
    PromptLibrary {
        align: center middle;
    }
    PromptLibrary #library {
        width: 90;
        max-width: 100%;
        height: 24;
        max-height: 100%;
        border: thick $primary;
        background: $surface;
        padding: 0 1;
    }
    PromptLibrary #library-body {
        height: 1fr;
    }
    PromptLibrary #prompt-list {
        width: 24;
        height: 1fr;
        border-right: vkey $border-blurred;
    }
    PromptLibrary #editor {
        width: 1fr;
        padding-left: 1;
    }
    PromptLibrary #prompt-name {
        margin-bottom: 1;
        background: $boost;
    }
    PromptLibrary #prompt-text {
        height: 1fr;
        background: $boost;
    }
    PromptLibrary #library-error {
        color: $error;
        height: auto;
    }
    PromptLibrary .buttons {
        height: auto;
        align-horizontal: right;
    }
    PromptLibrary .buttons Button {
        margin-left: 2;
    }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Close", id="library.close"),
        Binding("ctrl+n", "new", "New prompt", id="library.new"),
        Binding("ctrl+s", "save", "Save", id="library.save"),
        Binding("f8", "delete", "Delete", id="library.delete"),
        Binding("ctrl+o", "use", "Use for this chat", id="library.use"),
    ]

    def __init__(self, store: ChatStore, current: str = "") -> None:
        super().__init__()
        self.store = store
        """Where the prompts are kept."""
        self.current = current
        """The chat's system prompt now (its prompt is highlighted when it is one)."""
        self.prompts: list[SavedPrompt] = []
        """The saved prompts, as listed."""
        self.editing: str | None = None
        """The name of the saved prompt in the editor (None: a new one)."""

    def compose(self) -> ComposeResult:
        """Build the widget tree."""
        with Vertical(id="library"):
            yield Label(
                "System prompts · kept with the chats · `localllm run --system-prompt NAME`",
                classes="question",
            )
            with Horizontal(id="library-body"):
                yield OptionList(id="prompt-list")
                with Vertical(id="editor"):
                    yield Input(placeholder="Name", id="prompt-name", compact=True)
                    yield TextArea(id="prompt-text", soft_wrap=True, compact=True)
            yield Label("", id="library-error")
            with Horizontal(classes="buttons"):
                yield Button("New", id="new", compact=True)
                yield Button("Save", id="save", variant="primary", compact=True)
                yield Button("Delete", id="delete", variant="error", compact=True)
                yield Button("Use for this chat", id="use", variant="success", compact=True)
                yield Button("Close", classes="cancel", compact=True)
        yield Footer(compact=True, show_command_palette=False)

    async def on_mount(self) -> None:
        """List the prompts; open the chat's own when it is a saved one."""
        await self.reload()
        chosen = next((p.name for p in self.prompts if p.text == self.current), None)
        if chosen is not None:
            self.show_prompt(chosen)
        else:
            self.action_new()

    async def reload(self, select: str | None = None) -> None:
        """List the saved prompts again; highlight ``select``."""
        self.prompts = await asyncio.to_thread(self.store.list_prompts)
        listing = self.query_one("#prompt-list", OptionList)
        listing.set_options(Option(p.name, id=p.name) for p in self.prompts)
        if select is not None:
            listing.highlighted = listing.get_option_index(select)

    def show_prompt(self, name: str) -> None:
        """Put the saved prompt ``name`` in the editor."""
        prompt = next((p for p in self.prompts if p.name == name), None)
        if prompt is None:
            return
        self.editing = prompt.name
        self.query_one("#prompt-name", Input).value = prompt.name
        self.query_one("#prompt-text", TextArea).text = prompt.text
        listing = self.query_one("#prompt-list", OptionList)
        listing.highlighted = listing.get_option_index(name)
        self.say("")

    def say(self, error: str) -> None:
        """Show ``error`` under the editor (empty: none)."""
        self.query_one("#library-error", Label).update(error)

    @on(OptionList.OptionHighlighted, "#prompt-list")
    def _highlighted(self, event: OptionList.OptionHighlighted) -> None:
        if event.option.id is not None and event.option.id != self.editing:
            self.show_prompt(event.option.id)

    @on(Button.Pressed, "#new")
    def action_new(self) -> None:
        """An empty editor for a new prompt."""
        self.editing = None
        self.query_one("#prompt-name", Input).value = ""
        self.query_one("#prompt-text", TextArea).text = ""
        self.query_one("#prompt-list", OptionList).highlighted = None
        self.query_one("#prompt-name", Input).focus()
        self.say("")

    @on(Button.Pressed, "#save")
    async def action_save(self) -> SavedPrompt | None:
        """Save the editor's prompt (renaming it when its name changed); the saved prompt, or
        None (and why) when it cannot be."""
        name = self.query_one("#prompt-name", Input).value.strip()
        text = self.query_one("#prompt-text", TextArea).text
        if not text.strip():
            self.say("The prompt is empty: write what the model should be told")
            return None
        taken = {p.name for p in self.prompts}
        if name != self.editing and name in taken:
            self.say(f"A prompt called “{name}” exists: pick it to edit it, or another name")
            return None
        try:
            saved = await asyncio.to_thread(
                self.store.save_prompt, name, text, old_name=self.editing
            )
        except LocalLLMError as exc:
            self.say(str(exc))
            return None
        self.editing = saved.name
        await self.reload(select=saved.name)
        self.say("")
        self.notify(f"Saved the prompt “{saved.name}”")
        return saved

    @on(Button.Pressed, "#delete")
    @work(exclusive=True, group="library-dialog")
    async def action_delete(self) -> None:
        """Delete the prompt in the editor, after asking (chats using it keep its text)."""
        name = self.editing
        if name is None:
            self.say("Pick a saved prompt to delete")
            return
        question = f"Delete the saved prompt “{name}”? Chats that use it keep its text."
        if not await self.app.push_screen_wait(ConfirmDialog(question, "Delete")):
            return
        await asyncio.to_thread(self.store.delete_prompt, name)
        await self.reload()
        self.action_new()
        self.notify(f"Deleted the prompt “{name}”")

    @on(Button.Pressed, "#use")
    async def action_use(self) -> None:
        """Save the editor's prompt and use it as the chat's system prompt."""
        saved = await self.action_save()
        if saved is not None:
            self.dismiss(saved)
