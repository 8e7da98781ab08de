"""Chats kept across restarts: a small SQLite database in the data dir, shared by the
terminal UI (its chats), ``localllm run --system-prompt`` (the prompt library) and
``localllm chats`` (export, search).

Each chat has a title, a model, a system prompt, generation options, a ``think`` setting and
its MCP settings (servers and tools on); its messages keep the question's attached images,
the answer's reasoning and timings (the final chunk's fields), the tool calls an answer made
and each call's result (role ``tool``), so all survive a restart and show as they were.
Messages form a tree (each knows its parent; a chat's ``head`` is the last message of the
branch on screen), see :mod:`.model`. Named system prompts live in the ``prompts`` table
(:mod:`.prompts`). Databases written before a column existed are migrated when opened
(:data:`_MIGRATIONS`, counted by SQLite's ``user_version``); version 5 links the messages of
an older database one after the other, so every old chat is one branch.
The TUI calls these methods from worker threads (``asyncio.to_thread``); one connection is
shared behind a lock, which SQLite allows with ``check_same_thread=False``.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localllm._exceptions import LocalLLMError

from .model import Attachment, Chat, StoredMessage

if TYPE_CHECKING:
    from localllm.client import Think

__all__ = [
    "DB_NAME",
    "ChatNotFoundError",
    "ChatStore",
    "PromptNameError",
    "PromptNotFoundError",
    "SavedPrompt",
    "SearchHit",
]

DB_NAME = "tui-chats.sqlite3"
"""File name of the database inside ``settings.data_dir``."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS chats (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    model TEXT,
    system TEXT NOT NULL DEFAULT '',
    options TEXT NOT NULL DEFAULT '{}',
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    stats TEXT,
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_chat ON messages(chat_id, id);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS prompts (
    name TEXT PRIMARY KEY,
    text TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL
);
"""
# Columns added since version 1, each with the version that added it. The tables above stay
# as version 1 wrote them, so an old database and a new one take the same path. ``think`` is
# JSON (true, false, a level; NULL leaves the model's default).
_MIGRATIONS: tuple[tuple[int, str, str], ...] = (
    (2, "chats", "think TEXT"),
    (2, "messages", "thinking TEXT NOT NULL DEFAULT ''"),
    # JSON list of {"name", "data"}: attached images, data as base64 (Ollama's wire form).
    (3, "messages", "images TEXT NOT NULL DEFAULT '[]'"),
    # JSON: an answer's tool calls, or a tool result's call (see StoredMessage.tool); NULL for
    # plain messages.
    (4, "messages", "tool TEXT"),
    # JSON: the chat's MCP settings (Chat.tools).
    (4, "chats", "tools TEXT NOT NULL DEFAULT '{}'"),
    # The tree: a message's parent (NULL: the chat's first), the branch on screen's last
    # message, and the model of an answer picked from a comparison.
    (5, "messages", "parent INTEGER"),
    (5, "chats", "head INTEGER"),
    (5, "messages", "model TEXT"),
)
# Data each version brings to an older database once its columns exist: version 5 chains
# the messages of a chat in the order they were saved (the only order they had) and puts the
# newest on screen, so an old chat opens as it was, one branch.
_BACKFILL: tuple[tuple[int, str], ...] = (
    (
        5,
        "UPDATE messages SET parent = (SELECT MAX(m.id) FROM messages AS m "
        "WHERE m.chat_id = messages.chat_id AND m.id < messages.id)",
    ),
    (5, "UPDATE chats SET head = (SELECT MAX(m.id) FROM messages AS m WHERE m.chat_id = chats.id)"),
)
_SCHEMA_VERSION = max(version for version, _, _ in _MIGRATIONS)


_HEAD = object()
"""``add_message``'s default parent: the chat's head."""
_SNIPPET = 70
"""Characters of text around a search's match."""


class ChatNotFoundError(LocalLLMError, LookupError):
    """No chat has the id asked for."""


class PromptNotFoundError(LocalLLMError, LookupError):
    """No saved system prompt has the name asked for."""


class PromptNameError(LocalLLMError, ValueError):
    """A saved system prompt's name is not usable (empty)."""


@dataclass(frozen=True)
class SavedPrompt:
    """A named system prompt of the library."""

    name: str
    """What it is picked by (``localllm run --system-prompt NAME``)."""
    text: str
    """The system prompt."""


@dataclass(frozen=True)
class SearchHit:
    """A message that contains the text searched for."""

    chat_id: int
    """The chat it is in."""
    message_id: int
    """The message (on any branch)."""
    title: str
    """The chat's title."""
    role: str
    """``user``, ``assistant`` or ``tool``."""
    snippet: str
    """One line of the text around the match."""


