"""The model store: content-addressed blobs and manifests, laid out as Ollama does.

::

    <root>/blobs/sha256-<hex>                              immutable, verified
    <root>/manifests/<host>/<namespace>/<model>/<tag>      JSON manifest
    <root>/partial/                                        work in progress, never a blob
    <root>/locks/                                          one lock file per model name

What the store promises (docs/store.md says it for users):

* **Every change is a transaction** (:meth:`Store.transaction`): its blobs are written to a
  temporary name in ``partial/``, fsynced and renamed by digest; its manifest is written last,
  atomically (temporary file, fsync, rename, fsync of the directory). A failure or a kill at any
  point leaves the old state or the whole new one, never a name pointing at other weights. The
  blobs a failed change published are removed again (if nothing else references them).
* **Every write goes through one seam**, :class:`~localllm.store.storage.FileOps`, so tests can make
  any of them fail (``ENOSPC`` after N bytes, at the K-th call); a full disk is a
  :class:`DiskFullError`, a read-only folder a :class:`StoreUnwritableError`.
* **Names are claimed**: a change holds a lock file per name it writes (exclusively) or reads
  (shared), without waiting: a second create of a name being created is refused at once
  (:class:`StoreBusyError`); pulls of one name may share it (one download, several waiters).
* **Writers exclude collection**: writers hold the store's lock shared while temporary files and
  not yet referenced blobs exist; collecting unreferenced blobs and sweeping orphaned temporary
  files takes it exclusively (never waiting) and so never removes work in progress.
* **A damaged model is never served**: :meth:`Store.get` checks that every blob of a model is
  there with the size its manifest says (a few ``stat`` calls); ``localllm doctor`` re-hashes
  every blob and sets aside those whose bytes do not match their digest.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import secrets
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .._exceptions import (
    BlobNotFoundError,
    DamagedModelError,
    DigestMismatchError,
    DiskFullError,
    ModelNotFoundError,
    StoreBusyError,
    StoreError,
    StoreUnwritableError,
)
from .._format import human_size
from .._locks import claim
from .manifest import Layer, Manifest, normalize_digest
from .names import ModelName, parse_name
from .storage import FileOps, PauseHook, atomic_write, disk_full

__all__ = ["BlobWriter", "ModelEntry", "Store", "Transaction", "VerifyResult"]

_CHUNK = 1 << 20
_UNWRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT, errno.ENOTDIR)
CORRUPT_PREFIX = "corrupt-"
"""Blobs ``localllm doctor`` found corrupted are set aside in ``partial/`` under this prefix."""


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
    size: int = 0
    """The blob's size in bytes."""


@dataclass
class Transaction:
    """One change of the store in progress (see :meth:`Store.transaction`)."""

    store: Store = field(repr=False)
    what: str
    """What the change does, for messages (``creating big:q8``)."""
    published: set[str] = field(default_factory=set)
    """Blobs this change created: removed again if it fails (and nothing references them)."""
    discarded: set[str] = field(default_factory=set)
    """Blobs this change stopped needing (a replaced manifest's): collected once it is done."""

    def commit(self, name: ModelName, manifest: Manifest) -> ModelEntry:
        """Write ``name``'s manifest, the last step of a change; every blob must exist."""
        self.store.write_manifest(name, manifest)
        return self.store.get(name)

    def discard(self, digests: Iterable[str]) -> None:
        """Blobs the change no longer needs: collected after it, unless something uses them."""
        self.discarded |= set(digests)


def _temp_name() -> str:
    return f"tmp-{os.getpid()}-{secrets.token_hex(8)}"


