"""Questions about other processes on this machine (is it alive, what did it report, which
loopback port is free), and files they share."""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ._exceptions import OperationCancelledError
from ._format import exit_status

__all__ = [
    "child_events",
    "child_report",
    "free_port",
    "pid_alive",
    "spawn_reporting",
    "write_json",
]


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (one owned by another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def free_port() -> int:
    """A loopback TCP port nobody listens on now (another process may take it before the
    caller binds it: good enough for starting a server of one's own)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def child_report(done: subprocess.CompletedProcess[bytes]) -> tuple[dict[str, Any] | None, str]:
    """What a child that prints one JSON object as its last line reported: ``(report, "")``,
    or ``(None, how it ended)`` (``exited with status 3: <its last error line>``)."""
    lines = done.stdout.decode("utf-8", "replace").strip().splitlines()
    if done.returncode == 0 and lines:
        with contextlib.suppress(ValueError):
            report = json.loads(lines[-1])
            if isinstance(report, dict):
                return report, ""
    errors = done.stderr.decode("utf-8", "replace").strip().splitlines()
    cause = f": {errors[-1][:300]}" if errors else ""
    return None, f"{exit_status(done.returncode)}{cause}"


def write_json(file: Path, data: Any) -> None:
    """Write ``data`` as JSON to ``file`` whole or not at all (a temporary file of this process,
    renamed), so that other processes reading it concurrently never see half of it. Raises
    OSError."""
    file.parent.mkdir(parents=True, exist_ok=True)
    temporary = file.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps(data, indent=1))
    temporary.replace(file)


def child_events(
    fd: int, cancel: threading.Event | None, cancelled: str, poll: float = 0.2
) -> Iterator[dict[str, Any]]:
    """The JSON objects a child writes one a line to the pipe ``fd``, until it closes; kills
    nothing itself. ``cancel`` set: OperationCancelledError(``cancelled``), checked every
    ``poll`` seconds while the child is silent."""
    pending = b""
    while True:
        if cancel is not None and cancel.is_set():
            raise OperationCancelledError(cancelled)
        ready, _, _ = select.select([fd], [], [], poll)
        if not ready:
            continue
        data = os.read(fd, 65536)
        if not data:
            return
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict):
                    yield event


def spawn_reporting(command: list[str], output: Any) -> tuple[subprocess.Popen[bytes], int]:
    """Start ``command`` with the write end of a new pipe appended as its last argument (where
    it reports, see :func:`child_events`) and its stdout and stderr to ``output``; returns the
    process and the pipe's read end, which the caller closes."""
    read_fd, write_fd = os.pipe()
    try:
        process = subprocess.Popen(
            [*command, str(write_fd)],
            pass_fds=(write_fd,),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=output,
        )
    finally:
        os.close(write_fd)
    return process, read_fd
