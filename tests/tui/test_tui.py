"""The terminal UI against a real daemon (bundled SmolLM2, a loopback registry): chat with
streamed answers and their stats, stop, persistence, the models screen (pull with progress,
copy, quantize, delete) and the live dashboard."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from fakes.helpers import registry_config, registry_layers
from fakes.ollama_registry import FakeRegistry
from test_daemon_support import Daemon, running_daemon
from test_tui_support import make_app, screen_text, wait_for
from textual.binding import Binding
from textual.widgets import DataTable, Input, Select
from tiny_gguf import write_tiny_gguf

from localllm.client import AsyncClient
from localllm.tui.app import LocalLLMApp
from localllm.tui.chats import DB_NAME, ChatStore
from localllm.tui.screens.chat import ChatScreen
from localllm.tui.screens.dashboard import DashboardScreen
from localllm.tui.screens.dialogs import (
    ChatOptionsDialog,
    ConfirmDialog,
    NameDialog,
    QuantizeDialog,
)
from localllm.tui.screens.help import HelpScreen
from localllm.tui.screens.models import ModelsScreen
from localllm.tui.widgets.loaded_model import LoadedModelCard
from localllm.tui.widgets.message import MessageView
from localllm.tui.widgets.prompt import PromptArea

SMOL = "smollm2:135m"

pytestmark = [pytest.mark.slow, pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    """Textual runs on asyncio."""
    return "asyncio"


@pytest.fixture(scope="module")
def other_gguf(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """Another tiny model (other weights, so other blobs than ``tiny``)."""
    return write_tiny_gguf(
        tmp_path_factory.mktemp("tui-models") / "other.gguf", seed=7
    ).read_bytes()


@pytest.fixture(scope="module")
def registry(tiny_gguf: Path, other_gguf: bytes) -> Iterator[FakeRegistry]:
    """A loopback registry serving ``tiny:latest`` and ``slow:latest`` (tiny GGUFs)."""
    with FakeRegistry() as server:
        config = registry_config("F32")
        server.add_model("library/tiny", "latest", config, registry_layers(tiny_gguf.read_bytes()))
        server.add_model("library/slow", "latest", config, registry_layers(other_gguf))
        yield server


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, registry: FakeRegistry) -> Iterator[Daemon]:
    """One daemon for the module, pulling plain names from the loopback registry."""
    home = tmp_path_factory.mktemp("tui") / "home"
    with running_daemon(home, num_parallel=2, num_threads=1, registry=registry.url) as d:
        yield d


@pytest.fixture
async def client(daemon: Daemon) -> AsyncIterator[AsyncClient]:
    """Another client of the daemon, as an editor or the CLI would be."""
    async with AsyncClient(daemon.settings) as c:
        yield c


async def connected(pilot, app: LocalLLMApp) -> None:  # type: ignore[no-untyped-def]
    """Wait until the app reaches the daemon and the chat screen has listed its models."""
    await wait_for(pilot, lambda: app.connection == "connected", "the connection")
    if isinstance(app.screen, ChatScreen):
        screen = app.screen
        await wait_for(pilot, lambda: screen.models, "the model list")


def last_answer(screen: ChatScreen) -> MessageView:
    """The newest answer of the current chat."""
    return list(screen.transcript().query(MessageView).filter(".assistant"))[-1]


# -- chat -----------------------------------------------------------------------------------


async def test_send_a_message_and_see_the_streamed_answer_with_its_stats(
    daemon: Daemon, tmp_path: Path
) -> None:
    app = make_app(daemon, tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await connected(pilot, app)
        screen = app.screen
        assert isinstance(screen, ChatScreen)
        assert screen.current is not None and screen.current.model == SMOL

        # Options through the dialog: short, greedy answers.
        await pilot.press("ctrl+o")
        dialog = await wait_for(
            pilot, lambda: isinstance(app.screen, ChatOptionsDialog) and app.screen, "options"
        )
        dialog.query_one("#temperature", Input).value = "0"
        dialog.query_one("#num_predict", Input).value = "12"
        await pilot.click("#save")
        await wait_for(pilot, lambda: app.screen is screen, "the dialog to close")
        assert screen.current.options == {"temperature": 0.0, "num_predict": 12}

        # Ctrl+J is a newline, not a send.
        await pilot.press("a", "ctrl+j", "b")
        prompt = screen.query_one(PromptArea)
        assert prompt.text == "a\nb"
        prompt.clear()

        # A question with a long answer, so the 12-token limit is what ends it.
        await pilot.press(*"Write a long poem about the sea", "enter")
        assert prompt.text == ""
        # Not a wait for `answering` to turn on: 12 tokens can come and go between two looks.
        await wait_for(
            pilot,
            lambda: not screen.answering and len(screen.current.messages) == 2,
            "the answer to end",
        )

        answer = last_answer(screen)
        assert answer.stats is not None and answer.stats["eval_count"] == 12
        assert answer.stats["done_reason"] == "length"
        assert answer.streamed_chunks > 1, "the answer came in one piece, not streamed"
        assert answer.text.strip() and answer.text == screen.current.messages[-1].content
        for part in ("TTFT", "prefill", "decode", "cached", "12 tokens"):
            assert part in answer.stats_text
        shown = screen_text(app)
        assert "TTFT" in shown and "You" in shown
        assert screen.current.title == "Write a long poem about the sea"

        await pilot.press("f5")
        assert app.clipboard == answer.text


async def long_answer_started(pilot, app: LocalLLMApp) -> tuple[ChatScreen, MessageView]:  # type: ignore[no-untyped-def]
    """Ask for a long answer and wait for its first words."""
    await connected(pilot, app)
    screen = app.screen
    assert isinstance(screen, ChatScreen) and screen.current is not None
    screen.current.options = {"temperature": 0, "num_predict": 2000}
    assert await screen.send("Write a very long story about a dragon and a knight.")
    answer = last_answer(screen)
    await wait_for(pilot, lambda: answer.streamed_chunks > 0, "the first words")
    return screen, answer


async def test_escape_stops_the_answer(daemon: Daemon, tmp_path: Path, client: AsyncClient) -> None:
    app = make_app(daemon, tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        screen, answer = await long_answer_started(pilot, app)
        await pilot.press("escape")
        await wait_for(pilot, lambda: not screen.answering, "the answer to stop")

        assert answer.stats == {"done_reason": "stopped"}
        assert answer.stats_text == "stopped"
        assert answer.text, "what came before Esc is kept"
        assert screen.current.messages[-1].content == answer.text
        # Leaving the stream cancelled the request in the daemon: its slot frees up.
        for _ in range(600):
            models = (await client.stats())["models"]
            if all(m["active_requests"] == 0 for m in models):
                break
            await pilot.pause(0.05)
        assert all(m["active_requests"] == 0 for m in models)


async def test_a_runner_dying_mid_answer_is_named_by_its_signal(
    daemon: Daemon, tmp_path: Path, client: AsyncClient
) -> None:
    app = make_app(daemon, tmp_path)
    async with app.run_test(size=(120, 30)) as pilot:
        screen, answer = await long_answer_started(pilot, app)
        pid = next(m for m in await client.ps() if m["model"] == SMOL)["runner_pid"]
        os.kill(pid, signal.SIGILL)  # as a fault in llama.cpp's native code would end it
        await wait_for(pilot, lambda: not screen.answering, "the answer to end")
        assert answer.stats is not None
        error = answer.stats.get("error", "")
        assert "was killed by SIGILL (illegal instruction)" in error, answer.stats
        assert "Fatal Python error: Illegal instruction" in error, error
        assert answer.text, "what came before the runner died is kept"
        # What a person sees: the error, by its signal's name.
        await wait_for(pilot, lambda: "SIGILL" in screen_text(app), "the error on screen")


async def test_quitting_mid_answer_keeps_what_came(daemon: Daemon, tmp_path: Path) -> None:
    app = make_app(daemon, tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        _, answer = await long_answer_started(pilot, app)
        shown = answer.text
        await pilot.press("ctrl+q")
    saved = ChatStore(tmp_path / DB_NAME).list_chats()[0].messages
    assert [m.role for m in saved] == ["user", "assistant"]
    assert saved[1].content.startswith(shown) and saved[1].content
    assert saved[1].stats == {"done_reason": "stopped"}


async def test_chats_persist_across_restarts(daemon: Daemon, tmp_path: Path) -> None:
    app = make_app(daemon, tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await connected(pilot, app)
        screen = app.screen
        assert isinstance(screen, ChatScreen) and screen.current is not None
        screen.current.options = {"temperature": 0, "num_predict": 4}
        assert await screen.send("First chat")
        await wait_for(pilot, lambda: not screen.answering, "the first answer")
        first = screen.current

        await pilot.press("ctrl+n")
        await wait_for(pilot, lambda: screen.current is not first, "a new chat")
        second = screen.current
        assert second.options == first.options, "a new chat starts with the same options"
        assert await screen.send("Second chat")
        await wait_for(pilot, lambda: not screen.answering, "the second answer")
        shown = last_answer(screen).stats_text
        await pilot.press("ctrl+t")
        assert app.theme == "textual-light"

    again = make_app(daemon, tmp_path)
    async with again.run_test(size=(100, 30)) as pilot:
        await connected(pilot, again)
        screen = again.screen
        assert isinstance(screen, ChatScreen)
        assert again.theme == "textual-light"
        assert [c.title for c in screen.chats.values()] == ["First chat", "Second chat"]
        assert screen.current is not None and screen.current.id == second.id
        views = list(screen.transcript().query(MessageView))
        assert [v.role for v in views] == ["user", "assistant"]
        assert views[0].text == "Second chat"
        assert views[1].text == second.messages[1].content
        assert views[1].stats_text == shown and "TTFT" in shown
        assert screen.current.options == {"temperature": 0, "num_predict": 4}

        await pilot.press("ctrl+up")
        await wait_for(pilot, lambda: screen.current.id == first.id, "the first chat")
        assert screen.transcript().query(MessageView).first().text == "First chat"

        await pilot.press("f8")
        await wait_for(pilot, lambda: isinstance(again.screen, ConfirmDialog), "confirmation")
        await pilot.click("#confirm")
        await wait_for(pilot, lambda: len(screen.chats) == 1, "the chat to go")
    titles = [c.title for c in ChatStore(tmp_path / DB_NAME).list_chats()]
    assert titles == ["Second chat"]


async def test_help_lists_every_binding_and_every_binding_has_an_id(
    daemon: Daemon, tmp_path: Path
) -> None:
    classes = (LocalLLMApp, ChatScreen, PromptArea, ModelsScreen, DashboardScreen, HelpScreen)
    ids = [b.id for cls in classes for b in cls.BINDINGS if isinstance(b, Binding)]
    assert all(ids) and len(ids) == len(set(ids))

    app = make_app(daemon, tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await connected(pilot, app)
        await pilot.press("f1")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), "the help")
        # The help is pushed before it is drawn: wait for its table (a busy machine lags).
        await wait_for(pilot, lambda: "Stop" in screen_text(app), "the help's key table")
        text = screen_text(app)
        assert "Send" in text and "Stop" in text  # the chat's keys come first
        assert "/image PATH" in text
        await pilot.press("end")  # the rest is further down
        text += screen_text(app)
        for words in ("Pull", "Quantize", "Unload model", "Light/dark", "Quit"):
            assert words in text
        await pilot.press("escape")
        assert isinstance(app.screen, ChatScreen)
        await pilot.press("f4", "question_mark")  # "?" where no text box takes it
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), "the help again")


# -- models ---------------------------------------------------------------------------------


async def open_models(pilot, app: LocalLLMApp) -> ModelsScreen:  # type: ignore[no-untyped-def]
    """Switch to the models screen and wait for its list."""
    await pilot.press("f3")
    screen = await wait_for(
        pilot, lambda: isinstance(app.screen, ModelsScreen) and app.screen, "models"
    )
    await wait_for(pilot, lambda: screen.models, "the model list")
    return screen


async def test_pull_shows_progress_up_to_100_percent(daemon: Daemon, tmp_path: Path) -> None:
    app = make_app(daemon, tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await connected(pilot, app)
        screen = await open_models(pilot, app)
        await pilot.press("p")
        dialog = await wait_for(
            pilot, lambda: isinstance(app.screen, NameDialog) and app.screen, "the pull dialog"
        )
        dialog.query_one(Input).value = "tiny"
        await pilot.press("enter")
        panel = await wait_for(pilot, lambda: next(iter(screen.transfers), None), "a transfer")
        await wait_for(pilot, lambda: panel.state != "running", "the pull to end", timeout=120)

        assert panel.state == "done", panel.status
        model_layer = max(panel.bars.values(), key=lambda layer: layer.total)
        assert model_layer.bar.percentage == 1.0
        assert model_layer.completed == model_layer.total > 0
        assert all(layer.bar.percentage == 1.0 for layer in panel.bars.values())
        assert "tiny:latest" in [m["name"] for m in screen.models]
        assert screen.selected == "tiny:latest"
        assert "100%" in screen_text(app) and "success" in screen_text(app)


async def test_copy_then_delete_a_model(
    daemon: Daemon, tmp_path: Path, client: AsyncClient
) -> None:
    app = make_app(daemon, tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await connected(pilot, app)
        screen = await open_models(pilot, app)
        table = screen.query_one(DataTable)
        table.move_cursor(row=[m["name"] for m in screen.models].index(SMOL))
        await wait_for(pilot, lambda: SMOL in screen.query_one("#details").source, "details")
        assert "Q4_1" in screen.query_one("#details").source

        await pilot.press("c")
        dialog = await wait_for(
            pilot, lambda: isinstance(app.screen, NameDialog) and app.screen, "the copy dialog"
        )
        dialog.query_one(Input).value = "smolcopy:test"
        await pilot.press("enter")
        await wait_for(pilot, lambda: screen.selected == "smolcopy:test", "the copy")
        await pilot.press("f2")  # the chat's model picker lists it when shown again
        chat = await wait_for(
            pilot, lambda: isinstance(app.screen, ChatScreen) and app.screen, "chat"
        )
        await wait_for(pilot, lambda: "smolcopy:test" in chat.models, "the copy in the picker")
        await pilot.press("f3")
        await wait_for(pilot, lambda: app.screen is screen, "the models screen")

        await pilot.press("d")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDialog), "confirmation")
        await pilot.press("enter")
        await wait_for(
            pilot, lambda: "smolcopy:test" not in [m["name"] for m in screen.models], "deletion"
        )
        assert "smolcopy:test" not in [m["name"] for m in await client.list_models()]
        await pilot.press("f2")
        await wait_for(pilot, lambda: "smolcopy:test" not in chat.models, "the picker to forget it")
        assert SMOL in [m["name"] for m in await client.list_models()]


async def test_quantize_a_model_with_progress(
    daemon: Daemon, tmp_path: Path, client: AsyncClient
) -> None:
    async for _ in client.pull("tiny"):
        pass
    app = make_app(daemon, tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await connected(pilot, app)
        screen = await open_models(pilot, app)
        screen.query_one(DataTable).move_cursor(
            row=[m["name"] for m in screen.models].index("tiny:latest")
        )
        await pilot.press("q")
        dialog = await wait_for(
            pilot, lambda: isinstance(app.screen, QuantizeDialog) and app.screen, "the dialog"
        )
        dialog.query_one(Select).value = "Q8_0"
        await wait_for(
            pilot, lambda: dialog.query_one("#target", Input).value == "tiny:latest-q8_0", "name"
        )
        await pilot.click("#ok")
        panel = await wait_for(pilot, lambda: next(iter(screen.transfers), None), "a transfer")
        await wait_for(pilot, lambda: panel.state != "running", "quantization", timeout=120)

        assert panel.state == "done", panel.status
        assert [layer.bar.percentage for layer in panel.bars.values()] == [1.0]
        row = next(m for m in screen.models if m["name"] == "tiny:latest-q8_0")
        assert row["details"]["quantization_level"] == "Q8_0"
    await client.delete("tiny:latest-q8_0")


async def test_several_pulls_at_once_one_cancelled(
    daemon: Daemon, tmp_path: Path, registry: FakeRegistry, other_gguf: bytes, client: AsyncClient
) -> None:
    blob = f"/v2/library/slow/blobs/sha256:{hashlib.sha256(other_gguf).hexdigest()}"
    pause = registry.add_fault("pause", len(other_gguf) // 2, path=blob)
    app = make_app(daemon, tmp_path)
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            await connected(pilot, app)
            screen = await open_models(pilot, app)
            slow = await screen.start_pull("slow")
            await wait_for(pilot, pause.reached.is_set, "the slow download to hang")
            fast = await screen.start_pull("tiny")
            await wait_for(pilot, lambda: fast.state != "running", "the other pull", timeout=120)
            assert fast.state == "done" and slow.state == "running"

            await pilot.press("x")  # cancels the newest running transfer: the slow one
            await wait_for(pilot, lambda: slow.state != "running", "the cancel")
            assert slow.state == "cancelled"
            assert "cancelled" in screen_text(app)
    finally:
        pause.resume.set()
    assert "slow:latest" not in [m["name"] for m in await client.list_models()]


# -- dashboard ------------------------------------------------------------------------------


async def open_dashboard(pilot, app: LocalLLMApp) -> DashboardScreen:  # type: ignore[no-untyped-def]
    """Connect, then switch to the dashboard."""
    await connected(pilot, app)
    await pilot.press("f4")
    return await wait_for(
        pilot, lambda: isinstance(app.screen, DashboardScreen) and app.screen, "dashboard"
    )


async def test_dashboard_shows_a_decoding_slot_while_another_client_streams(
    daemon: Daemon, tmp_path: Path, client: AsyncClient
) -> None:
    app = make_app(daemon, tmp_path, stats_interval=0.1)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_dashboard(pilot, app)
        # SmolLM2's end-of-generation tokens (0, 2, 4) are banned, so the stream runs until
        # it is closed whatever this CPU's model would say.
        stream = client.openai_completion_stream(
            {
                "model": SMOL,
                "prompt": "1, 2, 3, 4, 5,",
                "max_tokens": 4000,
                "temperature": 0,
                "logit_bias": {"0": -100, "2": -100, "4": -100},
                "stream": True,
            }
        )
        first = await anext(stream)
        assert first["choices"][0]["finish_reason"] is None

        def decoding() -> LoadedModelCard | None:
            card = screen.cards.get(SMOL)
            return card if card and "decode" in card.slot_states and card.decode_rate > 0 else None

        try:
            card = await wait_for(pilot, decoding, "a decoding slot on the dashboard")
            text = screen_text(app)
            assert "decoding" in text and SMOL in text
            assert card.decode_history[-1] > 0
        finally:
            await stream.aclose()

        await pilot.press("u")
        await wait_for(pilot, lambda: SMOL not in screen.cards, "the model to unload")
        assert SMOL not in [m["name"] for m in await client.ps()]
        assert screen.query_one("#empty").display


async def test_the_dashboard_follows_the_stats_when_the_daemon_answers_as_it_opens(
    daemon: Daemon, tmp_path: Path
) -> None:
    # Textual runs a watcher's first call on the watched object's queue (the app's) and later
    # changes on the watching screen's: an app still busy opening the dashboard ran a stale
    # "connecting" after "connected" and stopped the stats stream for good (seen in CI).
    app = make_app(daemon, tmp_path, stats_interval=0.1)
    async with app.run_test(size=(80, 24)) as pilot:
        await connected(pilot, app)
        app.connection = "lost"
        gate = asyncio.Event()
        app.call_next(gate.wait)  # the app's queue stalls here, as when it is busy
        try:
            await asyncio.wait_for(app.switch_mode("dashboard"), 30)
            screen = app.screen
            assert isinstance(screen, DashboardScreen)
            app.connection = "connected"
            await wait_for(
                pilot, lambda: screen.updates, "a snapshot while the app is busy", settle=False
            )
        finally:
            gate.set()
        drained = asyncio.Event()
        app.call_next(drained.set)
        await asyncio.wait_for(drained.wait(), 30)

        seen = screen.updates
        await wait_for(
            pilot, lambda: screen.updates >= seen + 2, "snapshots after the app caught up"
        )
        assert [w for w in app.workers if w.node is screen and w.group == "stats" and w.is_running]


async def test_a_snapshot_arriving_while_the_dashboard_closes_is_harmless(
    daemon: Daemon, tmp_path: Path
) -> None:
    # Textual removes a closing screen's widgets before it cancels the screen's workers, so
    # the stats stream can deliver one more snapshot to a dashboard with no widgets left.
    app = make_app(daemon, tmp_path, stats_interval=0.1)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_dashboard(pilot, app)
        await wait_for(pilot, lambda: screen.updates > 0, "a first snapshot")
        await pilot.press("f2")
        await app.remove_mode("dashboard")
        assert not screen.children and not screen.is_running
        assert not [w for w in app.workers if w.node is screen and w.is_running]

        seen = screen.updates
        model = {"name": SMOL, "slots": [{"state": "decode", "generated_tokens": 3}]}
        await screen.show_snapshot({"queue_depth": 1, "max_queue": 8, "models": [model]})
        assert screen.updates == seen + 1
    assert app.return_code in (None, 0)


# -- loading ahead ----------------------------------------------------------------------------


async def test_picking_a_model_starts_its_load_before_any_message_is_sent(
    daemon: Daemon, tmp_path: Path, client: AsyncClient
) -> None:
    async for _ in client.pull("tiny"):
        pass
    app = make_app(daemon, tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await connected(pilot, app)
        screen = app.screen
        assert isinstance(screen, ChatScreen) and screen.current is not None
        # the model the chat does not use yet, not loaded
        picked = next(m for m in ("tiny:latest", SMOL) if m != screen.current.model)
        assert picked in screen.models
        if picked in [m["name"] for m in await client.ps()]:
            await client.unload(picked)

        screen.query_one("#model", Select).value = picked
        await wait_for(pilot, lambda: screen.current.model == picked, "the pick to be kept")
        for _ in range(1200):  # up to a minute, as wait_for
            if picked in [m["name"] for m in await client.ps()]:
                break
            await pilot.pause(0.05)
        else:
            raise AssertionError(f"picking {picked} did not load it:\n{screen_text(app)}")
        # loaded by the pick alone: nothing was asked
        assert not screen.answering
        assert not [m for m in screen.current.messages if m.role == "user"]
