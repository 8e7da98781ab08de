"""Start the daemon in the background when a command needs it and none answers.

:func:`ensure_daemon` is what ``localllm run/list/...`` (and the terminal UI) call first. When
no daemon answers as localllm where the client looks (the socket, then the TCP address: see
:class:`~localllm.client.Client`) and that address is on this machine, it starts
``localllm serve`` detached (its own session, so Ctrl-C in the terminal does not reach it;
output appended to ``serve.log`` in the log dir) and waits, bounded, until it answers.

Concurrent commands do not start two daemons: they take turns on ``autostart.lock`` in the
runtime dir, and whoever gets it second finds the first one's daemon running. A daemon started
some other way in the same moment (``localllm serve`` by hand, systemd) wins the daemon's own
per-home lock; ours then exits saying another one runs, and we wait for that one instead.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from ._exceptions import DaemonUnavailableError
from ._locks import lock_exclusive
from .client import Client, is_loopback
from .settings import Settings

if TYPE_CHECKING:
    import subprocess

__all__ = ["SERVE_LOG", "START_TIMEOUT", "DaemonStartError", "ensure_daemon", "is_local"]

START_TIMEOUT = 60.0
"""Seconds to wait for a daemon we started (first start imports the starter model)."""
SERVE_LOG = "serve.log"
"""File in the log dir that receives the output of daemons started by the CLI."""
_POLL = 0.05
_TAIL_LINES = 8
# The daemon's refusal when another daemon holds the per-home lock (daemon/server.py).
_LOCKED_MARK = "is already running for"


class DaemonStartError(DaemonUnavailableError):
    """A daemon we started exited or did not answer in time; the message has its log's tail."""


def is_local(settings: Settings) -> bool:
    """True when the daemon the client would talk to lives on this machine (we may start it)."""
    return not settings.host_from_env or is_loopback(settings.bind_host)


def _log_tail(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            text = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    lines = [line for line in text.splitlines() if line.strip()]
    return "\n".join(lines[-_TAIL_LINES:])


@contextlib.contextmanager
def _turn(settings: Settings, deadline: float) -> Iterator[None]:
    """Hold ``autostart.lock``: one command at a time may start a daemon for this home."""
    settings.runtime_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(settings.runtime_dir / "autostart.lock", os.O_RDWR | os.O_CREAT, 0o600)

    def wait() -> None:
        if time.monotonic() > deadline:
            raise DaemonStartError(
                "timed out waiting for another localllm command that is starting the daemon"
            ) from None
        time.sleep(_POLL)

    try:
        lock_exclusive(fd, wait)
        yield
    finally:
        os.close(fd)  # releases the lock


def _spawn(log_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    """Start ``localllm serve`` detached; returns it and where its output starts in the log."""
    import subprocess  # only when starting one: not on the path of every command

    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} started by localllm\n".encode())
        log.flush()
        offset = log.tell()
        # cwd "/": a daemon that lives on must not pin the directory the command ran in.
        process = subprocess.Popen(
            [sys.executable, "-m", "localllm", "serve"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd="/",
            start_new_session=True,
            close_fds=True,
        )
    return process, offset


def _wait(
    client: Client,
    process: subprocess.Popen[bytes],
    log_path: Path,
    offset: int,
    deadline: float,
    on_wait: Callable[[str], None] | None,
) -> None:
    other_daemon = False
    while time.monotonic() < deadline:
        if client.is_running():
            return
        if not other_daemon and process.poll() is not None:
            if client.is_running():
                return  # ours lost a race to a daemon started elsewhere, which answers now
            tail = _log_tail(log_path, offset)
            if process.returncode != 0 and _LOCKED_MARK in tail:
                # Another daemon for this home won the lock a moment ago: wait for it instead.
                other_daemon = True
                if on_wait is not None:
                    on_wait("another localllm daemon is starting; waiting for it")
                continue
            raise DaemonStartError(
                f"the localllm daemon failed to start (exit status {process.returncode}); "
                f"the end of {log_path}:\n{tail}"
            )
        time.sleep(_POLL)
    if client.is_running():
        return
    what = (
        "another localllm daemon holds this home but does not answer"
        if other_daemon
        else "the localllm daemon did not answer"
    )
    raise DaemonStartError(
        f"{what} at {client.address} in time; the end of {log_path}:\n{_log_tail(log_path, offset)}"
    )


def ensure_daemon(
    settings: Settings,
    *,
    timeout: float = START_TIMEOUT,
    on_start: Callable[[str], None] | None = None,
    client: Client | None = None,
) -> bool:
    """Make sure a daemon answers, starting one in the background if needed.

    Returns True when this call started it. ``on_start`` receives short notices for the
    person waiting ("starting the localllm daemon..."). ``client``, when given, is the one
    that looks (and is left connected to whichever transport answered); else one is made
    from ``settings`` for the check. Raises :class:`~localllm.DaemonUnavailableError` when
    the address is remote and nothing answers, :class:`DaemonStartError` (a subclass) when
    the daemon we started fails or stays silent.
    """
    with contextlib.ExitStack() as stack:
        if client is None:
            client = stack.enter_context(Client(settings))
        if client.is_running():
            return False
        if not is_local(settings):
            raise DaemonUnavailableError(
                f"no localllm daemon answers at {client.address}, and it is not on this machine "
                "so it cannot be started from here"
            )
        deadline = time.monotonic() + timeout
        with _turn(settings, deadline):
            if client.is_running():
                return False  # the command we waited for started it
            log_path = settings.log_dir / SERVE_LOG
            if on_start is not None:
                on_start("starting the localllm daemon")
            process, offset = _spawn(log_path)
            _wait(client, process, log_path, offset, deadline, on_start)
            # Our child runs on as the daemon: mark it waited-for so Popen's finaliser does not
            # warn about a process it was never meant to reap.
            process.returncode = process.returncode or 0
            return True
