"""Start the daemon in the background when none answers, as the CLI does.

A stand-in until the shared helper lands in ``localllm.autostart``: :func:`start_daemon` is
the one entry point the app calls, so swapping in the shared helper touches only this module.
The daemon is a detached ``python -m localllm.daemon`` (its own session, so it outlives the
TUI and does not get the terminal's Ctrl+C); its early errors go to ``daemon-start.log``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Mapping

from localllm.client import AsyncClient
from localllm.settings import Settings

__all__ = ["child_env", "start_daemon"]

_POLL_SECONDS = 0.1
# Keeps each started process referenced, so Popen's destructor never warns while it runs.
_STARTED: list[subprocess.Popen[bytes]] = []


def child_env(settings: Settings, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a daemon that serves exactly ``settings``.

    ``base`` (default: this process's environment) supplies PATH and the like; every
    ``LOCALLLM_*`` variable is rewritten from ``settings``, so a TUI built with settings that
    differ from its environment (tests, an embedding program) starts the matching daemon.
    """
    source = os.environ if base is None else base
    env = {k: v for k, v in source.items() if not k.startswith("LOCALLLM_")}
    for spec in dataclasses.fields(settings):
        name = spec.metadata.get("env")
        value = getattr(settings, spec.name)
        if not name or value is None or (spec.name == "host" and not settings.host_from_env):
            continue
        if value == spec.default and name not in env:
            continue
        if isinstance(value, tuple):
            env[name] = ",".join(value)
        elif isinstance(value, bool):
            env[name] = "1" if value else "0"
        else:
            env[name] = str(value)
    return env


def _spawn(settings: Settings) -> tuple[subprocess.Popen[bytes], str]:
    settings.log_dir.mkdir(parents=True, exist_ok=True)
    log_path = settings.log_dir / "daemon-start.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "localllm.daemon"],
            env=child_env(settings),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
            close_fds=True,
        )
    _STARTED.append(process)
    return process, str(log_path)


def _last_line(path: str) -> str:
    try:
        with open(path, errors="replace") as handle:
            lines = [line.strip() for line in handle if line.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


async def start_daemon(
    settings: Settings, client: AsyncClient, timeout: float = 60.0
) -> str | None:
    """Start a daemon for ``settings`` and wait until ``client`` reaches it.

    Returns ``None`` once it answers, or a one-line reason when it could not be started (the
    daemon's own message, e.g. another daemon holds the lock, or a timeout).
    """
    try:
        process, log_path = await asyncio.to_thread(_spawn, settings)
    except OSError as exc:
        return f"could not start the daemon: {exc}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await client.is_running():
            return None
        if process.poll() is not None:
            # It exited: maybe another daemon won the race for the lock and answers now.
            if await client.is_running():
                return None
            reason = _last_line(log_path) or f"exit status {process.returncode}"
            return f"the daemon did not start: {reason}"
        await asyncio.sleep(_POLL_SECONDS)
    return f"the daemon did not answer within {timeout:.0f} s (see {log_path})"
