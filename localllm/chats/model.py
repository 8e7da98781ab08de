"""A saved chat as a tree: every message knows its parent, so a regenerated answer or an edited
question is a new branch beside the old one, and the chat shows one branch at a time (from the
first message down to its ``head``).

:class:`Chat` keeps the branch on screen in :attr:`Chat.messages` (oldest first, what is sent
to the model) and the messages of the other branches in :attr:`Chat.others`; the tree is the
two together, linked by :attr:`StoredMessage.parent`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from localllm.client import Think

__all__ = ["Attachment", "Chat", "StoredMessage"]


@dataclass
class StoredMessage:
    """One message of a chat."""

    role: str
    """``user``, ``assistant`` or ``tool`` (a tool's result)."""
    content: str
    """The text (Markdown for answers)."""
    stats: dict[str, Any] | None = None
    """For answers: the final chunk's timing fields, or ``{"done_reason": "stopped"}``."""
    id: int | None = None
    """Row id once saved."""
    thinking: str = ""
    """For answers: the model's reasoning before the text, if it showed any."""
    images: list[Attachment] = field(default_factory=list)
    """For questions: the images attached, sent with the message every time. For tool
    results: the images the tool returned (sent to a model that sees)."""
    tool: dict[str, Any] | None = None
    """For an answer that called tools: ``{"calls": [...]}`` (``/api/chat``'s tool calls).
    For a tool result (role ``tool``): ``{"call_id", "name"`` (as the model called it)``,
    "server", "tool", "arguments", "status", "seconds", "notes"}``, all that its block in the
    transcript shows."""
    parent: int | None = None
    """The id of the message before it (None for a chat's first message); set when saved."""
    model: str | None = None
    """For answers: the model that wrote it, when it was not the chat's (a compared model)."""


@dataclass(frozen=True)
class Attachment:
    """An image attached to a question."""

    name: str
    """The file's name, shown above the question."""
    data: str
    """Standard base64 of the file's bytes, as ``/api/chat`` takes it."""


@dataclass
class Chat:
    """A conversation with its settings."""

    id: int
    """Row id."""
    title: str
    """Shown in the chat list (the first question, shortened, once there is one)."""
    model: str | None = None
    """The model it talks to."""
    system: str = ""
    """System prompt; empty for none (the model's own default applies)."""
    options: dict[str, Any] = field(default_factory=dict)
    """Generation options sent with every request (``temperature``, ``num_ctx``, ...)."""
    messages: list[StoredMessage] = field(default_factory=list)
    """The branch on screen, oldest first: what is sent to the model."""
    think: Think | None = None
    """``think`` sent with every request: on, off or a level; None leaves the model's default."""
    tools: dict[str, Any] = field(default_factory=dict)
    """MCP settings: ``servers`` (names on; absent: every server of the config that is not
    disabled; ``[]``: none) and ``off`` (``server/tool`` keys switched off)."""
    others: list[StoredMessage] = field(default_factory=list)
    """The saved messages of the branches not on screen."""

    def request_messages(self) -> list[dict[str, Any]]:
        """The messages to send to ``/api/chat``: the system prompt, then the branch on screen
        (answers with their reasoning and questions with their images, as Ollama's CLI sends
        them back)."""
        sent: list[dict[str, Any]] = (
            [{"role": "system", "content": self.system}] if self.system.strip() else []
        )
        for message in self.messages:
            item: dict[str, Any] = {"role": message.role, "content": message.content}
            if message.thinking:
                item["thinking"] = message.thinking
            if message.images:
                item["images"] = [image.data for image in message.images]
            tool = message.tool or {}
            if message.role == "assistant" and tool.get("calls"):
                item["tool_calls"] = tool["calls"]
            elif message.role == "tool":
                item["tool_name"] = tool.get("name", "")
                item["tool_call_id"] = tool.get("call_id", "")
            sent.append(item)
        return sent

    def last_answer(self) -> str | None:
        """The newest assistant message's text on the branch on screen."""
        for message in reversed(self.messages):
            if message.role == "assistant" and message.content:
                return message.content
        return None

    # -- the tree -----------------------------------------------------------------------

    def all_messages(self) -> list[StoredMessage]:
        """Every saved message of every branch, oldest first."""
        saved = [m for m in [*self.messages, *self.others] if m.id is not None]
        return sorted(saved, key=lambda m: m.id or 0)

    def siblings(self, message: StoredMessage) -> list[StoredMessage]:
        """The messages that share ``message``'s parent (itself among them), oldest first:
        the branches that part at that point."""
        if message.id is None:
            return [message]
        return [m for m in self.all_messages() if m.parent == message.parent]

    def branch_label(self, message: StoredMessage) -> str:
        """``2/3`` when ``message`` is the second of three branches; empty when it has no
        other."""
        siblings = self.siblings(message)
        if len(siblings) < 2:
            return ""
        index = next(i for i, m in enumerate(siblings) if m.id == message.id)
        return f"{index + 1}/{len(siblings)}"

    def branch_labels(self) -> dict[int, str]:
        """:meth:`branch_label` of every message on screen, by id, in one pass over the tree
        (what a transcript shows: one label per message would walk the tree each time)."""
        children: dict[int | None, list[int]] = {}
        for m in self.all_messages():
            children.setdefault(m.parent, []).append(m.id or 0)
        labels: dict[int, str] = {}
        for m in self.messages:
            if m.id is None:
                continue
            siblings = children.get(m.parent, [])
            if len(siblings) > 1:
                labels[m.id] = f"{siblings.index(m.id) + 1}/{len(siblings)}"
        return labels

    def leaf_under(self, message: StoredMessage) -> StoredMessage:
        """The end of the newest branch that goes through ``message``: at each step down, the
        newest child (the answer or question given last)."""
        children: dict[int | None, list[StoredMessage]] = {}
        for m in self.all_messages():
            children.setdefault(m.parent, []).append(m)
        leaf = message
        while children.get(leaf.id):
            leaf = children[leaf.id][-1]
        return leaf

    def show_branch(self, head: int | None) -> None:
        """Put the branch ending at the message ``head`` on screen (None: no message)."""
        every = self.all_messages()
        by_id = {m.id: m for m in every}
        branch: list[StoredMessage] = []
        at = by_id.get(head)
        while at is not None:
            branch.append(at)
            at = by_id.get(at.parent) if at.parent is not None else None
        branch.reverse()
        on_branch = {m.id for m in branch}
        self.messages = branch
        self.others = [m for m in every if m.id not in on_branch]

    def cut_before(self, index: int) -> None:
        """Keep the branch on screen up to (not including) ``index``: the rest stays saved as
        a branch of its own, and what is sent next starts a new one there."""
        self.others.extend(self.messages[index:])
        del self.messages[index:]

    @property
    def head(self) -> int | None:
        """The id of the last message on screen (None when there is none)."""
        return self.messages[-1].id if self.messages else None
