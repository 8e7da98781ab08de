"""The chat database behind the TUI's branches, prompt library, search and export: the
migration of today's (version 4) database, the tree of messages, the library, search and the
two export forms. No daemon: these are the store's own rules."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from localllm.chats import (
    DB_NAME,
    Attachment,
    ChatNotFoundError,
    ChatStore,
    PromptNameError,
    PromptNotFoundError,
    StoredMessage,
    export_chat,
    to_openai,
)

# The schema version 4 wrote (chats.py before branches), with two chats in it: one with a
# tool call and its result, an image and reasoning; one empty.
_VERSION_4 = """
CREATE TABLE chats (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    model TEXT,
    system TEXT NOT NULL DEFAULT '',
    options TEXT NOT NULL DEFAULT '{}',
    created REAL NOT NULL,
    updated REAL NOT NULL
, think TEXT, tools TEXT NOT NULL DEFAULT '{}');
CREATE TABLE messages (
    id INTEGER PRIMARY KEY,
    chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    stats TEXT,
    created REAL NOT NULL
, thinking TEXT NOT NULL DEFAULT '', images TEXT NOT NULL DEFAULT '[]', tool TEXT);
CREATE INDEX messages_by_chat ON messages(chat_id, id);
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
PRAGMA user_version = 4;
INSERT INTO chats VALUES (1, 'Weather', 'm:1', 'Be brief.', '{"temperature": 0.5}', 1.0, 1.0,
    'true', '{"servers": ["w"]}');
INSERT INTO chats VALUES (2, 'Empty', 'm:2', '', '{}', 2.0, 2.0, NULL, '{}');
INSERT INTO messages VALUES (1, 1, 'user', 'Rain in Oslo?', NULL, 1.0, '',
    '[{"name": "sky.png", "data": "iVBORw0KGgo="}]', NULL);
INSERT INTO messages VALUES (2, 1, 'assistant', '', '{"eval_count": 3}', 1.0, 'Ask the tool.',
    '[]', '{"calls": [{"function": {"name": "w__rain", "arguments": {"city": "Oslo"}}}]}');
INSERT INTO messages VALUES (3, 1, 'tool', '12 mm', NULL, 1.0, '', '[]',
    '{"call_id": "c1", "name": "w__rain", "server": "w", "tool": "rain"}');
INSERT INTO messages VALUES (4, 1, 'assistant', 'Yes: 12 mm.', '{"eval_count": 5}', 1.0, '',
    '[]', NULL);
