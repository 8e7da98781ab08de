"""Resumable, verified, shared blob downloads: the engine under both sources.

One blob, one file: ``partial/sha256-<hex>.partial``. Its name depends only on the digest, so
a download interrupted by a dropped connection, a stall, a cancelled pull or a killed process
resumes with ``Range: bytes=<size of the partial file>-``; the bytes already there are hashed
again (local disk is much faster than any network) instead of being fetched again.

Sharing:

* in one process, every pull of a digest attaches to one :class:`_Transfer`, which runs in its
  own thread; each puller waits on it and reports its progress on its own thread. The transfer
  stops (keeping its partial file) only when every attached puller has cancelled.
* across processes, the transfer holds an exclusive ``flock`` on the partial file while it
  writes. Another process's transfer waits for that lock, reporting the file's growth as its
  progress, then finds the blob published (or, if the first process died, resumes its file).

Safety: a blob appears only by an atomic rename of a partial file whose sha256 matched; a
mismatch deletes the partial file (the bytes are bad, resuming them would fail again). A full
disk stops the transfer with :class:`DiskFullError` and keeps the partial file, so the pull
resumes once space is freed; nothing complete is touched.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import httpx

from .._exceptions import (
    DigestMismatchError,
    DiskFullError,
    NetworkError,
    OperationCancelledError,
    PullError,
)
from .._format import human_size
from .._locks import lock_exclusive
from ..settings import Settings
from ..store.manifest import normalize_digest
from ..store.storage import FileOps, disk_full
from ..store.store import Store
from .http import TransientError, content_range, response_total, shared_client
from .progress import ProgressCallback, PullProgress, RateMeter, pulling_status

__all__ = ["BlobSource", "fetch_blob", "partial_path"]

_CHUNK = 1 << 20
# writev takes at most IOV_MAX (1024 on Linux) buffers.
_MAX_PIECES = 256
# How often a waiting puller looks at its cancel event, and the least time between its events.
_TICK = 0.1
# How often a transfer waiting for another process's lock looks at that process's progress.
_LOCK_POLL = 0.25
_BACKOFF_FIRST = 1.0
_BACKOFF_MAX = 30.0


class BlobSource(Protocol):
    """Where the bytes of one blob come from (a registry blob URL, a Hugging Face file)."""

    @property
    def description(self) -> str:
        """What is downloaded, for messages: ``hf.co/user/repo/model-Q4_K_M.gguf``."""
        ...

    def open(self, client: httpx.Client, offset: int) -> httpx.Response:
        """Start a streamed GET of the blob from byte ``offset`` (a Range request when > 0).

        Returns a response whose status is 200, 206 or 416 (the caller closes it). Raises a
        :class:`~localllm.PullError` subclass for failures that retrying cannot fix (not found,
        auth) and :class:`~localllm.sources.http.TransientError` for those it may.
        """
        ...


def partial_path(store: Store, digest: str) -> Path:
    """The resumable download file of ``digest``."""
    return store.partial_dir / f"{normalize_digest(digest).replace(':', '-')}.partial"


def fetch_blob(
    store: Store,
    digest: str,
    size: int,
    source: BlobSource,
    *,
    settings: Settings,
    on_progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
) -> None:
    """Make sure the blob ``digest`` (``size`` bytes) is in ``store``, downloading it if needed.

    Progress events (``pulling <hex12>``) go to ``on_progress`` on the calling thread. Setting
    ``cancel`` makes this return promptly with :class:`OperationCancelledError`; the download
    itself goes on while other pulls still wait for it. Raises :class:`DigestMismatchError`,
    :class:`DiskFullError`, :class:`NetworkError` or the source's own :class:`PullError`.
    """
    digest = normalize_digest(digest)
    status = pulling_status(digest)

    def emit(completed: int, rate: float | None) -> None:
        if on_progress is not None:
            on_progress(PullProgress(status, digest, size, completed, rate))

    if store.has_blob(digest):
        emit(size, None)
        return
    transfer = _attach(store, digest, size, source, settings)
    try:
        _follow(transfer, emit, cancel)
    finally:
        _detach(transfer)


# -- sharing in one process ---------------------------------------------------------------

_registry_lock = threading.Lock()
_transfers: dict[tuple[str, str], _Transfer] = {}


def _attach(
    store: Store, digest: str, size: int, source: BlobSource, settings: Settings
) -> _Transfer:
    key = (str(store.root.resolve()), digest)
    with _registry_lock:
        transfer = _transfers.get(key)
        if transfer is None or transfer.stopping or transfer.finished:
            transfer = _Transfer(key, store, digest, size, source, settings)
            _transfers[key] = transfer
            transfer.subscribers = 1
            transfer.start()
        else:
            transfer.subscribers += 1
    return transfer


def _detach(transfer: _Transfer) -> None:
    with _registry_lock:
        transfer.subscribers -= 1
        if transfer.subscribers == 0 and not transfer.finished:
            transfer.stopping = True
            transfer.stop_event.set()


def _follow(
    transfer: _Transfer,
    emit: Callable[[int, float | None], None],
    cancel: threading.Event | None,
) -> None:
    last_completed = -1
    last_time = 0.0
    while True:
        completed, rate, finished, error = transfer.wait(_TICK)
        if finished:
            if error is not None:
                raise error
            emit(transfer.size, rate)
            return
        now = time.monotonic()
        if completed != last_completed and now - last_time >= _TICK:
            emit(completed, rate)
            last_completed, last_time = completed, now
        if cancel is not None and cancel.is_set():
            raise OperationCancelledError("pull cancelled; the partial download is kept")


class _Transfer:
    """One download of one blob, in its own thread, watched by any number of pulls."""

    def __init__(
        self,
        key: tuple[str, str],
        store: Store,
        digest: str,
        size: int,
        source: BlobSource,
        settings: Settings,
    ) -> None:
        self.key = key
        self.store = store
        self.digest = digest
        self.size = size
        self.source = source
        self.settings = settings
        self.subscribers = 0
        """Pulls waiting for this transfer (guarded by ``_registry_lock``)."""
        self.stopping = False
        """Set when the last puller left: stop at the next chunk, keep the partial file."""
        self.stop_event = threading.Event()
        """Wakes backoff and lock waits when stopping."""
        self.finished = False
        self.error: BaseException | None = None
        self._cond = threading.Condition()
        self._completed = 0
        self._meter = RateMeter()
        self._thread = threading.Thread(
            target=self._run, name=f"pull-{digest.removeprefix('sha256:')[:12]}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def wait(self, timeout: float) -> tuple[int, float | None, bool, BaseException | None]:
        """Wait up to ``timeout`` for news; returns (completed, rate, finished, error)."""
        with self._cond:
            if not self.finished:
                self._cond.wait(timeout)
            return self._completed, self._meter.rate(), self.finished, self.error

    def _set_completed(self, completed: int) -> None:
        with self._cond:
            self._completed = completed
            self._meter.add(completed)
            self._cond.notify_all()

    def _check_stop(self) -> None:
        if self.stopping:
            raise OperationCancelledError("download stopped: every pull waiting for it cancelled")

    def _sleep(self, seconds: float) -> None:
        if self.stop_event.wait(seconds):
            self._check_stop()

    def _run(self) -> None:
        error: BaseException | None = None
        try:
            self._download()
        except BaseException as exc:  # handed to every waiting puller
            error = exc
        with _registry_lock:
            if _transfers.get(self.key) is self:
                del _transfers[self.key]
        with self._cond:
            self.finished = True
            self.error = error
            self._cond.notify_all()

    # -- the download itself (transfer thread) ------------------------------------------------

    def _download(self) -> None:
        path = partial_path(self.store, self.digest)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = self._lock_partial(path)
        if fd is None:
            self._set_completed(self.size)
            return
        try:
            part = _PartialFile(fd, path, self.size)
            try:
                self._fill(part)
                actual = part.digest()
            finally:
                part.close()
            if actual != self.digest:
                _unlink_if_same(fd, path)
                raise DigestMismatchError(self.digest, actual)
            self.store.publish(path, self.digest)
        finally:
            os.close(fd)

    def _lock_partial(self, path: Path) -> int | None:
        """Open and exclusively lock the partial file; ``None`` if the blob already exists."""
        while True:
            if self.store.has_blob(self.digest):
                return None
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                lock_exclusive(fd, functools.partial(self._watch_holder, fd))
                if self.store.has_blob(self.digest):
                    _unlink_if_same(fd, path)  # an empty leftover we created, if anything
                    os.close(fd)
                    return None
                if not _same_file(fd, path):
                    # The holder published or deleted the file we locked: start over.
                    os.close(fd)
                    continue
                return fd
            except BaseException:
                os.close(fd)
                raise

    def _watch_holder(self, fd: int) -> None:
        """While another process downloads this blob (it holds the lock of the partial file
        ``fd``): show its progress, then wait a little."""
        self._set_completed(min(os.fstat(fd).st_size, self.size))
        self._sleep(_LOCK_POLL)

    def _fill(self, part: _PartialFile) -> None:
        """Append to ``part`` until it holds ``size`` bytes, resuming and retrying as needed."""
        part.load()
        self._set_completed(part.offset)
        failures = 0
        last_error = ""
        client = shared_client(self.settings)
        while part.offset < self.size:
            self._check_stop()
            before = part.offset
            try:
                self._attempt(client, part)
                if part.offset < self.size:
                    last_error = "the connection closed before the end of the file"
            except (TransientError, httpx.TransportError) as exc:
                last_error = _describe(exc)
            if part.offset >= self.size:
                break
            failures = 1 if part.offset > before else failures + 1
            if failures > self.settings.pull_retries:
                raise NetworkError(
                    f"downloading {self.source.description} failed "
                    f"{failures} times in a row ({last_error}); "
                    f"{human_size(part.offset)} of {human_size(self.size)} are kept, "
                    "pull again to resume"
                )
            self._sleep(min(_BACKOFF_FIRST * 2 ** (failures - 1), _BACKOFF_MAX))

    def _attempt(self, client: httpx.Client, part: _PartialFile) -> None:
        response = self.source.open(client, part.offset)
        try:
            total = response_total(response)
            if total is not None and total != self.size:
                # Another file than the one promised: retrying (or resuming) cannot help.
                _unlink_if_same(part.fd, part.path)
                raise PullError(
                    f"{self.source.description} is {total} bytes at the source, not the "
                    f"{self.size} bytes its listing promised"
                )
            if response.status_code == 206:
                if content_range(response.headers.get("content-range"))[0] != part.offset:
                    part.reset()
                    raise TransientError("the server answered with another byte range")
            elif response.status_code == 200:
                if part.offset:
                    part.reset()  # the server ignored Range: take the whole file again
            elif response.status_code == 416:
                part.reset()
                raise TransientError("the server refused the byte range; starting over")
            else:
                raise TransientError(f"unexpected HTTP status {response.status_code}")
            # Pieces as they arrive, written in batches with one writev (no copying); a batch
            # is written even when the connection breaks (iter_raw(n) would drop its partial
            # chunk, and those bytes would be fetched again).
            batch: list[bytes] = []
            batched = 0
            try:
                for piece in response.iter_raw():
                    self._check_stop()
                    room = self.size - part.offset - batched
                    if len(piece) >= room:
                        batch.append(piece[:room])  # more than promised: the digest decides
                        break
                    batch.append(piece)
                    batched += len(piece)
                    if batched >= _CHUNK or len(batch) >= _MAX_PIECES:
                        self._write(part, batch)
                        batched = 0
            finally:
                if batch:
                    self._write(part, batch)
        finally:
            response.close()

    def _write(self, part: _PartialFile, batch: list[bytes]) -> None:
        pieces = list(batch)
        batch.clear()
        first = part.offset == 0
        part.append(self.store.ops, pieces, self.digest)
        self._set_completed(part.offset)
        if first:
            self.store.checkpoint("download-started")


class _BackgroundHash:
    """sha256 computed on a thread of its own, overlapping the network reads.

    hashlib releases the GIL for large buffers, so one piece is hashed while the next is
    received (hashing in line cost about a fifth of the loopback throughput). The bounded
    queue keeps at most a few megabytes waiting when hashing falls behind.
    """

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self._queue: queue.Queue[list[memoryview] | None] = queue.Queue(maxsize=16)
        self._thread = threading.Thread(target=self._run, name="sha256", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (pieces := self._queue.get()) is not None:
            for piece in pieces:
                self._hash.update(piece)

    def update(self, pieces: list[memoryview]) -> None:
        """Add ``pieces`` (which must not change afterwards) to the hash, in order."""
        if pieces:
            self._queue.put(pieces)

    def hexdigest(self) -> str:
        """The hash of everything added; the hasher is finished afterwards."""
        self.close()
        return self._hash.hexdigest()

    def close(self) -> None:
        """Stop the thread (idempotent)."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()


