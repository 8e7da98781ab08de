"""Waiting for a lock another process on this machine holds (``flock`` on a file both open)."""

from __future__ import annotations

import fcntl
from collections.abc import Callable

__all__ = ["lock_exclusive"]


def lock_exclusive(fd: int, wait: Callable[[], None]) -> None:
    """Take the exclusive lock of ``fd``, calling ``wait`` each time another process holds it:
    ``wait`` sleeps a little (and may report what the holder does meanwhile), or raises to
    give up."""
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            wait()
