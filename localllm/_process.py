"""Questions about other processes on this machine."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from typing import Any

from ._format import exit_status

__all__ = ["child_report", "pid_alive"]


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (one owned by another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
