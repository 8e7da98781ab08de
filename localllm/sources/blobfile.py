"""Hashing a finished file under ``partial/`` before :meth:`Store.publish` renames it a blob.

``Store.blob_writer`` hashes while it streams; a resumed download or a quantizer's output is
already a complete file on the store's filesystem, hashed here and then renamed into place
(copying a multi-gigabyte file a second time would double the disk traffic and space needed).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = ["hash_file"]

_CHUNK = 1 << 20


def hash_file(path: Path) -> str:
    """``sha256:<hex>`` of the file at ``path``."""
    hasher = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            hasher.update(chunk)
    return f"sha256:{hasher.hexdigest()}"
