"""A memory cgroup made for one test (devices/test_memory_cgroup.py, cli/test_launch.py): a
child of this process's own, v2 or v1, limited to a size; where the machine does not allow
one the test is skipped with the step that failed and why."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from localllm.daemon.memory.system import memory_cgroup

__all__ = ["MemoryCgroup", "memory_limited"]


@dataclass
class MemoryCgroup:
    """A memory cgroup made for one test."""

    version: str
    folder: Path

    def enter(self) -> None:
        """Move the calling process into the group (run in the child before exec)."""
        (self.folder / "cgroup.procs").write_text(str(os.getpid()))

    def oom_kills(self) -> int:
        """Processes the kernel killed in the group for want of memory."""
        name = "memory.events" if self.version == "v2" else "memory.oom_control"
        text = (self.folder / name).read_text()
        match = re.search(r"^oom_kill (\d+)", text, re.MULTILINE)
        return int(match.group(1)) if match else 0


def _enable_memory_controller(parent: Path) -> None:
    control = parent / "cgroup.subtree_control"
    if "memory" not in control.read_text().split():
        control.write_text("+memory")


@contextlib.contextmanager
def memory_limited(limit: int) -> Iterator[MemoryCgroup]:
    """A fresh memory cgroup held to ``limit`` bytes, removed afterwards (skips where none
    can be made)."""
    own = memory_cgroup()
    if own is None:
        pytest.skip(
            "cannot run here: no memory cgroup hierarchy is mounted (neither cgroup v2 with "
            "the memory controller nor the v1 memory controller under /sys/fs/cgroup)"
        )
    version, parent = own
    folder = parent / f"localllm-test-{secrets.token_hex(4)}"
    try:
        if version == "v2":
            _enable_memory_controller(parent)
        folder.mkdir()
        if version == "v2":
            (folder / "memory.max").write_text(str(limit))
            with contextlib.suppress(FileNotFoundError):
                (folder / "memory.swap.max").write_text("0")
        else:
            (folder / "memory.limit_in_bytes").write_text(str(limit))
            with contextlib.suppress(FileNotFoundError, OSError):
                (folder / "memory.memsw.limit_in_bytes").write_text(str(limit))
    except OSError as exc:
        with contextlib.suppress(OSError):
            folder.rmdir()
        pytest.skip(
            f"cannot run here: creating a {version} memory cgroup under {parent} failed with "
            f"{errno.errorcode.get(exc.errno or 0, exc.errno)} ({exc.strerror}); it needs "
            "root and a writable cgroup filesystem"
        )
    try:
        yield MemoryCgroup(version, folder)
    finally:
        with contextlib.suppress(OSError):
            folder.rmdir()
