"""The TUI chat's prompt library, search and export against a real daemon (the starter
SmolLM2): saved system prompts created, edited, renamed, deleted and picked for a chat
(Ctrl+S), found again by the CLI; every chat's text searched (Ctrl+F and ``/search``) and a
hit opened on its branch; the branch on screen exported to Markdown and to OpenAI's messages
(F10 and ``/export``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_daemon_support import Daemon, running_daemon
from test_tui import SMOL
from test_tui_branches import footer, help_text, open_chat
from test_tui_support import make_app, screen_text, wait_for
from textual.app import App
from textual.widgets import Input, Label, OptionList, Select, TextArea

from localllm.chats import export_chat
from localllm.tui.chats import DB_NAME, ChatStore, StoredMessage
from localllm.tui.screens.chat import ChatScreen
from localllm.tui.screens.dialogs import ConfirmDialog
from localllm.tui.screens.find import ExportDialog, SearchDialog
from localllm.tui.screens.help import HelpScreen
from localllm.tui.screens.library import PromptLibrary
from localllm.tui.widgets.message import MessageView
from localllm.tui.widgets.prompt import PromptArea

pytestmark = [pytest.mark.slow, pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    """Textual runs on asyncio."""
    return "asyncio"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon for the module, with the starter model."""
    home = tmp_path_factory.mktemp("tui-library") / "home"
    with running_daemon(home, num_parallel=1, num_threads=1) as d:
        yield d


def notified(app: App[None], text: str) -> bool:
    """Whether a notification (a toast) says ``text``."""
    return any(text in str(notification.message) for notification in app._notifications)


async def test_the_prompt_library_create_edit_delete_pick(daemon: Daemon, tmp_path: Path) -> None:
    chat_id = open_chat(tmp_path)
    app = make_app(daemon, tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = app.screen
        assert isinstance(screen, ChatScreen)
        await wait_for(pilot, lambda: screen.current is not None, "the chat")
        await wait_for(pilot, lambda: "Prompts" in footer(app), "Prompts in the footer")
        await pilot.press("ctrl+s")
        library = await wait_for(
            pilot, lambda: isinstance(app.screen, PromptLibrary) and app.screen, "the library"
        )
        keys = {"Save", "New prompt", "Delete", "Use for this chat"}
        await wait_for(pilot, lambda: keys <= set(footer(app)), "the library's keys in its footer")

        # create two
        await pilot.press(*"pirate", "tab", *"Talk like a pirate.", "ctrl+s")
        await wait_for(pilot, lambda: [p.name for p in library.prompts] == ["pirate"], "saved")
        await pilot.press("ctrl+n", *"brief", "tab", *"Be brief.", "ctrl+s")
        await wait_for(pilot, lambda: len(library.prompts) == 2, "the second prompt")
        listing = library.query_one("#prompt-list", OptionList)
        assert [str(listing.get_option_at_index(i).prompt) for i in range(2)] == [
            "brief",
            "pirate",
        ]

        # an empty prompt is refused, saying why
        await pilot.press("ctrl+n", *"empty", "ctrl+s")
        assert "empty" in str(library.query_one("#library-error", Label).content)
        assert len(library.prompts) == 2

        # edit and rename "brief"
        listing.focus()
        listing.highlighted = 0
        await wait_for(pilot, lambda: library.editing == "brief", "brief in the editor")
        library.query_one("#prompt-name", Input).value = "terse"
        library.query_one("#prompt-text", TextArea).text = "One line only."
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: "terse" in [p.name for p in library.prompts], "renamed")
        store = app.chats
        assert [(p.name, p.text) for p in store.list_prompts()] == [
            ("pirate", "Talk like a pirate."),
            ("terse", "One line only."),
        ]

        # delete it (asked first)
        await pilot.press("f8")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the question")
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(library.prompts) == 1, "the deletion")
        assert [p.name for p in store.list_prompts()] == ["pirate"]

        # pick "pirate" for the chat
        listing.highlighted = 0
        await wait_for(pilot, lambda: library.editing == "pirate", "pirate in the editor")
        await pilot.press("ctrl+o")
        await wait_for(pilot, lambda: app.screen is screen, "the library to close")
        assert screen.current is not None and screen.current.system == "Talk like a pirate."
        assert screen.current.request_messages()[0] == {
            "role": "system",
            "content": "Talk like a pirate.",
        }
        assert "system prompt" in screen_text(app)

        # its keys are in the help
        await pilot.press("f1")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), "the help")
        assert "Use for this chat" in help_text(app)

    saved = ChatStore(tmp_path / DB_NAME)
    assert next(c for c in saved.list_chats() if c.id == chat_id).system == "Talk like a pirate."
    saved.close()


