"""Snapshots of the three screens at 100x30 (pytest-textual-snapshot; update with
``pytest tests/tui/test_tui_snapshots.py --snapshot-update`` and review the SVGs).

Deterministic by construction: a real daemon with only the bundled model, a chat database
written by the test with fixed stats, the clock frozen for "modified" times, a model loaded
with keep_alive -1 (no countdown) and no request run on it (rates and TTFTs stay empty), and
the prompt's cursor not blinking, fixed speed figures in a cache dir of the test's own.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from speed_support import seed_calibration
from test_daemon_support import Daemon, running_daemon
from test_tui_support import make_app, wait_for
from textual.pilot import Pilot

from localllm.tui.chats import DB_NAME, ChatStore, StoredMessage
from localllm.tui.screens.chat import ChatScreen
from localllm.tui.screens.dashboard import DashboardScreen
from localllm.tui.screens.models import ModelsScreen
from localllm.tui.widgets.prompt import PromptArea

SMOL = "smollm2:135m"
SIZE = (100, 30)
HOUR = 3600.0

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon whose models never unload (no keep-alive countdown to freeze), with a fixed
    context (the memory plan would choose one by this machine's free memory)."""
    root = tmp_path_factory.mktemp("tui-snap")
    # Fixed speed figures, so that the predicted speed the models screen shows is the same
    # on every machine.
    seed_calibration(root / "cache", threads=1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(root / "cache"))
        with running_daemon(
            root / "home", num_parallel=2, num_threads=1, keep_alive=-1, context_length=4096
        ) as d:
            yield d


@pytest.fixture(scope="module")
def frozen_clock(daemon: Daemon) -> float:
    """Two hours after the bundled model was imported."""
    with daemon.client() as client:
        stamp = next(m["modified_at"] for m in client.list_models() if m["name"] == SMOL)
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() + 2 * HOUR


async def ready(pilot: Pilot[Any], screen_type: type, loaded: Any) -> None:
    """Wait for the connection, then for ``loaded(screen)``."""
    app = pilot.app
    await wait_for(pilot, lambda: getattr(app, "connection", "") == "connected", "connection")
    screen = await wait_for(
        pilot, lambda: isinstance(app.screen, screen_type) and app.screen, "screen"
    )
    await wait_for(pilot, lambda: loaded(screen), "the screen's data")
    for prompt in app.query(PromptArea):
        prompt.cursor_blink = False


def test_chat_screen(snap_compare: Any, daemon: Daemon, tmp_path: Path) -> None:
    store = ChatStore(tmp_path / DB_NAME)
    store.create_chat("Hello there", SMOL)
    chat = store.create_chat("Tell me about llamas", SMOL, "Be brief.", {"temperature": 0.2})
    store.add_message(chat.id, StoredMessage("user", "Tell me about llamas"))
    answer = (
        "Llamas are **domesticated** South American camelids.\n\n"
        "- They hum to each other\n- They were pack animals of the Inca\n\n"
        "```python\nprint('llama')\n```"
    )
    stats = {
        "ttft_duration": 85_000_000,
        "prompt_eval_rate": 1234.5,
        "eval_rate": 95.25,
        "prompt_cached_count": 12,
        "eval_count": 48,
        "done_reason": "stop",
    }
    store.add_message(chat.id, StoredMessage("assistant", answer, stats))
    store.set_meta("current_chat", str(chat.id))
    store.close()
    app = make_app(daemon, tmp_path)

    async def run_before(pilot: Pilot[Any]) -> None:
        await ready(pilot, ChatScreen, lambda screen: screen.models and screen.current)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_models_screen(
    snap_compare: Any, daemon: Daemon, tmp_path: Path, frozen_clock: float
) -> None:
    app = make_app(daemon, tmp_path, clock=lambda: frozen_clock)

    async def run_before(pilot: Pilot[Any]) -> None:
        await pilot.press("f3")

        def loaded(screen: ModelsScreen) -> bool:
            return bool(screen.models) and SMOL in screen.query_one("#details").source

        await ready(pilot, ModelsScreen, loaded)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_dashboard_screen(snap_compare: Any, daemon: Daemon, tmp_path: Path) -> None:
    with daemon.client() as client:
        client.load(SMOL)
    app = make_app(daemon, tmp_path)

    async def run_before(pilot: Pilot[Any]) -> None:
        await pilot.press("f4")
        await ready(pilot, DashboardScreen, lambda screen: SMOL in screen.cards)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
