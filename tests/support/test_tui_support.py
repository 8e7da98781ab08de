"""Helpers for the TUI tests: build the app against a test daemon, wait on its state."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from test_daemon_support import Daemon
from textual.app import App
from textual.pilot import Pilot

from localllm.client import AsyncClient
from localllm.tui.app import LocalLLMApp

__all__ = ["make_app", "notices", "screen_text", "wait_for"]

T = TypeVar("T")


def make_app(daemon: Daemon, data: Path, **kwargs: Any) -> LocalLLMApp:
    """The app talking to ``daemon``, with its own data dir (chat database) at ``data``."""
    kwargs.setdefault("autostart", False)
    # No Ollama store, whatever this machine has in ~/.ollama: the models screen would offer
    # its import (and the app's data dir is not the daemon's store here); nor this machine's
    # MCP servers: the chat would offer their tools
    settings = daemon.settings.replace(
        home=data, ollama_models=data / "no-ollama", mcp_config=data / "mcp.json"
    )
    return LocalLLMApp(settings, client=AsyncClient(daemon.settings), **kwargs)


def notices(app: App[Any]) -> list[str]:
    """Every message ``app`` is told to show from now on (``app.notify``), kept here: a
    notification leaves ``app._notifications`` once its timeout passes, which a loaded
    machine can outlast before the test reads it."""
    told: list[str] = []
    notify = app.notify

    def recording_notify(message: str, **kwargs: Any) -> None:
        told.append(str(message))
        notify(message, **kwargs)

    app.notify = recording_notify  # type: ignore[method-assign]
    return told


async def wait_for(
    pilot: Pilot[Any],
    condition: Callable[[], T],
    what: str,
    timeout: float = 60.0,
    *,
    settle: bool = True,
) -> T:
    """Let the app run (pilot pauses) until ``condition()`` is truthy; returns its value.

    ``settle=False`` polls without the pilot's pause, which waits for the app's message queue:
    for a test that stalls that queue on purpose.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:.0f}s waiting for {what}; the screen:\n"
                + screen_text(pilot.app)
            )
        if settle:
            await pilot.pause(0.05)
        else:
            await asyncio.sleep(0.05)


def screen_text(app: App[Any]) -> str:
    """What the terminal shows now, as plain text (for asserting on what a person sees)."""
    import io

    from rich.console import Console

    width, height = app.size
    console = Console(
        width=width,
        height=height,
        file=io.StringIO(),
        force_terminal=True,
        color_system="truecolor",
        record=True,
        legacy_windows=False,
        safe_box=False,
    )
    console.print(app.screen._compositor.render_update(full=True))
    return console.export_text(styles=False)