class BlobWriter:
    """Streams bytes into a temporary file while hashing them; :meth:`commit` publishes the blob.

    Use as a context manager: leaving it without a commit removes the temporary file. The
    store's lock is held shared from creation to commit or abort.
    """

    def __init__(self, store: Store, expected_digest: str | None = None) -> None:
        self._store = store
        self._expected = normalize_digest(expected_digest) if expected_digest else None
        self._hash = hashlib.sha256()
        self.size = 0
        """Bytes written so far."""
        self._held = contextlib.ExitStack()
        self._held.enter_context(store.writing())
        try:
            self.temp_path = store.temp_path()
            """Where the bytes go until they are verified."""
            self._fd: int | None = store.ops.create(self.temp_path)
        except OSError as exc:
            self._held.close()
            raise store.write_error(exc, "a blob") from exc

    def write(self, data: bytes | memoryview) -> None:
        """Append ``data`` to the blob being written."""
        assert self._fd is not None, "writer already closed"
        try:
            self._store.ops.write_all(self._fd, data)
        except OSError as exc:
            self.abort()
            raise self._store.write_error(exc, "a blob") from exc
        self._hash.update(data)
        self.size += len(data)

    def commit(self) -> str:
        """Verify the digest and atomically move the file into ``blobs/``. Returns the digest."""
        assert self._fd is not None, "writer already closed"
        try:
            try:
                self._store.ops.fsync(self._fd)
                os.fchmod(self._fd, 0o644)
            finally:
                os.close(self._fd)
                self._fd = None
            digest = f"sha256:{self._hash.hexdigest()}"
            if self._expected is not None and digest != self._expected:
                raise DigestMismatchError(self._expected, digest)
            self._store.publish(self.temp_path, digest, synced=True)
            return digest
        except OSError as exc:
            raise self._store.write_error(exc, "a blob") from exc
        finally:
            self.abort()

    def abort(self) -> None:
        """Drop everything written so far (nothing once committed)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        self.temp_path.unlink(missing_ok=True)
        self._held.close()

    def __enter__(self) -> BlobWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.abort()


class Store:
    """Blobs and manifests under one root directory.

    ``ops`` is the file-operation seam (tests pass a failing one); ``pause`` the test hook that
    stops a write at a named step (``LOCALLLM_TEST_PAUSE``; see :mod:`localllm.store.storage`).
    """

    def __init__(
        self, root: Path, *, ops: FileOps | None = None, pause: PauseHook | None = None
    ) -> None:
        self.root = Path(root)
        """The store's root directory."""
        self.blobs_dir = self.root / "blobs"
        """Content-addressed blobs."""
        self.manifests_dir = self.root / "manifests"
        """Manifests by host/namespace/model/tag."""
        self.partial_dir = self.root / "partial"
        """Temporary files and resumable downloads."""
        self.locks_dir = self.root / "locks"
        """One lock file per model name being changed."""
        self.ops = ops or FileOps()
        """The file operations every write goes through."""
        self._pause = pause
        self._local = threading.local()
        self._state = threading.Lock()
        self._writers = 0
        self._deferred: set[str] = set()

    # -- errors and test hooks ------------------------------------------------------------

    def checkpoint(self, step: str) -> None:
        """A write reached ``step`` (one of :data:`~localllm.store.storage.PAUSE_STEPS`)."""
        if self._pause is not None:
            self._pause(step)

    def write_error(self, exc: BaseException, what: str) -> BaseException:
        """The store's error for an ``OSError`` met while writing ``what`` (others as they are)."""
        if isinstance(exc, StoreError) or not isinstance(exc, OSError):
            return exc
        if disk_full(exc):
            error = DiskFullError(
                f"disk full while writing {what} in {self.root}; free some space and try again"
            )
            error.low_level = True  # type: ignore[attr-defined]  # the transaction says more
            return error
        if exc.errno in _UNWRITABLE:
            return StoreUnwritableError(
                f"cannot write to the model store at {self.root}: {exc.strerror or exc}"
            )
        return exc

    # -- locking --------------------------------------------------------------------------

    @contextlib.contextmanager
    def _lock(self, mode: int) -> Iterator[bool]:
        path = self.root / ".lock"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o600)
        except OSError as exc:
            raise self.write_error(exc, "the store's lock file") from exc
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
        """Hold while temporary files or not yet referenced blobs exist: collection waits.

        When the last writer of this process leaves, blobs that failed or finished changes
        no longer need are collected (if no other process is writing then).
        """
        with self._state:
            self._writers += 1
        try:
            with self._lock(fcntl.LOCK_SH):
                yield
        finally:
            with self._state:
                self._writers -= 1
                collect = self._writers == 0 and bool(self._deferred)
            if collect:
                with contextlib.suppress(OSError, StoreError):  # never hides the change's error
                    self._collect_deferred()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[bool]:
        """Try to hold the store's lock alone, without waiting: True when no change is in
        progress in any process (then, and only then, collecting and sweeping are safe)."""
        with self._lock(fcntl.LOCK_EX | fcntl.LOCK_NB) as acquired:
            yield acquired

    def _collect_deferred(self) -> None:
        with self.exclusive() as acquired:
            if not acquired:
                return  # another process writes: the next writer to finish here tries again
            with self._state:
                candidates = set(self._deferred)
            referenced = self.referenced_digests()
            for digest in candidates - referenced:
                with contextlib.suppress(OSError):  # left for `localllm prune` to report
                    self.blob_path(digest).unlink(missing_ok=True)
            with self._state:
                self._deferred -= candidates

    def _defer(self, digests: Iterable[str]) -> None:
        with self._state:
            self._deferred |= set(digests)

    @contextlib.contextmanager
    def _claims(self, names: dict[str, bool], what: str) -> Iterator[None]:
        """Lock files for model names (True: exclusively), without waiting; re-entrant in a
        thread. Raises :class:`StoreBusyError` naming who holds one."""
        held: dict[str, list[int]] = self._local.__dict__.setdefault("claims", {})
        taken: list[str] = []
        try:
            for key, exclusive in sorted(names.items()):
                if key in held:
                    if exclusive and not held[key][1]:
                        raise StoreBusyError(f"{key} is already in use by this change")
                    held[key][2] += 1
                    taken.append(key)
                    continue
                fd = self._claim_file(key, exclusive, what)
                held[key] = [fd, int(exclusive), 1]
                taken.append(key)
            yield
        finally:
            for key in reversed(taken):
                held[key][2] -= 1
                if held[key][2] == 0:
                    os.close(held.pop(key)[0])

    def _claim_file(self, key: str, exclusive: bool, what: str) -> int:
        path = self.locks_dir / hashlib.sha256(key.encode()).hexdigest()[:32]
        try:
            self.locks_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise self.write_error(exc, f"the lock of {key}") from exc
        holder = claim(fd, what, exclusive=exclusive)
        if holder is not None:
            os.close(fd)
            short = parse_name(key).short
            raise StoreBusyError(
                f"{short} is being changed by another request ({holder or 'another change'}); "
                "try again when it finishes"
            )
        return fd

    @contextlib.contextmanager
    def transaction(
        self,
        what: str,
        *,
        change: Iterable[ModelName] = (),
        read: Iterable[ModelName] = (),
        joinable: bool = False,
        kept_on_failure: str = "",
    ) -> Iterator[Transaction]:
        """One change of the store: claims names, holds the writers' lock, cleans up.

        ``change`` names are claimed exclusively (shared with other ``joinable`` changes when
        ``joinable``: pulls of one name), ``read`` names shared (a source must not be removed
        meanwhile). Inside, blobs are written and :meth:`Transaction.commit` writes the
        manifest last. On failure, the blobs the change published are removed again (unless
        something references them); a full disk becomes one :class:`DiskFullError` saying
        what was being done and what was kept (``kept_on_failure``, else "nothing"). Nested
        transactions in one thread join the outer one.
        """
        names = {n.full: not joinable for n in change}
        for name in read:
            names.setdefault(name.full, False)
        outer: Transaction | None = getattr(self._local, "transaction", None)
        with self._claims(names, what):
            if outer is not None:
                yield outer
                return
            with self.writing():
                tx = Transaction(self, what)
                self._local.transaction = tx
                try:
                    yield tx
                except BaseException as exc:
                    self._defer(tx.published)
                    if isinstance(exc, DiskFullError) and getattr(exc, "low_level", False):
                        raise self._disk_full(what, kept_on_failure) from exc
                    raise
                else:
                    self._defer(tx.discarded)
                finally:
                    self._local.transaction = None

    def _disk_full(self, what: str, kept: str) -> DiskFullError:
        try:
            free = f"{human_size(self.free_space())} free"
        except OSError:
            free = "no space left"
        kept = kept or "what it wrote is removed and the store is as it was"
        return DiskFullError(
            f"disk full while {what} ({free} in {self.root}): {kept}; free some space and try again"
        )

    def _note_published(self, digest: str) -> None:
        tx: Transaction | None = getattr(self._local, "transaction", None)
        if tx is not None:
            tx.published.add(digest)

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
        :class:`BlobWriter` (a hard link, a reflink, llama.cpp's output). Create it only while
        holding :meth:`writing`: collection sweeps every such file nobody is writing."""
        try:
            self._makedirs(self.partial_dir)
        except OSError as exc:
            raise self.write_error(exc, "a temporary file") from exc
        return self.partial_dir / _temp_name()

    def _makedirs(self, path: Path) -> None:
        """``mkdir -p``, making each new directory's entry durable in its parent."""
        if path.is_dir():
            return
        self._makedirs(path.parent)
        try:
            path.mkdir()
        except FileExistsError:
            return
        self.ops.fsync_dir(path.parent)

    def publish(self, temp: Path, digest: str, *, synced: bool = False) -> bool:
        """Move ``temp`` (in ``partial/``, its bytes already verified to hash to ``digest``)
        into ``blobs/`` atomically, fsyncing it first unless ``synced``. False when the blob was
        already there (``temp`` is then removed: the bytes are the same)."""
        target = self.blob_path(digest)
        try:
            self._makedirs(target.parent)
            with contextlib.suppress(FileNotFoundError):
                if target.stat().st_size == temp.stat().st_size:
                    temp.unlink(missing_ok=True)
                    return False
                # A blob of another size under this digest cannot be right: replace it.
            if not synced:
                fd = os.open(temp, os.O_RDONLY)
                try:
                    self.ops.fsync(fd)
                finally:
                    os.close(fd)
            self.checkpoint("blob-written")
            self.ops.replace(temp, target)
        except OSError as exc:
            raise self.write_error(exc, f"blob {digest[7:19]}") from exc
        self.ops.fsync_dir(target.parent)
        self._note_published(normalize_digest(digest))
        self.checkpoint("blob-published")
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

    def verify(self, set_aside_bad: bool = False) -> list[VerifyResult]:
        """Re-hash every blob; optionally set aside (in ``partial/``) those whose bytes no
        longer match their digest, so no model is served with them."""
        results = []
        for digest in self.iter_blobs():
            path = self.blob_path(digest)
            hasher = hashlib.sha256()
            try:
                with open(path, "rb") as blob:
                    for chunk in iter(lambda: blob.read(_CHUNK), b""):
                        hasher.update(chunk)
                size = path.stat().st_size
            except FileNotFoundError:
                continue  # removed meanwhile
            ok = f"sha256:{hasher.hexdigest()}" == digest
            if not ok and set_aside_bad:
                self._makedirs(self.partial_dir)
                os.replace(path, self.partial_dir / f"{CORRUPT_PREFIX}{path.name}")
            results.append(VerifyResult(digest=digest, ok=ok, size=size))
        return results

    # -- manifests ------------------------------------------------------------------------

    def manifest_path(self, name: ModelName) -> Path:
        """Path of the manifest for ``name`` (its parts are validated by the name grammar)."""
        return self.manifests_dir.joinpath(*name.path_parts)

    def write_manifest(self, name: ModelName, manifest: Manifest) -> str:
        """Atomically write ``manifest`` for ``name``; every blob must exist. Returns its digest.

        The blobs of a manifest it replaces that it no longer names are collected afterwards
        (when nothing else references them).
        """
        with self.writing():
            missing = [d for d in sorted(manifest.digests) if not self.has_blob(d)]
            if missing:
                raise BlobNotFoundError(
                    f"cannot write manifest for {name.short}: missing blob {missing[0]}"
                )
            raw = manifest.to_bytes()
            path = self.manifest_path(name)
            replaced = self._manifest_digests(path)
            try:
                self._makedirs(path.parent)
                atomic_write(
                    self.ops, path, raw, before_rename=lambda: self.checkpoint("manifest-written")
                )
            except OSError as exc:
                raise self.write_error(exc, f"the manifest of {name.short}") from exc
            tx: Transaction | None = getattr(self._local, "transaction", None)
            (tx.discard if tx is not None else self._defer)(replaced - manifest.digests)
            self.checkpoint("manifest-published")
        return f"sha256:{hashlib.sha256(raw).hexdigest()}"

    def _manifest_digests(self, path: Path) -> set[str]:
        try:
            return Manifest.from_bytes(path.read_bytes()).digests
        except (OSError, StoreError):
            return set()

    def entry(self, name: ModelName) -> ModelEntry:
        """``name``'s manifest as written, whether its blobs are whole or not (:meth:`get`
        checks them); raises :class:`ModelNotFoundError`, or :class:`StoreError` when the
        manifest cannot be read."""
        path = self.manifest_path(name)
        try:
            raw = path.read_bytes()
            modified = path.stat().st_mtime
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise ModelNotFoundError(name.short) from None
        manifest = Manifest.from_bytes(raw)
        return ModelEntry(
            name=name,
            manifest=manifest,
            digest=f"sha256:{hashlib.sha256(raw).hexdigest()}",
            modified=modified,
        )

    def damage(self, manifest: Manifest) -> str | None:
        """What is wrong with the blobs of ``manifest`` (missing, wrong size, set aside as
        corrupted), or None when each is there with the size the manifest says."""
        for layer in (manifest.config, *manifest.layers):
            path = self.blob_path(layer.digest)
            short = layer.digest.removeprefix("sha256:")[:12]
            kind = layer.media_type.rsplit(".", 1)[-1] or "config"
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                corrupt = self.partial_dir / f"{CORRUPT_PREFIX}{path.name}"
                if corrupt.exists():
                    return (
                        f"its {kind} blob {short} does not match its sha256 digest "
                        "(set aside by `localllm doctor`)"
                    )
                return f"its {kind} blob {short} is missing"
            if size != layer.size:
                return (
                    f"its {kind} blob {short} is {human_size(size)}, "
                    f"the manifest says {human_size(layer.size)}"
                )
        return None

    def get(self, name: ModelName | str) -> ModelEntry:
        """The model called ``name``; raises :class:`ModelNotFoundError` if absent and
        :class:`DamagedModelError` if a blob of it is missing or damaged."""
        parsed = parse_name(name) if isinstance(name, str) else name
        entry = self.entry(parsed)
        problem = self.damage(entry.manifest)
        if problem is not None:
            raise DamagedModelError(parsed.short, problem)
        return entry

    def exists(self, name: ModelName | str) -> bool:
        """True if the store holds a manifest for ``name`` (whole or not)."""
        parsed = parse_name(name) if isinstance(name, str) else name
        return self.manifest_path(parsed).is_file()

    def manifests(self) -> Iterator[tuple[ModelName | Path, ModelEntry | StoreError]]:
        """Every manifest on disk: its name (its path when the path is no valid name) and its
        entry, or the error that keeps it from being read. Damaged models included."""
        if not self.manifests_dir.is_dir():
            return
        for path in sorted(self.manifests_dir.glob("*/*/*/*")):
            if not path.is_file() or path.name.startswith("."):
                continue
            host, namespace, model, tag = path.relative_to(self.manifests_dir).parts
            try:
                name = parse_name(f"{host}/{namespace}/{model}:{tag}")
            except ValueError:
                yield path, StoreError(f"{path} is not named like a model")
                continue
            try:
                yield name, self.entry(name)
            except ModelNotFoundError:
                continue  # removed meanwhile
            except StoreError as exc:
                yield name, exc

    def list(self) -> list[ModelEntry]:
        """Every whole model, newest first. Unreadable and damaged ones are left out (the
        start-up check and ``localllm doctor`` report them by name)."""
        entries = [
            entry
            for _, entry in self.manifests()
            if isinstance(entry, ModelEntry) and self.damage(entry.manifest) is None
        ]
        entries.sort(key=lambda e: e.modified, reverse=True)
        return entries

    def copy(self, source: ModelName | str, destination: ModelName | str) -> ModelEntry:
        """Give the model ``source`` a second name (blobs are shared)."""
        origin = parse_name(source) if isinstance(source, str) else source
        target = parse_name(destination) if isinstance(destination, str) else destination
        with self.transaction(
            f"copying {origin.short} to {target.short}", change=[target], read=[origin]
        ) as tx:
            return tx.commit(target, self.get(origin).manifest)

    def delete(self, name: ModelName | str) -> ModelEntry | None:
        """Remove a name (whole, damaged or unreadable: then None is returned), then the blobs
        nothing else references."""
        parsed = parse_name(name) if isinstance(name, str) else name
        with self.transaction(f"removing {parsed.short}", change=[parsed]) as tx:
            path = self.manifest_path(parsed)
            try:
                entry: ModelEntry | None = self.entry(parsed)
            except StoreError:
                entry = None  # unreadable: removing it is the fix
            if entry is None and not path.is_file():
                raise ModelNotFoundError(parsed.short)
            try:
                self.ops.unlink(path)
            except FileNotFoundError:
                raise ModelNotFoundError(parsed.short) from None
            except OSError as exc:
                raise self.write_error(exc, f"the manifest of {parsed.short}") from exc
            self.ops.fsync_dir(path.parent)
            # Prune the now-empty model/namespace/host directories, never above manifests/.
            for parent in list(path.parents)[:3]:
                with contextlib.suppress(OSError):
                    parent.rmdir()
            if entry is not None:
                tx.discard(entry.manifest.digests)
            return entry

    def referenced_digests(self) -> set[str]:
        """Digests referenced by any readable manifest, damaged ones included."""
        referenced: set[str] = set()
        for _, entry in self.manifests():
            if isinstance(entry, ModelEntry):
                referenced |= entry.manifest.digests
        return referenced

    def free_space(self) -> int:
        """Bytes free on the store's filesystem."""
        existing = self.root
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        return self.ops.free_space(existing)

    def touch(self, name: ModelName) -> None:
        """Mark a model as just modified (used after re-creating an identical manifest)."""
        now = time.time()
        os.utime(self.manifest_path(name), (now, now))