def _two_chats(data: Path) -> tuple[int, int, int]:
    """A branched chat (the second answer on screen) and another one, open; the ids of the
    branched chat, of its first answer and of its question."""
    store = ChatStore(data / DB_NAME)
    tides = store.create_chat("Tides", SMOL, "Be brief.")
    question = store.add_message(tides.id, StoredMessage("user", "Why are there tides?"))
    moon = store.add_message(tides.id, StoredMessage("assistant", "The Moon pulls the sea."))
    store.add_message(tides.id, StoredMessage("assistant", "Gravity."), parent=question.id)
    other = store.create_chat("Other", SMOL)
    store.add_message(other.id, StoredMessage("user", "Nothing to see"))
    store.set_meta("current_chat", str(other.id))
    store.close()
    assert moon.id is not None and question.id is not None
    return tides.id, moon.id, question.id


async def test_search_opens_a_hit_on_its_branch(daemon: Daemon, tmp_path: Path) -> None:
    tides_id, moon_id, question_id = _two_chats(tmp_path)
    app = make_app(daemon, tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = app.screen
        assert isinstance(screen, ChatScreen)
        await wait_for(pilot, lambda: screen.current is not None, "the chat")
        assert screen.current is not None and screen.current.title == "Other"
        await wait_for(pilot, lambda: "Search" in footer(app), "Search in the footer")

        await pilot.press("ctrl+f")
        dialog = await wait_for(
            pilot, lambda: isinstance(app.screen, SearchDialog) and app.screen, "search"
        )
        await pilot.press(*"MOON")  # any case, on a branch not on screen
        await wait_for(pilot, lambda: dialog.hits, "the hits")
        assert [hit.message_id for hit in dialog.hits] == [moon_id]
        assert "Tides" in screen_text(app) and "The Moon pulls the sea." in screen_text(app)
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.screen is screen, "the dialog to close")
        chat = screen.current
        assert chat is not None and chat.id == tides_id
        assert [m.id for m in chat.messages] == [question_id, moon_id]  # its branch shown
        picked = screen.transcript().query(MessageView).filter(".-selected")
        assert [view.message_id for view in picked] == [moon_id]
        assert picked.first().heading == f"{SMOL}  ‹ 1/2 ›"

        # /search TEXT opens the dialog with the hits; nothing found is said
        await pilot.press(*"/search zebra", "enter")
        dialog = await wait_for(
            pilot, lambda: isinstance(app.screen, SearchDialog) and app.screen, "/search"
        )
        await wait_for(pilot, lambda: "Nothing found" in screen_text(app), "no hits")
        assert dialog.hits == []
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is screen, "the dialog to close")
        assert screen.query_one(PromptArea).text == ""  # the command is not sent to the model
        assert len(chat.all_messages()) == 3


async def test_export_markdown_and_openai_json(daemon: Daemon, tmp_path: Path) -> None:
    tides_id, _, _ = _two_chats(tmp_path)
    store = ChatStore(tmp_path / DB_NAME)
    store.set_meta("current_chat", str(tides_id))
    store.close()
    out = tmp_path / "out"
    out.mkdir()
    app = make_app(daemon, tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = app.screen
        assert isinstance(screen, ChatScreen)
        await wait_for(pilot, lambda: screen.current is not None, "the chat")
        chat = screen.current
        assert chat is not None
        await wait_for(pilot, lambda: "Export" in footer(app), "Export in the footer")

        # F10: JSON in OpenAI's shape, where the dialog is told
        await pilot.press("f10")
        dialog = await wait_for(
            pilot, lambda: isinstance(app.screen, ExportDialog) and app.screen, "export"
        )
        path_box = dialog.query_one("#path", Input)
        assert path_box.value.endswith(f"chat-{tides_id}-tides.md")
        dialog.query_one("#format", Select).value = "json"
        await wait_for(pilot, lambda: path_box.value.endswith(".json"), "the .json path")
        path_box.value = str(out / "tides.json")
        path_box.focus()
        await pilot.press("enter")
        await wait_for(pilot, lambda: (out / "tides.json").exists(), "the JSON file")
        assert json.loads((out / "tides.json").read_text()) == {
            "model": SMOL,
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Why are there tides?"},
                {"role": "assistant", "content": "Gravity."},
            ],
        }

        # /export md PATH: the same branch as Markdown, no dialog (the long paths are put in
        # the box at once: typed, they took 10 s of key presses; "/export html" is typed)
        prompt = screen.query_one(PromptArea)
        prompt.insert(f"/export md {out / 'tides.md'}")
        await pilot.press("enter")
        await wait_for(pilot, lambda: (out / "tides.md").exists(), "the Markdown file")
        assert (out / "tides.md").read_text() == export_chat(chat, "md")
        assert "Gravity." in (out / "tides.md").read_text()

        # a format it does not write, and a path it cannot write: said, nothing written
        await pilot.press(*"/export html", "enter")
        await wait_for(pilot, lambda: notified(app, "Usage: /export"), "the usage")
        screen.query_one(PromptArea).clear()
        prompt.insert(f"/export json {out / 'missing' / 'x.json'}")
        await pilot.press("enter")
        await wait_for(pilot, lambda: notified(app, "Cannot write"), "the error")
        assert sorted(p.name for p in out.iterdir()) == ["tides.json", "tides.md"]
        assert len(chat.all_messages()) == 3  # no command went to the model
