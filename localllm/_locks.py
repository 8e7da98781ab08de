"""Locks another process on this machine may hold (``flock`` on a file both open): taken at
once or not (:func:`try_lock`), claimed with a note for whoever is refused (:func:`claim`), or
waited for (:func:`lock_exclusive`)."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable

__all__ = ["claim", "lock_exclusive", "try_lock"]


def try_lock(fd: int, *, exclusive: bool = True) -> bool:
    """Take ``fd``'s lock without waiting; False when another process holds it."""
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def claim(fd: int, note: str, *, exclusive: bool = True) -> str | None:
    """Take ``fd``'s lock without waiting and write ``note`` in its file, for the message of
    whoever is refused next; None when taken, else the holder's note ("" when it wrote none).
    The note is for messages only: a full disk that cannot write it does not stop the claim."""
    if not try_lock(fd, exclusive=exclusive):
        return os.pread(fd, 200, 0).decode(errors="replace").strip()
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, note.encode(), 0)
    return None


def lock_exclusive(fd: int, wait: Callable[[], None]) -> None:
    """Take the exclusive lock of ``fd``, calling ``wait`` each time another process holds it:
    ``wait`` sleeps a little (and may report what the holder does meanwhile), or raises to
    give up."""
    while not try_lock(fd):
        wait()
