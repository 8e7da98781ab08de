"""The terminal UI with no daemon running: it starts one (as the CLI does), says so when the
daemon goes away, and connects again to the next one."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from pathlib import Path

import pytest
from test_daemon_support import free_port
from test_tui_support import screen_text, wait_for

from localllm.settings import Settings
from localllm.tui.app import LocalLLMApp

pytestmark = [pytest.mark.slow, pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    """Textual runs on asyncio."""
    return "asyncio"


def daemon_pid(settings: Settings) -> int:
    """The pid the running daemon wrote into its lock file."""
    return int((settings.runtime_dir / "daemon.lock").read_text().strip())


async def stop(pid: int) -> None:
    """SIGTERM a daemon this process started (auto-start makes it our child) and reap it."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    with contextlib.suppress(ChildProcessError):
        await asyncio.to_thread(os.waitpid, pid, 0)


async def test_starts_the_daemon_and_reconnects_after_it_goes_away(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A port of its own: the default one may serve someone else's daemon on this machine.
    monkeypatch.setenv("LOCALLLM_HOST", f"127.0.0.1:{free_port()}")
    monkeypatch.setenv("LOCALLLM_NUM_THREADS", "1")
    settings = Settings.from_env()
    app = LocalLLMApp(settings)
    pids: list[int] = []
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: app.connection == "connected", "a started daemon", 120)
            pids.append(daemon_pid(settings))
            assert "● daemon" in screen_text(app)
            screen = app.screen
            await wait_for(pilot, lambda: getattr(screen, "models", None), "the models")

            await stop(pids[0])
            await wait_for(pilot, lambda: app.connection == "lost", "the app to notice")
            # the state changes before the status bar is laid out again: wait for the words
            await wait_for(pilot, lambda: "went away" in screen_text(app), "the bar to say so")

            await wait_for(pilot, lambda: app.connection == "connected", "a new daemon", 120)
            pids.append(daemon_pid(settings))
            assert pids[1] != pids[0]
    finally:
        with contextlib.suppress(OSError, ValueError):
            await stop(daemon_pid(settings))


async def test_without_autostart_it_says_the_daemon_is_not_running(home: Path) -> None:
    app = LocalLLMApp(Settings.from_env(), autostart=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.connection == "offline", "the offline state")
        await wait_for(pilot, lambda: "not running" in screen_text(app), "the bar to say so")


async def test_a_daemon_that_cannot_start_is_reported(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The port is taken (bound, not listening): nothing answers there and a daemon cannot bind it.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        monkeypatch.setenv("LOCALLLM_HOST", f"127.0.0.1:{taken.getsockname()[1]}")
        app = LocalLLMApp(Settings.from_env())
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: app.connection_error, "the failed start", 120)
            await wait_for(pilot, lambda: app.connection == "offline", "the offline state")
            assert "failed to start" in app.connection_error
            await wait_for(pilot, lambda: "not running" in screen_text(app), "the bar to say so")
