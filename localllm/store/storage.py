"""The file operations under the model store: one write path, and the seam tests fail on purpose.

Every byte the store writes goes through a :class:`FileOps`: blobs (streamed into a temporary
file in ``partial/``, fsynced, renamed by digest), downloads (appended to their resumable
partial file), imported copies, and small files written whole (manifests, the verification
record) by :func:`atomic_write` (a temporary file beside the target, fsync, rename, fsync of the
directory). Tests hand the store a subclass that fails with ``ENOSPC`` after N bytes or at the
K-th call, and check that every operation then leaves the store as it was.

The other test seam is a write's checkpoints (:data:`PAUSE_STEPS`): a test may stop the daemon
at one and SIGKILL it there. What pauses lives in the test tree, not here (see
:mod:`localllm.testhooks`); without it, a checkpoint costs one ``is None`` test.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = [
    "PAUSE_STEPS",
    "FileOps",
    "atomic_write",
    "disk_full",
]

PAUSE_STEPS: dict[str, str] = {
    "blob-written": "a blob's bytes are complete and fsynced in partial/, not yet renamed",
    "blob-published": "a blob was renamed into blobs/ (no manifest names it yet)",
    "manifest-written": "a manifest's temporary file is complete and fsynced, not yet renamed",
    "manifest-published": "a manifest was renamed into place (the request has not answered)",
    "quantize-ready": "the disk space for the quantized weights was checked; llama.cpp waits",
    "quantize-started": "llama.cpp is quantizing (its first tensor is done)",
    "quantize-written": "llama.cpp's output is complete in partial/, not yet hashed",
    "convert-written": "a checkout's converted GGUF is complete in partial/, not yet quantized",
    "download-started": "a download wrote its first bytes to its partial file",
}
"""Where a test may pause a store write, and what has happened by then."""


def disk_full(exc: BaseException) -> bool:
    """True for the errors a full disk or an exhausted quota raise."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


class FileOps:
    """The file system calls the store's writes make; override one to inject a fault.

    Each method does exactly what its ``os`` namesake does. File descriptors are plain
    integers so that the same calls serve streamed blobs, downloads and small files.
    """

    def create(self, path: Path) -> int:
        """Create ``path`` (it must not exist) for writing; a descriptor."""
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)

    def write(self, fd: int, data: bytes | memoryview) -> int:
        """``os.write``: bytes written (possibly fewer than given)."""
        return os.write(fd, data)

    def writev(self, fd: int, buffers: Sequence[bytes | memoryview]) -> int:
        """``os.writev``: bytes written (possibly fewer than given)."""
        return os.writev(fd, buffers)

    def fsync(self, fd: int) -> None:
        """Flush a file's data and metadata to the disk."""
        os.fsync(fd)

    def replace(self, source: Path, target: Path) -> None:
        """Atomically rename ``source`` to ``target`` (replacing it)."""
        os.replace(source, target)

    def link(self, source: Path, target: Path) -> None:
        """Make ``target`` a hard link to ``source`` (``EXDEV`` across file systems)."""
        os.link(source, target)

    def unlink(self, path: Path) -> None:
        """Remove a name (a manifest being deleted; cleanups of temporary files do not come
        here: they must not fail)."""
        os.unlink(path)

    def fsync_dir(self, path: Path) -> None:
        """Make a rename in ``path`` durable (best effort: some file systems refuse)."""
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def free_space(self, path: Path) -> int:
        """Bytes free for this user on the file system of ``path``."""
        return shutil.disk_usage(path).free

    def write_all(self, fd: int, data: bytes | memoryview) -> None:
        """Write all of ``data`` (looping over short writes)."""
        view = memoryview(data)
        while view:
            view = view[self.write(fd, view) :]


def atomic_write(
    ops: FileOps,
    path: Path,
    data: bytes,
    *,
    mode: int = 0o644,
    before_rename: Callable[[], None] | None = None,
) -> None:
    """Replace ``path`` (its folder must exist) with ``data`` all at once: readers, and a crash
    at any point, see the old file or the new one; nothing is left behind on failure.
    ``before_rename`` runs once the new bytes are durable, just before they replace the old."""
    temp = path.parent / f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        fd = ops.create(temp)
        try:
            ops.write_all(fd, data)
            ops.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(temp, mode)
        if before_rename is not None:
            before_rename()
        ops.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    ops.fsync_dir(path.parent)
