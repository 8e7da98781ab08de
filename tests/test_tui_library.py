"""The TUI chat's prompt library, search and export against a real daemon (the starter
SmolLM2): saved system prompts created, edited, renamed, deleted and picked for a chat
(Ctrl+S), found again by the CLI; every chat's text searched (Ctrl+F and ``/search``) and a
hit opened on its branch; the branch on screen exported to Markdown and to OpenAI's messages
(F10 and ``/export``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from test_daemon_support import Daemon, running_daemon
from test_tui_branches import footer, open_chat
from test_tui_support import make_app, screen_text, wait_for
from textual.widgets import Input, Label, OptionList, TextArea

from localllm.tui.chats import DB_NAME, ChatStore
from localllm.tui.screens.chat import ChatScreen
from localllm.tui.screens.dialogs import ConfirmDialog
from localllm.tui.screens.help import HelpScreen
from localllm.tui.screens.library import PromptLibrary

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


async def test_the_prompt_library_create_edit_delete_pick(daemon: Daemon, tmp_path: Path) -> None:
    chat_id = open_chat(tmp_path)
    app = make_app(daemon, tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = app.screen
        assert isinstance(screen, ChatScreen)
        await wait_for(pilot, lambda: screen.current is not None, "the chat")
        assert "Prompts" in footer(app)
        await pilot.press("ctrl+s")
        library = await wait_for(
            pilot, lambda: isinstance(app.screen, PromptLibrary) and app.screen, "the library"
        )
        assert {"Save", "New prompt", "Delete", "Use for this chat"} <= set(footer(app))

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
        await pilot.press("end")
        assert "Use for this chat" in screen_text(app)

    saved = ChatStore(tmp_path / DB_NAME)
    assert next(c for c in saved.list_chats() if c.id == chat_id).system == "Talk like a pirate."
    saved.close()
