"""The TUI chat with reasoning models (the tiny models of ``test_cli_think`` on a real daemon):
the reasoning streams into a "Thinking" box above the answer and folds once the answer begins,
the options dialog's think setting is sent and saved with the chat, the reasoning is saved
with the answer and shown folded after a restart, and chat databases written before these
columns existed still open.

Nothing asserts what a model says: the reasoning and the answer shown are compared with the
daemon's own greedy answer to the same request."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_daemon_support import Daemon, running_daemon
from test_tui import connected, last_answer
from test_tui_support import make_app, screen_text, wait_for
from textual.widgets import Collapsible, Select
from thinking_models import MIXED, PLAIN, PROMPT, THINKER, ask, create_thinking_models

from localllm.tui.chats import DB_NAME, ChatStore, StoredMessage
from localllm.tui.screens.chat import ChatScreen
from localllm.tui.screens.dialogs import ChatOptionsDialog
from localllm.tui.widgets.message import MessageView, ThinkingBox


@pytest.fixture
def anyio_backend() -> str:
    """Textual runs on asyncio."""
    return "asyncio"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon with the tiny reasoning models."""
    folder = tmp_path_factory.mktemp("tui-think")
    with running_daemon(folder / "home", num_parallel=2, num_threads=1) as d:
        with d.client() as client:
            create_thinking_models(d.url, client, folder)
        yield d


def _open_chat(data: Path, model: str) -> int:
    """A new chat with ``model``, the one the app opens on; its id."""
    store = ChatStore(data / DB_NAME)
    chat = store.create_chat("New chat", model)
    store.set_meta("current_chat", str(chat.id))
    store.close()
    return chat.id


def _folded(box: ThinkingBox) -> bool:
    """Whether the box shows only its title (its contents hidden by the collapsed style)."""
    return box.collapsed and not box.query_one(Collapsible.Contents).display


