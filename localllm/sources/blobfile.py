"""Turning a finished file under ``partial/`` into a blob by renaming it, not by copying it.

``Store.blob_writer`` streams bytes into a fresh temporary file; a resumed download or a
quantizer's output already is a complete file on the store's filesystem, and copying a
multi-gigabyte file a second time would double the disk traffic and the space needed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

from ..manifest import normalize_digest
from ..store import Store

__all__ = ["hash_file", "publish_file"]

_CHUNK = 1 << 20


def hash_file(path: Path) -> str:
    """``sha256:<hex>`` of the file at ``path``."""
    hasher = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            hasher.update(chunk)
    return f"sha256:{hasher.hexdigest()}"


def publish_file(store: Store, path: Path, digest: str) -> Path:
    """Atomically move ``path`` (already verified to hash to ``digest``) into ``blobs/``.

    ``path`` must be on the store's filesystem (under ``store.partial_dir``). The file is
    fsynced before the rename and the directory after it, so a crash leaves either no blob or
    the whole one.
    """
    target = store.blob_path(normalize_digest(digest))
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(path, 0o644)
    os.replace(path, target)
    with contextlib.suppress(OSError):
        dir_fd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return target