class _PartialFile:
    """The locked partial file of one blob, and the sha256 of the bytes in it."""

    def __init__(self, fd: int, path: Path, size: int) -> None:
        self.fd = fd
        self.path = path
        self.size = size
        self.offset = 0
        self._hash = _BackgroundHash()

    def load(self) -> None:
        """Hash what an earlier attempt left, so the download resumes after it."""
        have = os.fstat(self.fd).st_size
        if have > self.size:
            self.reset()
            return
        position = 0
        while position < have:
            chunk = os.pread(self.fd, min(_CHUNK, have - position), position)
            if not chunk:
                break
            self._hash.update([memoryview(chunk)])
            position += len(chunk)
        self.offset = position
        os.lseek(self.fd, position, os.SEEK_SET)

    def reset(self) -> None:
        """Drop everything: the next bytes start the file."""
        os.ftruncate(self.fd, 0)
        os.lseek(self.fd, 0, os.SEEK_SET)
        self._hash.close()
        self._hash = _BackgroundHash()
        self.offset = 0

    def append(self, ops: FileOps, pieces: list[bytes], digest: str) -> None:
        """Write ``pieces`` at the end, unbuffered (a killed process keeps what it reported)."""
        views = [memoryview(piece) for piece in pieces if piece]
        while views:
            try:
                written = ops.writev(self.fd, views)
            except OSError as exc:
                if disk_full(exc):
                    raise DiskFullError(
                        f"disk full while downloading {digest.removeprefix('sha256:')[:12]}: "
                        f"{human_size(self.offset)} of {human_size(self.size)} are kept in "
                        f"{self.path.parent}; free some space and pull again to resume"
                    ) from None
                raise
            self.offset += written
            # Hash exactly what reached the file (a short write leaves the rest for the loop).
            done: list[memoryview] = []
            while written:
                view = views[0]
                done.append(view[:written])
                if written < len(view):
                    views[0] = view[written:]
                    break
                written -= len(view)
                views.pop(0)
            self._hash.update(done)

    def digest(self) -> str:
        """``sha256:<hex>`` of the bytes written (call once, after the last append)."""
        return f"sha256:{self._hash.hexdigest()}"

    def close(self) -> None:
        """Release the hashing thread."""
        self._hash.close()


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _unlink_if_same(fd: int, path: Path) -> None:
    if _same_file(fd, path):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    name = type(exc).__name__
    return f"{name}: {text}" if text else name
