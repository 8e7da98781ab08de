"""Helpers for the store's fault, kill and concurrency tests (no tests here).

* :class:`FaultyOps`: the store's file operations, failing once with ``ENOSPC`` at the K-th
  call or once N bytes were written (the seam is :class:`localllm.store.storage.FileOps`);
* :func:`store_state`: what a store holds (names → manifest digests, blobs);
* :func:`assert_consistent`: the store lists only whole models whose blobs hash to their
  digests, and no temporary file of a write is left;
* :func:`fill_disk`: another program taking the free space of a (small, real) disk.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from localllm.sources.blobfile import hash_file
from localllm.store.names import ModelName
from localllm.store.storage import FileOps
from localllm.store.store import ModelEntry, Store

__all__ = [
    "FaultyOps",
    "StoreState",
    "assert_consistent",
    "fill_disk",
    "store_state",
    "temporaries",
]


class FaultyOps(FileOps):
    """File operations that fail once, with ``error``: at the ``at_call``-th call (counting
    create, write, writev, fsync, replace, link and unlink), or at the write that would take
    the bytes written past ``after_bytes``. Calls and bytes are counted either way."""

    def __init__(
        self,
        *,
        at_call: int | None = None,
        after_bytes: int | None = None,
        error: int = errno.ENOSPC,
    ) -> None:
        self.at_call = at_call
        self.after_bytes = after_bytes
        self.error = error
        self.calls = 0
        self.written = 0
        self.failed: str | None = None
        """The operation that failed, once one did."""

    def _call(self, name: str) -> None:
        self.calls += 1
        if self.failed is None and self.calls == self.at_call:
            self._fail(name)

    def _fail(self, name: str) -> None:
        self.failed = name
        raise OSError(self.error, os.strerror(self.error))

    def _bytes(self, count: int) -> int:
        """How many of ``count`` bytes may be written before the byte fault."""
        if self.failed is not None or self.after_bytes is None:
            return count
        room = self.after_bytes - self.written
        if room <= 0:
            self._fail("write")
        return min(room, count)

    def create(self, path: Path) -> int:
        self._call("create")
        return super().create(path)

    def write(self, fd: int, data: bytes | memoryview) -> int:
        self._call("write")
        allowed = self._bytes(len(data))
        written = super().write(fd, memoryview(data)[:allowed])
        self.written += written
        return written

    def writev(self, fd: int, buffers: Sequence[bytes | memoryview]) -> int:
        self._call("writev")
        allowed = self._bytes(sum(len(b) for b in buffers))
        pieces: list[bytes | memoryview] = []
        for buffer in buffers:
            if allowed <= 0:
                break
            pieces.append(memoryview(buffer)[:allowed])
            allowed -= len(pieces[-1])
        written = super().writev(fd, pieces)
        self.written += written
        return written

    def fsync(self, fd: int) -> None:
        self._call("fsync")
        super().fsync(fd)

    def replace(self, source: Path, target: Path) -> None:
        self._call("replace")
        super().replace(source, target)

    def link(self, source: Path, target: Path) -> None:
        self._call("link")
        super().link(source, target)

    def unlink(self, path: Path) -> None:
        self._call("unlink")
        super().unlink(path)


@dataclass(frozen=True)
class StoreState:
    """What a store holds."""

    names: dict[str, str]
    """Model name → manifest digest."""
    blobs: frozenset[str]
    """Every blob's digest."""


def store_state(root: Path) -> StoreState:
    """The names and blobs of the store at ``root`` (read without any fault)."""
    store = Store(root)
    names = {
        name.short: entry.digest
        for name, entry in store.manifests()
        if isinstance(name, ModelName) and isinstance(entry, ModelEntry)
    }
    return StoreState(names=names, blobs=frozenset(store.iter_blobs()))


def temporaries(root: Path) -> list[Path]:
    """Temporary files of writes (not resumable downloads) under the store at ``root``."""
    found = list((root / "partial").glob("tmp-*")) + list(root.glob(".*.tmp-*"))
    return found + list((root / "manifests").glob("**/.*.tmp-*"))


def fill_disk(folder: Path) -> Path:
    """Take every free byte of ``folder``'s file system (as another program would) with one
    file; returns it (remove it to give the space back)."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as handle:
        block = b"\0" * (256 * 1024)
        while True:
            try:
                handle.write(block)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                return filler


def assert_consistent(root: Path) -> list[str]:
    """Every manifest names whole blobs whose bytes hash to their digest, every listed model
    is such a one, and no temporary file is left. Returns the listed names."""
    store = Store(root)
    assert temporaries(root) == [], f"temporary files left: {temporaries(root)}"
    listed = sorted(entry.name.short for entry in store.list())
    for name, entry in store.manifests():
        assert isinstance(entry, ModelEntry), f"{name}: unreadable manifest ({entry})"
        for layer in (entry.manifest.config, *entry.manifest.layers):
            path = store.blob_path(layer.digest)
            assert path.is_file(), f"{name}: blob {layer.digest} missing"
            assert path.stat().st_size == layer.size, f"{name}: blob {layer.digest} size"
            assert hash_file(path) == layer.digest, f"{name}: blob {layer.digest} corrupted"
    return listed
