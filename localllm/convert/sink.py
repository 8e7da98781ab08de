"""Writing a conversion's output on a thread, so encoding the next chunk overlaps the disk.

numpy's encoding and the file write both release the GIL; with a bounded queue of a few chunks
between them a conversion runs at about the slower of the two instead of their sum, with a
few chunks more in memory. An error on the thread (a full disk) is raised in the caller at its
next write or at :meth:`BackgroundWriter.close`.
"""

from __future__ import annotations

import queue
import threading
from typing import BinaryIO

import numpy as np

__all__ = ["BackgroundWriter"]

_STOP = object()


class BackgroundWriter:
    """Append arrays and bytes to ``fh`` in order, from a thread."""

    def __init__(self, fh: BinaryIO, depth: int = 3) -> None:
        self._fh = fh
        self._queue: queue.Queue[object] = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self.position = fh.tell()
        """The file's length once everything queued is written."""
        self._thread = threading.Thread(target=self._run, name="convert-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if self._error is not None:
                continue  # keep draining so the producer never blocks on a dead writer
            try:
                if isinstance(item, np.ndarray):
                    item.tofile(self._fh)
                else:
                    self._fh.write(item)  # type: ignore[arg-type]
            except BaseException as exc:
                self._error = exc

    def _put(self, item: object) -> None:
        while True:
            if self._error is not None and item is not _STOP:
                raise self._error
            try:
                self._queue.put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    def write(self, data: np.ndarray | bytes) -> None:
        """Queue ``data`` to be appended (the caller must not modify an array afterwards)."""
        self._put(data)
        self.position += data.nbytes if isinstance(data, np.ndarray) else len(data)

    def pad(self, alignment: int) -> None:
        """Queue zero bytes up to the next multiple of ``alignment``."""
        if n := -self.position % alignment:
            self.write(bytes(n))

    def close(self) -> None:
        """Wait until everything is written; raise the thread's error if it had one."""
        self._put(_STOP)
        self._thread.join()
        if self._error is not None:
            raise self._error
