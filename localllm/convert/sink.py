"""Writing a conversion's output on a thread, so encoding the next chunk overlaps the disk.

numpy's encoding and the file write both release the GIL; with a bounded queue of a few chunks
between them a conversion runs at about the slower of the two instead of their sum, with a
few chunks more in memory. An error on the thread (a full disk) is raised in the caller at its
next write or at :meth:`BackgroundWriter.close`.

A :class:`FileSpan` (bytes a tensor keeps as they are: bf16 written as BF16) is copied from
the shard by the kernel (``copy_file_range``, else ``sendfile``, else reads and writes): the
bytes never pass through Python or the process's memory, as ``cp`` copies them.

An array can be :class:`Lent` from a :class:`BufferPool`: the thread gives it back once it is
written, so a conversion reuses a few buffers instead of allocating (and the kernel zeroing)
a fresh one per chunk.

Given a ``hasher``, the file is also hashed as it is written (what is already in it first,
then every write; a span read back from the page cache), so a caller that makes the file a
blob need not read it again. The hashing has a thread of its own, fed in order by the writer:
SHA-256 costs about as much CPU as the write itself (2 GB/s), and on the writer's thread the
two in turn were the slowest stage of an F16 conversion; three threads let two cores share
rounding, writing and hashing as they come.
"""

from __future__ import annotations

import contextlib
import errno
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from localllm._exceptions import TruncatedShardError

__all__ = ["BackgroundWriter", "BufferPool", "FileSpan", "Lent"]

_STOP = object()
_WRITEBACK_STEP = 32 << 20  # bytes written between two starts of their writeback
# copy_file_range/sendfile refused for this pair of files: the next method is tried.
_UNSUPPORTED = {
    errno.EXDEV,
    errno.ENOSYS,
    errno.EINVAL,
    errno.EOPNOTSUPP,
    errno.EBADF,
    errno.ENOTSOCK,
}  # macOS: sendfile only to sockets


@dataclass(frozen=True)
class FileSpan:
    """``nbytes`` bytes of ``file`` from ``offset``, to be appended as they are."""

    file: Path
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Lent:
    """``array`` (a view of a pooled buffer), to be appended; ``give_back()`` once written."""

    array: np.ndarray
    give_back: Callable[[], None]

    @property
    def nbytes(self) -> int:
        """The array's bytes."""
        return self.array.nbytes


class BufferPool:
    """``count`` reusable buffers of ``nbytes`` bytes, allocated when first needed.

    :meth:`take` waits for a free one; a buffer comes back through the :class:`Lent` it is
    written as (or :meth:`give`). With one more buffer than the writer's queue holds plus the
    one it is writing, the producer fills one while the thread writes the others."""

    def __init__(self, count: int, nbytes: int) -> None:
        self.nbytes = nbytes
        self._made = 0
        self._count = count
        self._free: queue.SimpleQueue[np.ndarray] = queue.SimpleQueue()

    def take(self) -> np.ndarray:
        """A free buffer (uint8, ``nbytes`` long), waiting for the writer to return one (called
        from the one producer thread)."""
        if self._free.empty() and self._made < self._count:
            self._made += 1
            return np.empty(self.nbytes, dtype=np.uint8)
        return self._free.get()

    def give(self, buffer: np.ndarray) -> None:
        """Return ``buffer`` (taken from this pool) for reuse."""
        self._free.put(buffer)

    def lend(self, buffer: np.ndarray, array: np.ndarray) -> Lent:
        """``array`` (a view of ``buffer``) to be written, ``buffer`` returned after."""
        return Lent(array, lambda: self.give(buffer))


def _kernel_copy(method: str, src: int, dst: int, offset: int, count: int) -> int:
    if method == "copy_file_range":
        return os.copy_file_range(src, dst, count, offset)
    return os.sendfile(dst, src, offset, count)


def _start_writeback(fd: int, offset: int, length: int) -> None:
    """Start writing ``length`` bytes just copied to the disk now, without waiting, so the
    final fsync finds little left to write (the disk works while the next span is copied).

    ``POSIX_FADV_DONTNEED`` on dirty pages starts their writeback (Linux); it drops only the
    pages already clean, so most of the file stays cached for the quantizer that reads it next
    (86% of a 1 GB conversion here, measured with ``fincore``)."""
    if hasattr(os, "posix_fadvise"):
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)


class _SpanCopier:
    """Appends spans of source files to one output file descriptor, with what the kernel
    offers; the source files stay open until :meth:`close`."""

    def __init__(self) -> None:
        self._files: dict[Path, int] = {}
        self._methods = [m for m in ("copy_file_range", "sendfile") if hasattr(os, m)]

    def _fd(self, path: Path) -> int:
        src = self._files.get(path)
        if src is None:
            src = self._files[path] = os.open(path, os.O_RDONLY)
        return src

    def hash(self, span: FileSpan, hasher: Any) -> None:
        """Feed the span's bytes to ``hasher`` (read back: the page cache holds them)."""
        src = self._fd(span.file)
        for start in range(span.offset, span.offset + span.nbytes, 8 << 20):
            hasher.update(os.pread(src, min(8 << 20, span.offset + span.nbytes - start), start))

    def copy(self, span: FileSpan, dst: int) -> None:
        src = self._fd(span.file)
        offset, left = span.offset, span.nbytes
        while left:
            while self._methods:
                try:
                    n = _kernel_copy(self._methods[0], src, dst, offset, left)
                    break
                except OSError as exc:
                    if exc.errno not in _UNSUPPORTED:
                        raise
                    self._methods.pop(0)
            else:
                n = os.write(dst, os.pread(src, min(left, 8 << 20), offset))
            if n == 0:
                raise TruncatedShardError(
                    f"{span.file.name} ended at byte {offset} while it "
                    "was read (changed since its header was checked?)"
                )
            offset, left = offset + n, left - n

    def close(self) -> None:
        for fd in self._files.values():
            os.close(fd)
        self._files.clear()


