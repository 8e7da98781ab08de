"""The chats the terminal UI keeps: :mod:`localllm.chats` (shared with the CLI's ``chats``
command and ``run --system-prompt``), named here for the screens."""

from __future__ import annotations

from localllm.chats import (
    DB_NAME,
    Attachment,
    Chat,
    ChatStore,
    SavedPrompt,
    SearchHit,
    StoredMessage,
)

__all__ = [
    "DB_NAME",
    "Attachment",
    "Chat",
    "ChatStore",
    "SavedPrompt",
    "SearchHit",
    "StoredMessage",
]