INSERT INTO meta VALUES ('current_chat', '1');
"""


def _old_database(path: Path) -> None:
    with sqlite3.connect(path) as db:
        db.executescript(_VERSION_4)
    db.close()


def test_todays_database_migrates_without_losing_a_message(tmp_path: Path) -> None:
    path = tmp_path / DB_NAME
    _old_database(path)
    before = sqlite3.connect(path).execute("SELECT * FROM messages ORDER BY id").fetchall()

    store = ChatStore(path)
    weather, empty = store.list_chats()
    assert [m.id for m in weather.messages] == [1, 2, 3, 4]
    assert [m.parent for m in weather.messages] == [None, 1, 2, 3]  # one branch, in order
    assert weather.others == [] and empty.messages == [] and empty.head is None
    assert weather.messages[0].images == [Attachment("sky.png", "iVBORw0KGgo=")]
    assert weather.messages[1].thinking == "Ask the tool." and weather.messages[1].tool
    assert (weather.think, weather.tools) == (True, {"servers": ["w"]})
    assert weather.request_messages()[0] == {"role": "system", "content": "Be brief."}
    assert store.get_meta("current_chat") == "1"
    # a new message goes on the end of the old branch
    store.add_message(weather.id, StoredMessage("user", "And tomorrow?"))
    store.close()

    again = ChatStore(path)
    assert again._run("PRAGMA user_version")[1] == [(5,)]
    weather, _ = again.list_chats()
    assert [m.content for m in weather.messages][-2:] == ["Yes: 12 mm.", "And tomorrow?"]
    assert weather.messages[-1].parent == 4
    # every old column of every old row is still there, unchanged
    after = again._db.execute(
        "SELECT id, chat_id, role, content, stats, created, thinking, images, tool "
        "FROM messages WHERE id <= 4 ORDER BY id"
    ).fetchall()
    assert after == before
    again.close()


def test_regenerated_and_edited_messages_are_branches_kept_across_restarts(
    tmp_path: Path,
) -> None:
    store = ChatStore(tmp_path / DB_NAME)
    chat = store.create_chat("Tree", "m:1")
    q1 = store.add_message(chat.id, StoredMessage("user", "Q1"))
    a1 = store.add_message(chat.id, StoredMessage("assistant", "A1"))
    # regenerate: a second answer to Q1
    a1b = store.add_message(chat.id, StoredMessage("assistant", "A1b"), parent=q1.id)
    q2 = store.add_message(chat.id, StoredMessage("user", "Q2"))
    # edit Q1: a new first question beside it
    q1e = store.add_message(chat.id, StoredMessage("user", "Q1 edited"), parent=None)
    store.close()

    store = ChatStore(tmp_path / DB_NAME)
    [chat] = store.list_chats()
    assert [m.content for m in chat.messages] == ["Q1 edited"]
    assert chat.branch_label(chat.messages[0]) == "2/2"
    first = chat.siblings(chat.messages[0])[0]
    assert first.id == q1.id
    # back to the first question: the newest branch under it (A1b, then Q2)
    chat.show_branch(chat.leaf_under(first).id)
    assert [m.content for m in chat.messages] == ["Q1", "A1b", "Q2"]
    assert chat.branch_label(chat.messages[1]) == "2/2"
    chat.show_branch(chat.leaf_under(chat.siblings(chat.messages[1])[0]).id)
    assert [m.id for m in chat.messages] == [q1.id, a1.id]
    assert {m.id for m in chat.others} == {a1b.id, q2.id, q1e.id}
    store.set_head(chat.id, chat.head)
    store.close()

    store = ChatStore(tmp_path / DB_NAME)
    [chat] = store.list_chats()
    assert [m.content for m in chat.messages] == ["Q1", "A1"]
    assert chat.branch_label(chat.messages[1]) == "1/2" and chat.branch_label(chat.messages[0])
    store.close()


def test_the_prompt_library(tmp_path: Path) -> None:
    store = ChatStore(tmp_path / DB_NAME)
    store.save_prompt("pirate", "Talk like a pirate.")
    store.save_prompt("Brief", "Answer in one line.")
    assert [p.name for p in store.list_prompts()] == ["Brief", "pirate"]
    store.save_prompt("pirate", "Arr.")  # the same name: replaced
    store.save_prompt("terse", "One word.", old_name="Brief")  # renamed
    assert [(p.name, p.text) for p in store.list_prompts()] == [
        ("pirate", "Arr."),
        ("terse", "One word."),
    ]
    with pytest.raises(PromptNameError):
        store.save_prompt("  ", "x")
    store.delete_prompt("pirate")
    with pytest.raises(PromptNotFoundError, match=r"pirate.*saved: terse"):
        store.get_prompt("pirate")
    store.close()
    assert ChatStore(tmp_path / DB_NAME).get_prompt("terse").text == "One word."


def test_search_finds_every_branch_and_takes_text_literally(tmp_path: Path) -> None:
    store = ChatStore(tmp_path / DB_NAME)
    one = store.create_chat("One")
    two = store.create_chat("Two")
    q = store.add_message(one.id, StoredMessage("user", "What is 100% of the tide?"))
    store.add_message(one.id, StoredMessage("assistant", "All of the TIDE."))
    old = store.add_message(one.id, StoredMessage("assistant", "the tide_pool"), parent=q.id)
    store.add_message(two.id, StoredMessage("user", "no match here " * 20))
    hits = store.search("tide")
    assert [h.message_id for h in hits] == [old.id, old.id - 1, q.id]  # newest first
    assert {h.chat_id for h in hits} == {one.id} and hits[0].title == "One"
    assert [h.message_id for h in store.search("100%")] == [q.id]
    assert [h.message_id for h in store.search("e_p")] == [old.id]  # "_" is no wildcard
    assert store.search("   ") == []
    long = store.search("match")[0].snippet
    assert "match" in long and len(long) < 100
    store.close()


def test_export_the_branch_on_screen(tmp_path: Path) -> None:
    path = tmp_path / DB_NAME
    _old_database(path)
    store = ChatStore(path)
    store.add_message(1, StoredMessage("assistant", "Other answer"), parent=1)
    chat = store.chat(1)
    assert [m.content for m in chat.messages] == ["Rain in Oslo?", "Other answer"]
    chat.show_branch(4)
    shaped = to_openai(chat)
    assert shaped["model"] == "m:1"
    assert shaped["messages"] == [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Rain in Oslo?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            ],
        },
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": "w__rain", "arguments": json.dumps({"city": "Oslo"})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "12 mm"},
        {"role": "assistant", "content": "Yes: 12 mm."},
    ]
    assert json.loads(export_chat(chat, "json")) == shaped
    markdown = export_chat(chat, "md")
    assert markdown.startswith("# Weather\n") and "## System prompt\n\nBe brief." in markdown
    assert "## You\n\n*Image: sky.png*\nRain in Oslo?" in markdown
    assert "## m:1\n\nYes: 12 mm." in markdown and "Other answer" not in markdown
    with pytest.raises(ValueError, match="md, json"):
        export_chat(chat, "html")
    with pytest.raises(ChatNotFoundError, match="no chat 9"):
        store.chat(9)
    store.close()


def test_the_labels_of_a_transcript_agree_with_each_message_s(tmp_path: Path) -> None:
    store = ChatStore(tmp_path / DB_NAME)
    chat = store.create_chat("Many")
    ids: list[int | None] = [None]
    for i in range(60):  # every message under an earlier one: many branches, some deep
        parent = ids[(i * 7) % len(ids)]
        saved = store.add_message(chat.id, StoredMessage("user", str(i)), parent=parent)
        ids.append(saved.id)
    [chat] = store.list_chats()
    for head in ids[1:]:
        chat.show_branch(head)
        labels = chat.branch_labels()
        assert {m.id: chat.branch_label(m) for m in chat.messages if chat.branch_label(m)} == labels
    assert any(labels.values())
    store.close()
