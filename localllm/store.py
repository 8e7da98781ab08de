"""The model store: content-addressed blobs and manifests, laid out as Ollama does.

::

    <root>/blobs/sha256-<hex>                              immutable, verified
    <root>/manifests/<host>/<namespace>/<model>/<tag>      JSON manifest
    <root>/partial/                                        work in progress, never a blob

Guarantees:

* A blob appears only after its sha256 was verified, by an atomic rename of a fully written
  and fsynced temporary file. A killed writer leaves at most a temporary file in ``partial/``
  (swept later), never a half-written blob.
* Writers of the same blob may run concurrently: each writes its own temporary file and the
  renames publish identical bytes.
* A manifest is written (atomically) only after every blob it names exists.
* Garbage collection takes an exclusive lock; writers hold a shared one while their blobs are
  not yet referenced by a manifest, so collection never deletes a blob about to be used.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import secrets
import shutil
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ._exceptions import (
    BlobNotFoundError,
    DigestMismatchError,
    DiskFullError,
    ModelNotFoundError,
    StoreError,
)
from ._process import pid_alive
from .manifest import Layer, Manifest, normalize_digest
from .names import ModelName, parse_name

__all__ = ["BlobWriter", "ModelEntry", "Store", "VerifyResult"]

_CHUNK = 1 << 20


@dataclass(frozen=True)
class ModelEntry:
    """One model in the store, as ``localllm list`` shows it."""

    name: ModelName
    """The model's name."""
    manifest: Manifest
    """Its manifest."""
    digest: str
    """sha256 of the manifest bytes: the model's identity (its first 12 hex digits are the ID)."""
    modified: float
    """When the manifest was written (seconds since the epoch)."""

    @property
    def id(self) -> str:
        """Short ID as Ollama prints it (12 hex digits)."""
        return self.digest.removeprefix("sha256:")[:12]

    @property
    def size(self) -> int:
        """Bytes of all the model's blobs."""
        return self.manifest.size


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of re-hashing one blob."""

    digest: str
    """The digest the blob is stored under."""
    ok: bool
    """Whether its bytes still hash to that digest."""


def _raise_disk_full(exc: OSError, what: str) -> None:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        raise DiskFullError(
            errno.ENOSPC, f"disk full while writing {what}; free some space and try again"
        ) from exc


class BlobWriter:
    """Streams bytes into a temporary file while hashing them; :meth:`commit` publishes the blob.

    Use as a context manager: leaving it without a commit removes the temporary file.
    """

    def __init__(self, store: Store, expected_digest: str | None = None) -> None:
        self._store = store
        self._expected = normalize_digest(expected_digest) if expected_digest else None
        self._hash = hashlib.sha256()
        self.size = 0
        """Bytes written so far."""
        store.partial_dir.mkdir(parents=True, exist_ok=True)
        self.temp_path = store.partial_dir / f"tmp-{os.getpid()}-{secrets.token_hex(8)}"
        """Where the bytes go until they are verified."""
        self._file: BinaryIO | None = open(self.temp_path, "xb")  # noqa: SIM115 - closed in commit/abort

    def write(self, data: bytes) -> None:
        """Append ``data`` to the blob being written."""
        assert self._file is not None, "writer already closed"
        try:
            self._file.write(data)
        except OSError as exc:
            self.abort()
            _raise_disk_full(exc, "a blob")
            raise
        self._hash.update(data)
        self.size += len(data)

    def commit(self) -> str:
        """Verify the digest and atomically move the file into ``blobs/``. Returns the digest."""
        assert self._file is not None, "writer already closed"
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError as exc:
            self.abort()
            _raise_disk_full(exc, "a blob")
            raise
        self._file.close()
        self._file = None
        digest = f"sha256:{self._hash.hexdigest()}"
        if self._expected is not None and digest != self._expected:
            self.temp_path.unlink(missing_ok=True)
            raise DigestMismatchError(self._expected, digest)
        target = self._store.blob_path(digest)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists() and target.stat().st_size == self.size:
            # Someone else published the same bytes first; theirs are as good as ours.
            self.temp_path.unlink(missing_ok=True)
        else:
            os.chmod(self.temp_path, 0o644)
            os.replace(self.temp_path, target)
            _fsync_dir(target.parent)
        return digest

    def abort(self) -> None:
        """Drop everything written so far."""
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None
        self.temp_path.unlink(missing_ok=True)

    def __enter__(self) -> BlobWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._file is not None:
            self.abort()


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class Store:
    """Blobs and manifests under one root directory."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        """The store's root directory."""
        self.blobs_dir = self.root / "blobs"
        """Content-addressed blobs."""
        self.manifests_dir = self.root / "manifests"
        """Manifests by host/namespace/model/tag."""
        self.partial_dir = self.root / "partial"
        """Temporary files and resumable downloads."""

    # -- locking --------------------------------------------------------------------------

    @contextlib.contextmanager
    def _lock(self, mode: int) -> Iterator[bool]:
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, mode)
                acquired = True
            except BlockingIOError:
                acquired = False
            yield acquired
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Hold while writing blobs that a manifest will reference, so GC leaves them alone."""
        with self._lock(fcntl.LOCK_SH):
            yield

    # -- blobs ----------------------------------------------------------------------------

    def blob_path(self, digest: str) -> Path:
        """Path of the blob for ``digest`` (validated, so it cannot leave ``blobs/``)."""
        return self.blobs_dir / normalize_digest(digest).replace(":", "-")

    def has_blob(self, digest: str) -> bool:
        """True if the blob exists."""
        return self.blob_path(digest).is_file()

    def blob_writer(self, expected_digest: str | None = None) -> BlobWriter:
        """A writer that publishes a blob on commit (see :class:`BlobWriter`)."""
        return BlobWriter(self, expected_digest)

    def temp_path(self) -> Path:
        """A fresh name in ``partial/`` for a blob being assembled by other means than a
        :class:`BlobWriter` (a hard link, a reflink); swept like the writers' own files when
        its process is gone."""
        self.partial_dir.mkdir(parents=True, exist_ok=True)
        return self.partial_dir / f"tmp-{os.getpid()}-{secrets.token_hex(8)}"

    def publish(self, temp: Path, digest: str) -> bool:
        """Move ``temp`` (from :meth:`temp_path`, its bytes already verified to hash to
        ``digest``) into ``blobs/`` atomically. False when the blob was already there (``temp``
        is then removed: the bytes are the same)."""
        target = self.blob_path(digest)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_file():
            temp.unlink(missing_ok=True)
            return False
        os.replace(temp, target)
        _fsync_dir(target.parent)
        return True

    def write_blob(self, chunks: Iterable[bytes], expected_digest: str | None = None) -> Layer:
        """Store the bytes of ``chunks`` as a blob; returns a layer (media type left empty)."""
        with self.blob_writer(expected_digest) as writer:
            for chunk in chunks:
                writer.write(chunk)
            digest = writer.commit()
            return Layer(media_type="", digest=digest, size=writer.size)

    def write_blob_bytes(self, data: bytes, media_type: str) -> Layer:
        """Store a small in-memory blob (template, params, config) and describe it as a layer."""
        layer = self.write_blob([data])
        return Layer(media_type=media_type, digest=layer.digest, size=layer.size)

    def import_file(self, path: Path, media_type: str, expected_digest: str | None = None) -> Layer:
        """Copy a file into the store as a blob, hashing while copying."""
        try:
            with open(path, "rb") as source:
                layer = self.write_blob(iter(lambda: source.read(_CHUNK), b""), expected_digest)
        except IsADirectoryError:
            raise StoreError(f"{path} is a directory, not a file") from None
        except FileNotFoundError:
            raise StoreError(f"{path}: no such file") from None
        except PermissionError:
            raise StoreError(f"{path}: permission denied") from None
        return Layer(media_type=media_type, digest=layer.digest, size=layer.size)

    def read_blob(self, digest: str, limit: int = 1 << 20) -> bytes:
        """Read a small blob (template, params...), refusing anything larger than ``limit``."""
        path = self.blob_path(digest)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise BlobNotFoundError(f"blob {normalize_digest(digest)} is missing") from None
        if size > limit:
            raise StoreError(f"blob {digest} is {size} bytes, more than the {limit} expected")
        return path.read_bytes()

    def iter_blobs(self) -> Iterator[str]:
        """Digests of every blob on disk."""
        if not self.blobs_dir.is_dir():
            return
        for entry in sorted(self.blobs_dir.iterdir()):
            with contextlib.suppress(StoreError):
                yield normalize_digest(entry.name)

    def verify(self, remove_bad: bool = False) -> list[VerifyResult]:
        """Re-hash every blob; optionally delete those whose bytes no longer match."""
        results = []
        for digest in self.iter_blobs():
            path = self.blob_path(digest)
            hasher = hashlib.sha256()
            with open(path, "rb") as blob:
                for chunk in iter(lambda: blob.read(_CHUNK), b""):
                    hasher.update(chunk)
            ok = f"sha256:{hasher.hexdigest()}" == digest
            if not ok and remove_bad:
                path.unlink(missing_ok=True)
            results.append(VerifyResult(digest=digest, ok=ok))
        return results

    # -- manifests ------------------------------------------------------------------------

    def manifest_path(self, name: ModelName) -> Path:
        """Path of the manifest for ``name`` (its parts are validated by the name grammar)."""
        return self.manifests_dir.joinpath(*name.path_parts)

    def write_manifest(self, name: ModelName, manifest: Manifest) -> str:
        """Atomically write ``manifest`` for ``name``; every blob must exist. Returns its digest."""
        missing = [d for d in sorted(manifest.digests) if not self.has_blob(d)]
        if missing:
            raise BlobNotFoundError(f"cannot write manifest for {name}: missing blob {missing[0]}")
        raw = manifest.to_bytes()
        path = self.manifest_path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.parent / f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            with open(temp, "xb") as handle:
                handle.write(raw)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, path)
        except OSError as exc:
            temp.unlink(missing_ok=True)
            _raise_disk_full(exc, "a manifest")
            raise
        _fsync_dir(path.parent)
        return f"sha256:{hashlib.sha256(raw).hexdigest()}"

    def get(self, name: ModelName | str) -> ModelEntry:
        """The model called ``name``; raises :class:`ModelNotFoundError` if absent."""
        parsed = parse_name(name) if isinstance(name, str) else name
        path = self.manifest_path(parsed)
        try:
            raw = path.read_bytes()
            modified = path.stat().st_mtime
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise ModelNotFoundError(parsed.short) from None
        manifest = Manifest.from_bytes(raw)
        return ModelEntry(
            name=parsed,
            manifest=manifest,
            digest=f"sha256:{hashlib.sha256(raw).hexdigest()}",
            modified=modified,
        )

    def exists(self, name: ModelName | str) -> bool:
        """True if the store holds ``name``."""
        parsed = parse_name(name) if isinstance(name, str) else name
        return self.manifest_path(parsed).is_file()

    def list(self) -> list[ModelEntry]:
        """Every readable model, newest first. Unreadable manifests are skipped."""
        entries = []
        if not self.manifests_dir.is_dir():
            return entries
        for path in self.manifests_dir.glob("*/*/*/*"):
            if not path.is_file() or path.name.startswith("."):
                continue
            host, namespace, model, tag = path.relative_to(self.manifests_dir).parts
            try:
                name = parse_name(f"{host}/{namespace}/{model}:{tag}")
                entries.append(self.get(name))
            except (StoreError, ModelNotFoundError, ValueError):
                continue
        entries.sort(key=lambda e: e.modified, reverse=True)
        return entries

    def copy(self, source: ModelName | str, destination: ModelName | str) -> ModelEntry:
        """Give the model ``source`` a second name (blobs are shared)."""
        entry = self.get(source)
        target = parse_name(destination) if isinstance(destination, str) else destination
        self.write_manifest(target, entry.manifest)
        return self.get(target)

    def delete(self, name: ModelName | str) -> ModelEntry:
        """Remove a name, then collect blobs that nothing references any more."""
        entry = self.get(name)
        path = self.manifest_path(entry.name)
        path.unlink()
        # Prune the now-empty model/namespace/host directories, never above manifests/.
        for parent in list(path.parents)[:3]:
            with contextlib.suppress(OSError):
                parent.rmdir()
        self.gc()
        return entry

    def referenced_digests(self) -> set[str]:
        """Digests referenced by any manifest."""
        referenced: set[str] = set()
        for entry in self.list():
            referenced |= entry.manifest.digests
        return referenced

    def gc(self) -> list[str]:
        """Delete unreferenced blobs and stale temporary files. Returns the deleted digests.

        Skipped (returns ``[]``) while another process holds :meth:`writing`.
        """
        removed: list[str] = []
        with self._lock(fcntl.LOCK_EX | fcntl.LOCK_NB) as acquired:
            if not acquired:
                return removed
            referenced = self.referenced_digests()
            for digest in self.iter_blobs():
                if digest not in referenced:
                    self.blob_path(digest).unlink(missing_ok=True)
                    removed.append(digest)
            self._sweep_temporaries()
        return removed

    def _sweep_temporaries(self) -> None:
        if not self.partial_dir.is_dir():
            return
        for path in self.partial_dir.glob("tmp-*"):
            pid_text = path.name.split("-")[1]
            if pid_text.isdigit() and not pid_alive(int(pid_text)):
                path.unlink(missing_ok=True)

    def free_space(self) -> int:
        """Bytes free on the store's filesystem."""
        self.root.mkdir(parents=True, exist_ok=True)
        return shutil.disk_usage(self.root).free

    def touch(self, name: ModelName) -> None:
        """Mark a model as just modified (used after re-creating an identical manifest)."""
        now = time.time()
        os.utime(self.manifest_path(name), (now, now))