class _HashThread:
    """Feeds, in order, what the writer wrote to ``hasher`` on a thread; gives back a
    :class:`Lent` once hashed. An error is kept for the writer to raise."""

    def __init__(self, hasher: Any, depth: int) -> None:
        self._hasher = hasher
        self._queue: queue.Queue[object] = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self._spans = _SpanCopier()  # descriptors of its own: the writer's are its thread's
        self._thread = threading.Thread(target=self._run, name="convert-hasher", daemon=True)
        self._thread.start()

    def put(self, item: object) -> None:
        """Queue ``item`` (written already) to be hashed; blocks while the queue is full."""
        self._queue.put(item)

    def _run(self) -> None:
        try:
            while True:
                item = self._queue.get()
                if item is _STOP:
                    return
                try:
                    if self.error is None:  # else drained, so the writer never blocks
                        self._hash(item.array if isinstance(item, Lent) else item)
                except BaseException as exc:
                    self.error = exc
                finally:
                    if isinstance(item, Lent):
                        item.give_back()
        finally:
            self._spans.close()

    def _hash(self, item: object) -> None:
        if isinstance(item, FileSpan):
            self._spans.hash(item, self._hasher)
        elif isinstance(item, np.ndarray):
            self._hasher.update(np.ascontiguousarray(item).reshape(-1).view(np.uint8))
        else:
            self._hasher.update(item)

    def close(self) -> None:
        """Hash everything queued, then stop."""
        self._queue.put(_STOP)
        self._thread.join()


class BackgroundWriter:
    """Append arrays, bytes and file spans to ``fh`` in order, from a thread; with a
    ``hasher`` (``hashlib.sha256()``), hash the whole file meanwhile (on another thread)."""

    def __init__(self, fh: BinaryIO, depth: int = 3, hasher: Any = None) -> None:
        self._fh = fh
        self._hashing: _HashThread | None = None
        if hasher is not None:
            # What was written before (the GGUF header), read back once (``fh`` is write-only).
            fh.flush()
            with open(fh.name, "rb") as back:
                head = back.read(fh.tell())
            if len(head) != fh.tell():
                raise OSError(errno.EIO, "the GGUF header could not be read back to hash it")
            hasher.update(head)
            self._hashing = _HashThread(hasher, depth)
        self._queue: queue.Queue[object] = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self.position = fh.tell()
        """The file's length once everything queued is written."""
        self._spans = _SpanCopier()
        self._written_back = self.position
        self._thread = threading.Thread(target=self._run, name="convert-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                item = self._queue.get()
                if item is _STOP:
                    return
                hashing = False
                try:
                    if self._error is None:  # else drained: the producer never blocks
                        self._write(item.array if isinstance(item, Lent) else item)
                        if self._hashing is not None:
                            if self._hashing.error is not None:
                                raise self._hashing.error
                            self._hashing.put(item)  # the hash thread gives a Lent back
                            hashing = True
                except BaseException as exc:
                    self._error = exc
                finally:
                    if isinstance(item, Lent) and not hashing:
                        item.give_back()  # a producer waiting on the pool goes on
        finally:
            self._spans.close()
            if self._hashing is not None:
                self._hashing.close()
                self._error = self._error or self._hashing.error

    def _write(self, item: object) -> None:
        if isinstance(item, FileSpan):
            # Past the file object's buffer: flushed first, and its position read again after.
            self._fh.flush()
            self._spans.copy(item, self._fh.fileno())
            self._fh.seek(0, os.SEEK_END)
        elif isinstance(item, np.ndarray):
            # The file object's own write, not ndarray.tofile: tofile dups the descriptor, opens
            # a FILE on it and seeks on every call (a sixth of the thread's time at 4 MiB).
            self._fh.write(np.ascontiguousarray(item).reshape(-1).view(np.uint8))  # type: ignore[arg-type]
        else:
            self._fh.write(item)  # type: ignore[arg-type]
        end = self._fh.tell()
        if end - self._written_back >= _WRITEBACK_STEP:
            self._fh.flush()
            _start_writeback(self._fh.fileno(), self._written_back, end - self._written_back)
            self._written_back = end

    def _put(self, item: object) -> None:
        while True:
            if self._error is not None and item is not _STOP:
                raise self._error
            try:
                self._queue.put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    def write(self, data: np.ndarray | bytes | FileSpan | Lent) -> None:
        """Queue ``data`` to be appended (the caller must not modify an array afterwards; a
        :class:`Lent` one is given back once written)."""
        self._put(data)
        self.position += (
            data.nbytes if isinstance(data, np.ndarray | FileSpan | Lent) else len(data)
        )

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
