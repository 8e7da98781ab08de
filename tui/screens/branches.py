"""Branches of a chat on the chat screen: regenerate the last answer (Ctrl+R), edit an earlier
question (Ctrl+B: its text goes into the message box, and what is sent forks the chat there),
pick a message (Alt+Up/Down) and move between the branches that part at it (Alt+Left/Right).
Every answer and question stays saved; the branch on screen is the chat's head, kept across
restarts. Headers show which branch is on screen (``2/3``)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..chats import Chat, StoredMessage
from ..widgets.message import MessageView

if TYPE_CHECKING:
    from textual.widget import Widget

    from ..host import Host

__all__ = ["BranchSurface", "Branches", "Editing"]


class BranchSurface(Protocol):
    """What branching needs of the chat screen (:class:`~.chat.ChatScreen` is one)."""

    @property
    def llm(self) -> Host:
        """The app, as the screens see it."""
        ...

    current: Chat | None
    answers: dict[int, Any]

    def query_one(self, selector: str) -> Widget:
        """A widget of the screen."""
        ...

    def notify(self, message: str, **kwargs: Any) -> None:
        """A notification."""
        ...

    async def rebuild_transcript(self, chat: Chat) -> None:
        """Show ``chat``'s branch on screen again, from scratch."""
        ...

    async def answer_last(self, chat: Chat, tools: bool = True) -> None:
        """Answer the last question on ``chat``'s branch on screen (a new answer)."""
        ...


@dataclass
class Editing:
    """A question being edited in the message box."""

    chat_id: int
    """The chat it is in."""
    message: StoredMessage
    """The question as it was (it stays saved on its branch)."""


class Branches:
    """The chat screen's branching: a selected message, regenerate, edit and switch."""

    def __init__(self, screen: BranchSurface) -> None:
        self.screen = screen
        self.selected: int | None = None
        """The id of the message picked with Alt+Up/Down (None: none picked)."""
        self.editing: Editing | None = None
        """The question being edited, if one is."""

    # -- which message --------------------------------------------------------------------

    def views(self, chat: Chat) -> list[MessageView]:
        """The saved messages shown on ``chat``'s transcript, in order."""
        transcript = self.screen.query_one(f"#chat-{chat.id}")
        return [v for v in transcript.query(MessageView) if v.message_id is not None]

    def select(self, step: int) -> None:
        """Pick the message ``step`` above (-1) or below (+1) the one picked (from the
        bottom when none is); past the last, none is picked."""
        chat = self.screen.current
        if chat is None:
            return
        views = self.views(chat)
        ids = [v.message_id for v in views]
        if self.selected in ids:
            index = ids.index(self.selected) + step
        else:
            index = len(ids) - 1 if step < 0 else len(ids)
        self.selected = ids[index] if 0 <= index < len(ids) else None
        self.show_selection(chat)

    def show_selection(self, chat: Chat) -> None:
        """Mark the picked message and keep it in view."""
        for view in self.views(chat):
            picked = view.message_id == self.selected
            view.set_class(picked, "-selected")
            if picked:
                view.scroll_visible(animate=False)

    def _on_branch(self, chat: Chat, message_id: int | None) -> int | None:
        ids = [m.id for m in chat.messages]
        return ids.index(message_id) if message_id in ids else None

    def has_branches(self, chat: Chat | None) -> bool:
        """Whether ``chat`` has more than the branch on screen."""
        return chat is not None and bool(chat.others)

    def branch_point(self, chat: Chat) -> StoredMessage | None:
        """Where Alt+Left/Right switch: the picked message when it has other branches, else
        the last message on screen that has."""
        labels = chat.branch_labels()
        index = self._on_branch(chat, self.selected)
        if index is not None and chat.messages[index].id in labels:
            return chat.messages[index]
        return next((m for m in reversed(chat.messages) if m.id in labels), None)

    # -- the actions ----------------------------------------------------------------------

    def _busy(self, chat: Chat) -> bool:
        if chat.id in self.screen.answers:
            self.screen.notify("Wait for the answer, or press Esc to stop it", severity="warning")
            return True
        return False

    async def switch(self, step: int) -> None:
        """Show the previous (-1) or next (+1) branch at the branch point."""
        chat = self.screen.current
        if chat is None or self._busy(chat):
            return
        point = self.branch_point(chat)
        if point is None:
            self.screen.notify("This chat has one branch (Ctrl+R or Ctrl+B make another)")
            return
        siblings = chat.siblings(point)
        index = [m.id for m in siblings].index(point.id) + step
        if not 0 <= index < len(siblings):
            self.screen.notify(f"No {'earlier' if step < 0 else 'later'} branch here")
            return
        chosen = siblings[index]
        chat.show_branch(chat.leaf_under(chosen).id)
        await asyncio.to_thread(self.screen.llm.chats.set_head, chat.id, chat.head)
        self.selected = chosen.id
        await self.screen.rebuild_transcript(chat)

    async def regenerate(self) -> None:
        """Answer the last question again: a new branch beside the answer on screen."""
        chat = self.screen.current
        if chat is None or self._busy(chat):
            return
        if not chat.model:
            self.screen.notify("Pick a model first (Ctrl+L)", severity="warning")
            return
        last = max((i for i, m in enumerate(chat.messages) if m.role == "user"), default=None)
        if last is None:
            self.screen.notify("Nothing to regenerate yet: ask something first")
            return
        chat.cut_before(last + 1)
        await asyncio.to_thread(self.screen.llm.chats.set_head, chat.id, chat.head)
        self.selected = None
        await self.screen.rebuild_transcript(chat)
        await self.screen.answer_last(chat)

    def edit(self) -> StoredMessage | None:
        """Start editing the picked question (the last one when none is picked): returns it,
        for its text to go into the message box."""
        chat = self.screen.current
        if chat is None or self._busy(chat):
            return None
        index = self._on_branch(chat, self.selected)
        if index is None or chat.messages[index].role != "user":
            index = max((i for i, m in enumerate(chat.messages) if m.role == "user"), default=None)
        if index is None:
            self.screen.notify("No question to edit yet")
            return None
        message = chat.messages[index]
        self.editing = Editing(chat.id, message)
        return message

    async def fork(self, chat: Chat) -> StoredMessage | None:
        """Before the edited question is sent: cut the branch on screen where it was (the
        old branch stays saved) and return the question edited, None when not editing."""
        editing, self.editing = self.editing, None
        if editing is None or editing.chat_id != chat.id:
            return None
        index = self._on_branch(chat, editing.message.id)
        if index is None:
            return None
        chat.cut_before(index)
        await asyncio.to_thread(self.screen.llm.chats.set_head, chat.id, chat.head)
        self.selected = None
        await self.screen.rebuild_transcript(chat)
        return editing.message

    def labels(self, chat: Chat) -> None:
        """Show every message's ``n/N`` again (after a new branch was saved)."""
        labels = chat.branch_labels()
        for view in self.views(chat):
            told = view.label_of if view.label_of is not None else view.message_id
            if told is not None:
                view.branch = labels.get(told, "")

    def new_label(self, chat: Chat, parent: int | None) -> str:
        """The label of a message about to be saved under ``parent``: the last of its
        siblings (``3/3``), empty when it is the first."""
        count = sum(1 for m in chat.all_messages() if m.parent == parent) + 1
        return f"{count}/{count}" if count > 1 else ""