def _snippet(content: str, needle: str) -> str:
    flat = " ".join(content.split())
    at = flat.lower().find(needle.lower())
    if at < 0:  # SQLite's LIKE folds only ASCII case
        return flat[:_SNIPPET]
    start = max(0, at - _SNIPPET // 2)
    text = flat[start : at + len(needle) + _SNIPPET // 2]
    return (
        ("…" if start else "")
        + text
        + ("…" if at + len(needle) + _SNIPPET // 2 < len(flat) else "")
    )


def _chat(row: tuple[Any, ...]) -> Chat:
    return Chat(
        row[0],
        row[1],
        row[2],
        row[3],
        json.loads(row[4]),
        think=json.loads(row[5]) if row[5] else None,
        tools=json.loads(row[6] or "{}"),
    )


def _message(row: tuple[Any, ...]) -> StoredMessage:
    message_id, role, content, stats, thinking, images, tool, parent, model = row
    return StoredMessage(
        role,
        content,
        json.loads(stats) if stats else None,
        message_id,
        thinking or "",
        [Attachment(i["name"], i["data"]) for i in json.loads(images or "[]")],
        json.loads(tool) if tool else None,
        parent,
        model,
    )


def _think_json(think: Think | None) -> str | None:
    """``think`` as stored: JSON, NULL for the model's default."""
    return None if think is None else json.dumps(think)


class ChatStore:
    """Chats in SQLite; every method is safe to call from any thread."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.time) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        """The database file."""
        self._clock = clock
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA foreign_keys = ON")
        # WAL keeps each small commit cheap, so saving a message never holds up the UI thread.
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.executescript(_SCHEMA)
        self._migrate()

    def _migrate(self) -> None:
        """Add the columns a database written by an older version lacks.

        In one write transaction: two apps opening an old database at once must not both add
        a column (the second would fail), and the version is read again inside it."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            version = int(db.execute("PRAGMA user_version").fetchone()[0])
            for added_in, table, column in _MIGRATIONS:
                existing = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
                if added_in > version and column.split()[0] not in existing:
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {column}")
            for added_in, sql in _BACKFILL:
                if added_in > version:
                    db.execute(sql)
            if version < _SCHEMA_VERSION:
                db.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()

    def _run(self, sql: str, args: tuple[Any, ...] = ()) -> tuple[int | None, list[Any]]:
        """Execute one statement; its last row id and every row it returned."""
        with self._lock:
            cursor = self._db.execute(sql, args)
            return cursor.lastrowid, cursor.fetchall()

    # -- chats --------------------------------------------------------------------------

    def create_chat(
        self,
        title: str = "New chat",
        model: str | None = None,
        system: str = "",
        options: dict[str, Any] | None = None,
        think: Think | None = None,
        tools: dict[str, Any] | None = None,
    ) -> Chat:
        """A new, empty chat."""
        now = self._clock()
        row_id, _ = self._run(
            "INSERT INTO chats (title, model, system, options, think, tools, created, updated) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                title,
                model,
                system,
                json.dumps(options or {}),
                _think_json(think),
                json.dumps(tools or {}),
                now,
                now,
            ),
        )
        assert row_id is not None
        return Chat(
            row_id, title, model, system, dict(options or {}), think=think, tools=dict(tools or {})
        )

    def list_chats(self) -> list[Chat]:
        """Every chat with its messages (the branch on screen and the others), oldest chat
        first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id, title, model, system, options, think, tools, head FROM chats "
                "ORDER BY id"
            ).fetchall()
            messages = self._db.execute(
                "SELECT chat_id, id, role, content, stats, thinking, images, tool, parent, model "
                "FROM messages ORDER BY id"
            ).fetchall()
        chats = {row[0]: _chat(row) for row in rows}
        heads = {row[0]: row[7] for row in rows}
        for row in messages:
            chat = chats.get(row[0])
            if chat is not None:
                chat.others.append(_message(row[1:]))
        for chat in chats.values():
            head = heads[chat.id]
            if head is None and chat.others:  # written by a version without branches
                head = chat.others[-1].id
            chat.show_branch(head)
        return list(chats.values())

    def chat(self, chat_id: int) -> Chat:
        """One chat with its messages; :class:`~localllm.LocalLLMError` when there is none."""
        for chat in self.list_chats():
            if chat.id == chat_id:
                return chat
        raise ChatNotFoundError(f"no chat {chat_id} in {self.path} (`localllm chats list`)")

    def update_chat(self, chat: Chat) -> None:
        """Save a chat's title, model, system prompt, options, ``think`` and MCP settings."""
        self._run(
            "UPDATE chats SET title = ?, model = ?, system = ?, options = ?, think = ?, "
            "tools = ?, updated = ? WHERE id = ?",
            (
                chat.title,
                chat.model,
                chat.system,
                json.dumps(chat.options),
                _think_json(chat.think),
                json.dumps(chat.tools),
                self._clock(),
                chat.id,
            ),
        )

    def delete_chat(self, chat_id: int) -> None:
        """Remove a chat and its messages."""
        self._run("DELETE FROM chats WHERE id = ?", (chat_id,))

    # -- messages -----------------------------------------------------------------------

    def add_message(
        self, chat_id: int, message: StoredMessage, *, parent: int | object | None = _HEAD
    ) -> StoredMessage:
        """Save ``message`` under ``parent`` (by default the chat's head: the end of the branch
        on screen) and make it the head; sets and returns it with its ``id`` and ``parent``."""
        with self._lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                if parent is _HEAD:
                    parent = db.execute(
                        "SELECT head FROM chats WHERE id = ?", (chat_id,)
                    ).fetchone()[0]
                cursor = db.execute(
                    "INSERT INTO messages (chat_id, role, content, stats, thinking, images, tool, "
                    "parent, model, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        chat_id,
                        message.role,
                        message.content,
                        json.dumps(message.stats) if message.stats is not None else None,
                        message.thinking,
                        json.dumps([{"name": i.name, "data": i.data} for i in message.images]),
                        json.dumps(message.tool) if message.tool is not None else None,
                        parent,
                        message.model,
                        self._clock(),
                    ),
                )
                db.execute(
                    "UPDATE chats SET head = ?, updated = ? WHERE id = ?",
                    (cursor.lastrowid, self._clock(), chat_id),
                )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        message.id = cursor.lastrowid
        message.parent = parent if isinstance(parent, int) else None
        return message

    def set_head(self, chat_id: int, head: int | None) -> None:
        """Remember which branch is on screen: the one ending at message ``head``."""
        self._run("UPDATE chats SET head = ? WHERE id = ?", (head, chat_id))

    # -- search ---------------------------------------------------------------------------

    def search(self, text: str, limit: int = 200) -> list[SearchHit]:
        """Messages of every chat (every branch) whose text contains ``text``, ignoring case,
        newest first; at most ``limit``."""
        needle = text.strip()
        if not needle:
            return []
        escaped = needle.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        _, rows = self._run(
            "SELECT m.chat_id, m.id, c.title, m.role, m.content FROM messages AS m "
            "JOIN chats AS c ON c.id = m.chat_id "
            "WHERE m.content LIKE ? ESCAPE '\\' ORDER BY m.id DESC LIMIT ?",
            (f"%{escaped}%", limit),
        )
        return [
            SearchHit(chat_id, message_id, title, role, _snippet(content, needle))
            for chat_id, message_id, title, role, content in rows
        ]

    # -- the prompt library --------------------------------------------------------------

    def list_prompts(self) -> list[SavedPrompt]:
        """The saved system prompts, by name."""
        _, rows = self._run("SELECT name, text FROM prompts ORDER BY name COLLATE NOCASE")
        return [SavedPrompt(name, text) for name, text in rows]

    def get_prompt(self, name: str) -> SavedPrompt:
        """The saved prompt called ``name``; :class:`PromptNotFoundError` (naming those there
        are) when there is none."""
        _, rows = self._run("SELECT name, text FROM prompts WHERE name = ?", (name,))
        if not rows:
            names = ", ".join(p.name for p in self.list_prompts()) or "none saved yet"
            raise PromptNotFoundError(f"no saved system prompt called {name!r} (saved: {names})")
        return SavedPrompt(rows[0][0], rows[0][1])

    def save_prompt(self, name: str, text: str, *, old_name: str | None = None) -> SavedPrompt:
        """Save ``text`` as the prompt ``name`` (replacing one of that name); ``old_name``
        renames that prompt to ``name``. A name must not be empty."""
        name = name.strip()
        if not name:
            raise PromptNameError("a saved prompt needs a name")
        now = self._clock()
        with self._lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                if old_name is not None and old_name != name:
                    db.execute("DELETE FROM prompts WHERE name = ?", (old_name,))
                db.execute(
                    "INSERT INTO prompts (name, text, created, updated) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT(name) DO UPDATE SET text = excluded.text, "
                    "updated = excluded.updated",
                    (name, text, now, now),
                )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return SavedPrompt(name, text)

    def delete_prompt(self, name: str) -> None:
        """Remove the saved prompt ``name`` (the chats that use its text keep it)."""
        self._run("DELETE FROM prompts WHERE name = ?", (name,))

    # -- small state ----------------------------------------------------------------------

    def get_meta(self, key: str) -> str | None:
        """A saved UI setting (the open chat, the theme)."""
        _, rows = self._run("SELECT value FROM meta WHERE key = ?", (key,))
        return str(rows[0][0]) if rows else None

    def set_meta(self, key: str, value: str) -> None:
        """Save a UI setting."""
        self._run(
            "INSERT INTO meta (key, value) VALUES (?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (key, value),
        )
