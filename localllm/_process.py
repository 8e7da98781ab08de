"""Questions about other processes on this machine (is it alive, what did it report, which
loopback port is free), and files they share."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

from ._format import exit_status

__all__ = ["child_report", "free_port", "pid_alive", "write_json"]


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
