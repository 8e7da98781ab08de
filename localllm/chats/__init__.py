"""Saved chats, shared by the terminal UI and the CLI: a SQLite database in the data dir
(:mod:`.store`) holding chats as trees of messages (:mod:`.model`: regenerated answers and
edited questions are branches), the library of named system prompts, search, and export to
Markdown or OpenAI's messages (:mod:`.export`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from localllm._exceptions import LocalLLMError

from .export import EXPORT_FORMATS, export_chat, to_markdown, to_openai
from .model import Attachment, Chat, StoredMessage
from .store import (
    DB_NAME,
    ChatNotFoundError,
    ChatStore,
    PromptNameError,
    PromptNotFoundError,
    SavedPrompt,
    SearchHit,
)

if TYPE_CHECKING:
    from localllm.settings import Settings


class NoChatsError(LocalLLMError, FileNotFoundError):
    """The data dir has no chat database yet."""


__all__ = [
    "DB_NAME",
    "EXPORT_FORMATS",
    "Attachment",
    "Chat",
    "ChatNotFoundError",
    "ChatStore",
    "NoChatsError",
    "PromptNameError",
    "PromptNotFoundError",
    "SavedPrompt",
    "SearchHit",
    "StoredMessage",
    "chat_db_path",
    "export_chat",
    "open_store",
    "to_markdown",
    "to_openai",
]


def chat_db_path(settings: Settings) -> Path:
    """Where the chats and the prompt library are kept."""
    return settings.data_dir / DB_NAME


@contextmanager
def open_store(settings: Settings) -> Iterator[ChatStore]:
    """The chat database of ``settings``' data dir, for one command (closed after);
    :class:`NoChatsError` when the terminal UI never wrote one there."""
    path = chat_db_path(settings)
    if not path.exists():
        raise NoChatsError(
            f"no saved chats or prompts in {path.parent} yet (`localllm tui` keeps them)"
        )
    store = ChatStore(path)
    try:
        yield store
    finally:
        store.close()
