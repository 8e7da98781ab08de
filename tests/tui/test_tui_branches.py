"""Branches in the TUI chat against a real daemon (the starter SmolLM2): regenerate keeps
both answers (the header says ``2/2``, Alt+Left/Right switch, the conversation goes on from
the branch on screen), editing an earlier question forks the chat there with the old branch
kept and reachable, and all of it is there again after a restart.

Nothing asserts what the model says: what is shown is compared with what was saved."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from test_daemon_support import Daemon, running_daemon
from test_tui import SMOL, connected, last_answer
from test_tui_support import make_app, screen_text, wait_for
from textual.app import App
from textual.widgets._footer import FooterKey

from localllm.tui.chats import DB_NAME, ChatStore
from localllm.tui.screens.chat import ChatScreen
from localllm.tui.screens.help import HelpScreen
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
    home = tmp_path_factory.mktemp("tui-branches") / "home"
    with running_daemon(home, num_parallel=2, num_threads=1) as d:
        yield d


def open_chat(data: Path, **options: object) -> int:
    """A new chat with the starter model and short answers, the one the app opens on."""
    store = ChatStore(data / DB_NAME)
    chat = store.create_chat("New chat", SMOL, options={"num_predict": 6, **options})
    store.set_meta("current_chat", str(chat.id))
    store.close()
    return chat.id


async def answered(pilot, screen: ChatScreen, saved: int) -> None:  # type: ignore[no-untyped-def]
    """Wait until the chat has ``saved`` messages and no answer streams (an answer from the
    cache may come and go between two looks at the screen)."""
    chat = screen.current
    assert chat is not None
    await wait_for(
        pilot,
        lambda: len(chat.all_messages()) >= saved and not screen.answering,
        f"{saved} messages saved",
    )


def headings(screen: ChatScreen) -> list[str]:
    """The author lines of the transcript on screen."""
    return [view.heading for view in screen.transcript().query(MessageView)]


def footer(app: App[None]) -> list[str]:
    """What the footer offers now."""
    return [key.description for key in app.screen.query(FooterKey)]


def help_text(app: App[None]) -> str:
    """Everything the help lists, its pages below the first included."""
    import io

    from rich.console import Console
    from textual.widgets import Static

    console = Console(width=100, file=io.StringIO(), record=True)
    console.print(app.screen.query_one("#help-body", Static).content)
    return console.export_text()


def shown(screen: ChatScreen) -> list[str]:
    """The texts of the transcript on screen."""
    return [view.text for view in screen.transcript().query(MessageView)]


async def test_regenerate_switch_edit_and_fork_persist(daemon: Daemon, tmp_path: Path) -> None:
    chat_id = open_chat(tmp_path, temperature=1.5, seed=-1)
    app = make_app(daemon, tmp_path)
    async with app.run_test(size=(110, 36)) as pilot:
        await connected(pilot, app)
        screen = app.screen
        assert isinstance(screen, ChatScreen) and screen.current is not None
        chat = screen.current
        await wait_for(pilot, lambda: "New" in footer(app), "the footer")
        assert "Regenerate" not in footer(app)  # nothing to regenerate yet

        await pilot.press(*"Hi", "enter")
        await answered(pilot, screen, 2)
        first = chat.messages[-1]
        await wait_for(pilot, lambda: "Regenerate" in footer(app), "Regenerate in the footer")
        assert "Edit" in footer(app) and "Branch ▶" not in footer(app)

        # Regenerate: a second answer beside the first, on screen as 2/2
        await pilot.press("ctrl+r")
        await answered(pilot, screen, 3)
        question, second = chat.messages
        assert second.id != first.id and second.parent == first.parent == question.id
        assert [m.id for m in chat.others] == [first.id]
        assert headings(screen) == ["You", f"{SMOL}  ‹ 2/2 ›"]
        assert shown(screen) == ["Hi", second.content]
        assert "2/2" in screen_text(app)
        await wait_for(pilot, lambda: "Branch ▶" in footer(app), "the branch keys in the footer")

        # Alt+Left: the first answer; Alt+Right: back to the second
        await pilot.press("alt+left")
        await wait_for(pilot, lambda: chat.messages[-1].id == first.id, "the first answer")
        assert headings(screen)[-1] == f"{SMOL}  ‹ 1/2 ›"
        assert last_answer(screen).text == first.content
        await pilot.press("alt+left")  # no earlier branch: nothing changes
        assert chat.messages[-1].id == first.id
        await pilot.press("alt+right")
        await wait_for(pilot, lambda: chat.messages[-1].id == second.id, "the second answer")

        # the conversation goes on from the branch on screen
        await pilot.press(*"More", "enter")
        await answered(pilot, screen, 5)
        assert [m.content for m in chat.messages[:3]] == ["Hi", second.content, "More"]
        assert chat.request_messages()[1]["content"] == second.content
        before_edit = [m.id for m in chat.messages]

        # Edit the first question (picked with Alt+Up from the bottom): the chat forks there
        await pilot.press("alt+up", "alt+up", "alt+up", "alt+up")
        picked = screen.transcript().query(MessageView).filter(".-selected")
        assert [view.message_id for view in picked] == [question.id]
        await pilot.press("ctrl+b")
        prompt = screen.query_one(PromptArea)
        assert prompt.text == "Hi" and "Editing" in screen_text(app)
        prompt.clear()
        await pilot.press(*"Hello", "enter")
        await answered(pilot, screen, 7)
        edited = chat.messages[0]
        assert [m.content for m in chat.messages][:1] == ["Hello"] and len(chat.messages) == 2
        assert edited.parent is None and edited.id not in before_edit
        assert headings(screen)[0] == "You  ‹ 2/2 ›"
        assert {m.id for m in chat.others} >= set(before_edit)  # the old branch is kept

        # the old branch is reachable: pick the edited question, Alt+Left
        await pilot.press("alt+up", "alt+up", "alt+left")
        await wait_for(pilot, lambda: chat.messages[0].id == question.id, "the old branch")
        assert [m.id for m in chat.messages] == before_edit  # as it was, down to its end
        assert headings(screen)[0] == "You  ‹ 1/2 ›"
        assert shown(screen)[:3] == ["Hi", second.content, "More"]

        # every key is in the help
        await pilot.press("f1")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), "the help")
        helped = help_text(app)
        for description in ("Regenerate", "Edit", "Branch ◀", "Branch ▶", "Pick message above"):
            assert description in helped, description
        await pilot.press("escape")

    # after a restart: the same branch on screen, both branches there
    again = make_app(daemon, tmp_path)
    async with again.run_test(size=(110, 36)) as pilot:
        await connected(pilot, again)
        screen = again.screen
        assert isinstance(screen, ChatScreen) and screen.current is not None
        assert screen.current.id == chat_id
        assert [m.id for m in screen.current.messages] == before_edit
        await wait_for(pilot, lambda: headings(screen)[:2], "the transcript")
        assert headings(screen)[:2] == ["You  ‹ 1/2 ›", f"{SMOL}  ‹ 2/2 ›"]
        await pilot.press("alt+up", "alt+up", "alt+up", "alt+up", "alt+right")
        await wait_for(pilot, lambda: screen.current.messages[0].id == edited.id, "the edit")
        assert shown(screen)[0] == "Hello"
