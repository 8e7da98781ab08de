"""Chats kept across restarts: a small SQLite database in the data dir.

Each chat has a title, a model, a system prompt, generation options, a ``think`` setting and
its MCP settings (servers and tools on); its messages keep the question's attached images,
the answer's reasoning and timings (the final chunk's fields), the tool calls an answer made
and each call's result (role ``tool``), so all survive a restart and show as they were.
Databases written before a column existed are migrated when opened (:data:`_MIGRATIONS`,
counted by SQLite's ``user_version``).
The TUI calls these methods from worker threads (``asyncio.to_thread``); one connection is
shared behind a lock, which SQLite allows with ``check_same_thread=False``.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from localllm.client import Think

__all__ = ["DB_NAME", "Attachment", "Chat", "ChatStore", "StoredMessage"]

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
)
_SCHEMA_VERSION = max(version for version, _, _ in _MIGRATIONS)


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
    """The conversation, oldest first."""
    think: Think | None = None
    """``think`` sent with every request: on, off or a level; None leaves the model's default."""
    tools: dict[str, Any] = field(default_factory=dict)
    """MCP settings: ``servers`` (names on; absent: every server of the config that is not
    disabled; ``[]``: none) and ``off`` (``server/tool`` keys switched off)."""

    def request_messages(self) -> list[dict[str, Any]]:
        """The messages to send to ``/api/chat``: the system prompt, then the conversation
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
        """The newest assistant message's text."""
        for message in reversed(self.messages):
            if message.role == "assistant" and message.content:
                return message.content
        return None


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
        """Every chat with its messages, oldest chat first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id, title, model, system, options, think, tools FROM chats ORDER BY id"
            ).fetchall()
            messages = self._db.execute(
                "SELECT chat_id, id, role, content, stats, thinking, images, tool FROM messages "
                "ORDER BY id"
            ).fetchall()
        chats = {
            row[0]: Chat(
                row[0],
                row[1],
                row[2],
                row[3],
                json.loads(row[4]),
                think=json.loads(row[5]) if row[5] else None,
                tools=json.loads(row[6] or "{}"),
            )
            for row in rows
        }
        for chat_id, message_id, role, content, stats, thinking, images, tool in messages:
            chat = chats.get(chat_id)
            if chat is not None:
                loaded = json.loads(stats) if stats else None
                attached = [Attachment(i["name"], i["data"]) for i in json.loads(images or "[]")]
                chat.messages.append(
                    StoredMessage(
                        role,
                        content,
                        loaded,
                        message_id,
                        thinking or "",
                        attached,
                        json.loads(tool) if tool else None,
                    )
                )
        return list(chats.values())

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

    def add_message(self, chat_id: int, message: StoredMessage) -> StoredMessage:
        """Append a message to a chat; sets and returns it with its ``id``."""
        row_id, _ = self._run(
            "INSERT INTO messages (chat_id, role, content, stats, thinking, images, tool, "
            "created) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                chat_id,
                message.role,
                message.content,
                json.dumps(message.stats) if message.stats is not None else None,
                message.thinking,
                json.dumps([{"name": i.name, "data": i.data} for i in message.images]),
                json.dumps(message.tool) if message.tool is not None else None,
                self._clock(),
            ),
        )
        message.id = row_id
        self._run("UPDATE chats SET updated = ? WHERE id = ?", (self._clock(), chat_id))
        return message

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