@pytest.mark.slow
@pytest.mark.anyio
async def test_reasoning_folds_above_the_answer_and_is_saved(
    daemon: Daemon, tmp_path: Path
) -> None:
    with daemon.client() as client:
        expected = ask(client, MIXED)["message"]
    chat_id = _open_chat(tmp_path, MIXED)
    app = make_app(daemon, tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await connected(pilot, app)
        screen = app.screen
        assert isinstance(screen, ChatScreen) and screen.current is not None

        # think on, through the options dialog
        await pilot.press("ctrl+o")
        dialog = await wait_for(
            pilot, lambda: isinstance(app.screen, ChatOptionsDialog) and app.screen, "options"
        )
        think = dialog.query_one("#think", Select)
        assert think.value == "default"
        think.value = "on"
        await pilot.click("#save")
        await wait_for(pilot, lambda: app.screen is screen, "the dialog to close")
        assert screen.current.think is True
        assert "thinking" in screen_text(app)  # the options line says so

        assert await screen.send(PROMPT)
        answer = last_answer(screen)
        box = await wait_for(pilot, lambda: answer.thinking_view, "the reasoning to show")
        await wait_for(pilot, lambda: not screen.answering, "the answer to end")

        # the daemon's reasoning in the box, folded above the daemon's answer
        assert answer.thinking == expected["thinking"]
        assert answer.text == expected["content"]
        assert answer.streamed_chunks > 1
        children = list(answer.children)
        assert children.index(box) < children.index(answer.markdown)
        await wait_for(pilot, lambda: _folded(box), "the reasoning to fold")
        assert "▶ Thinking" in screen_text(app)
        # a click on its title opens it
        await pilot.click(box.query_one("CollapsibleTitle"))
        await wait_for(pilot, lambda: not box.collapsed, "the reasoning to open")
        saved = screen.current.messages[-1]
        assert (saved.thinking, saved.content) == (expected["thinking"], expected["content"])

    store = ChatStore(tmp_path / DB_NAME)
    chat = next(c for c in store.list_chats() if c.id == chat_id)
    store.close()
    assert chat.think is True
    assert chat.messages[-1].thinking == expected["thinking"]
    # sent back with the history (Ollama's CLI does the same)
    assert chat.request_messages()[-1]["thinking"] == expected["thinking"]

    # after a restart: the answer with its reasoning folded above it
    again = make_app(daemon, tmp_path)
    async with again.run_test(size=(100, 30)) as pilot:
        await connected(pilot, again)
        screen = again.screen
        assert isinstance(screen, ChatScreen)
        view = last_answer(screen)
        assert view.thinking == expected["thinking"] and view.text == expected["content"]
        assert view.thinking_view is not None
        await wait_for(pilot, lambda: _folded(view.thinking_view), "folded reasoning")


@pytest.mark.slow
@pytest.mark.anyio
async def test_default_off_and_a_model_that_cannot_think(daemon: Daemon, tmp_path: Path) -> None:
    _open_chat(tmp_path, THINKER)
    app = make_app(daemon, tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await connected(pilot, app)
        screen = app.screen
        assert isinstance(screen, ChatScreen) and screen.current is not None
        chat = screen.current

        # the model's default (nothing sent): this template reasons, and here nothing else
        assert chat.think is None
        assert await screen.send(PROMPT)
        await wait_for(pilot, lambda: not screen.answering, "the first answer")
        answer = last_answer(screen)
        assert answer.thinking.strip() and answer.text == ""
        assert answer.thinking_view is not None and not answer.thinking_view.collapsed

        # off: an answer and no box
        chat.think = False
        assert await screen.send(PROMPT)
        await wait_for(pilot, lambda: not screen.answering, "the second answer")
        answer = last_answer(screen)
        assert answer.text.strip() and answer.thinking_view is None
        assert chat.messages[-1].thinking == ""

        # a model that cannot reason: the daemon's refusal, under the answer and in a notice
        chat.model, chat.think = PLAIN, "high"
        saved = len(chat.messages)
        assert await screen.send(PROMPT)
        await wait_for(pilot, lambda: not screen.answering, "the refusal")
        refused = last_answer(screen)
        assert refused.stats is not None
        assert f'"{PLAIN}" does not support thinking' in refused.stats["error"]
        assert len(chat.messages) == saved + 1  # the question only
        views = list(screen.transcript().query(MessageView))
        assert views[-1] is refused and refused.thinking_view is None


# The tables as the first version of the chat store wrote them (no think, no thinking).
_VERSION_1 = """
CREATE TABLE chats (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    model TEXT,
    system TEXT NOT NULL DEFAULT '',
    options TEXT NOT NULL DEFAULT '{}',
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE messages (
    id INTEGER PRIMARY KEY,
    chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    stats TEXT,
    created REAL NOT NULL
);
CREATE INDEX messages_by_chat ON messages(chat_id, id);
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
PRAGMA user_version = 1;
INSERT INTO chats VALUES (1, 'Old chat', 'm:1', '', '{"temperature": 0.5}', 1.0, 1.0);
INSERT INTO messages VALUES (1, 1, 'user', 'Hi', NULL, 1.0);
INSERT INTO messages VALUES (2, 1, 'assistant', 'Hello', '{"eval_count": 3}', 1.0);
"""


def test_a_chat_database_from_before_thinking_opens_and_gains_it(tmp_path: Path) -> None:
    path = tmp_path / DB_NAME
    with sqlite3.connect(path) as db:
        db.executescript(_VERSION_1)
    db.close()

    store = ChatStore(path)
    [chat] = store.list_chats()
    assert (chat.title, chat.options, chat.think) == ("Old chat", {"temperature": 0.5}, None)
    assert [(m.content, m.thinking) for m in chat.messages] == [("Hi", ""), ("Hello", "")]
    chat.think = "low"
    store.update_chat(chat)
    store.add_message(chat.id, StoredMessage("assistant", "Sure.", None, thinking="Hmm."))
    store.close()
    # opened twice: the migration ran once and is not run again
    again = ChatStore(path)
    [chat] = again.list_chats()
    assert chat.think == "low" and chat.messages[-1].thinking == "Hmm."
    assert again._run("PRAGMA user_version")[1] == [(5,)]  # 4: tool calls, MCP; 5: branches
    again.close()


def test_think_settings_round_trip(tmp_path: Path) -> None:
    store = ChatStore(tmp_path / DB_NAME)
    made = [store.create_chat(str(think), think=think) for think in (None, False, True, "high")]
    store.close()
    again = ChatStore(tmp_path / DB_NAME)
    assert [c.think for c in again.list_chats()] == [c.think for c in made]
    again.close()
