"""Import the models of an existing Ollama store without downloading them again.

Ollama keeps its models in the layout localllm's store copies::

    <root>/manifests/<host>/<namespace>/<model>/<tag>     JSON, schemaVersion 2
    <root>/blobs/sha256-<hex>                             content-addressed

so an import is: read each manifest, bring every blob it names into localllm's store, verify
the bytes (streaming sha256, with progress), and write the same manifest under the same name
(``registry.ollama.ai/library/llama3.2:1b`` is ``llama3.2:1b`` here too).

A blob comes over by the cheapest means that works, tried in order:

1. a **hard link** (same file system): no new disk used, and each side may delete its copy
   without touching the other (a link count, not a shared directory entry);
2. a **reflink** (``ioctl(FICLONE)`` on Linux btrfs/XFS/bcachefs, ``clonefile`` on macOS APFS):
   a new file sharing the extents copy-on-write, so no new disk until one side changes;
3. a **copy**, hashed while it is written.

The linked or cloned file is assembled in ``partial/`` and hashed *there*, so what is verified
is exactly what gets published (by an atomic rename), as :mod:`localllm.store.store` promises for
every blob. The import holds the store's shared lock while its blobs are not yet referenced by a
manifest: a daemon deleting a model meanwhile skips its garbage collection instead of removing
them, so importing while a daemon runs is safe.

A broken Ollama store does not stop the import: a model whose manifest is unreadable, whose
blob is missing or corrupted, or whose GGUF cannot be read is skipped with one reason, and the
rest is imported. Re-running is idempotent: a model whose manifest localllm already has is
"already imported" and nothing is read or copied again.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import hashlib
import os
import platform
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import BinaryIO, Literal

from .._exceptions import (
    AdapterError,
    GGUFError,
    InvalidNameError,
    LocalLLMError,
    OperationCancelledError,
    StoreError,
)
from .._format import human_size
from ..settings import Settings
from ..sources.progress import PullProgress, RateMeter
from .adapters import check_adapter
from .manifest import MAX_MANIFEST_BYTES, MEDIA_ADAPTER, MEDIA_MODEL, Layer, Manifest
from .names import ModelName, parse_name
from .store import Store

__all__ = [
    "ImportReport",
    "LinkMethod",
    "ModelOutcome",
    "OllamaImporter",
    "OllamaModel",
    "find_ollama_store",
    "is_ollama_store",
    "missing_models",
    "scan_ollama_store",
]

_CHUNK = 1 << 20
# Progress events at most this often per blob (plus the last one): a 5 GB blob hashes in a few
# seconds, and thousands of events would only keep the terminal and the TUI busy.
_PROGRESS_INTERVAL = 0.1

# os.link fails with these when a hard link is not possible here, as opposed to a real error:
# another file system, links protected (fs.protected_hardlinks, someone else's file), a file
# system without links (FAT, some network mounts), or the file's link count at its maximum.
_NO_LINK = frozenset(
    {errno.EXDEV, errno.EPERM, errno.EACCES, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP}
)


class LinkMethod(Enum):
    """How one blob came into localllm's store."""

    LINKED = "linked"
    """A hard link to Ollama's file (same file system): no new disk."""
    REFLINKED = "reflinked"
    """A copy-on-write clone (btrfs, XFS, APFS): no new disk until one side changes."""
    COPIED = "copied"
    """A plain copy: the blob's size in new disk."""


@dataclass(frozen=True)
class OllamaModel:
    """One manifest of the Ollama store, read (or not)."""

    label: str
    """The model's name as people write it, or its manifest path when that is no valid name."""
    path: Path
    """The manifest file."""
    name: ModelName | None = None
    """The validated name (``None`` when the path is not one)."""
    manifest: Manifest | None = None
    """The parsed manifest (``None`` when it could not be read)."""
    problem: str | None = None
    """Why the model cannot be imported, known from the manifest alone."""

    @property
    def size(self) -> int:
        """Bytes of the model's blobs (0 when its manifest is unreadable)."""
        return self.manifest.size if self.manifest is not None else 0


Status = Literal["imported", "present", "skipped"]


@dataclass(frozen=True)
class ModelOutcome:
    """What the import did with one model."""

    label: str
    """The model's name."""
    status: Status
    """``imported``, ``present`` (already imported) or ``skipped``."""
    reason: str = ""
    """Why it was skipped."""
    methods: tuple[LinkMethod, ...] = ()
    """How its new blobs came over (empty when every blob was already in the store)."""
    size: int = 0
    """Bytes of the model's blobs."""
    new_bytes: int = 0
    """Disk newly used for it (copied blobs)."""

    def describe(self) -> str:
        """``imported (linked, 1.3 GB)``, ``already imported``, ``skipped: <why>``."""
        if self.status == "present":
            return "already imported"
        if self.status == "skipped":
            return f"skipped: {self.reason}"
        how = ", ".join(m.value for m in self.methods) or "blobs already in the store"
        return f"imported ({how}, {human_size(self.size)})"


@dataclass
class ImportReport:
    """Every model's outcome, the time taken and the disk used."""

    root: Path
    """The Ollama store read."""
    outcomes: list[ModelOutcome] = field(default_factory=list)
    """One per model, in name order."""
    seconds: float = 0.0
    """Wall time of the whole import."""

    def count(self, status: Status) -> int:
        """How many models ended with ``status``."""
        return sum(1 for o in self.outcomes if o.status == status)

    @property
    def skipped(self) -> list[ModelOutcome]:
        """The models that were not imported, with their reasons."""
        return [o for o in self.outcomes if o.status == "skipped"]

    @property
    def new_bytes(self) -> int:
        """Disk newly used by the import (copied blobs; links and clones use none)."""
        return sum(o.new_bytes for o in self.outcomes)

    @property
    def imported_bytes(self) -> int:
        """Bytes of the models imported by this run."""
        return sum(o.size for o in self.outcomes if o.status == "imported")

    def summary(self) -> str:
        """The total line: counts, time, bytes brought over and new disk used."""
        parts = [f"imported {self.count('imported')}"]
        if self.count("present"):
            parts.append(f"{self.count('present')} already present")
        if self.count("skipped"):
            parts.append(f"{self.count('skipped')} skipped")
        return (
            f"{', '.join(parts)} in {self.seconds:.1f}s; "
            f"{human_size(self.imported_bytes)} of models, "
            f"{human_size(self.new_bytes)} of new disk used"
        )


# -- finding and reading the Ollama store ---------------------------------------------------


def is_ollama_store(path: Path) -> bool:
    """True when ``path`` looks like Ollama's models folder (it has ``manifests/``)."""
    try:
        return (path / "manifests").is_dir()
    except OSError:
        return False


def find_ollama_store(settings: Settings) -> Path | None:
    """The first of :attr:`Settings.ollama_model_dirs` that is an Ollama store, if any."""
    return next((p for p in settings.ollama_model_dirs if is_ollama_store(p)), None)


def _manifest_files(root: Path) -> Iterator[tuple[Path, tuple[str, str, str, str]]]:
    """``manifests/<host>/<namespace>/<model>/<tag>`` files, never following links outward."""
    base = root / "manifests"
    for dirpath, dirnames, filenames in os.walk(base):
        depth = len(Path(dirpath).relative_to(base).parts)
        if depth >= 3:
            dirnames.clear()  # tags are files four levels down; nothing deeper is a manifest
        if depth != 3:
            continue
        for filename in filenames:
            if not filename.startswith("."):
                path = Path(dirpath) / filename
                host, namespace, model = path.parent.relative_to(base).parts
                yield path, (host, namespace, model, filename)


def _read_model(path: Path, parts: tuple[str, str, str, str]) -> OllamaModel:
    host, namespace, model, tag = parts
    try:
        name = parse_name(f"{host}/{namespace}/{model}:{tag}")
    except InvalidNameError as exc:
        return OllamaModel(label="/".join(parts), path=path, problem=f"not a valid name: {exc}")
    label = name.short
    try:
        if path.stat().st_size > MAX_MANIFEST_BYTES:
            return OllamaModel(label, path, name, problem="its manifest is larger than 1 MiB")
        manifest = Manifest.from_bytes(path.read_bytes())
    except OSError as exc:
        return OllamaModel(label, path, name, problem=f"cannot read its manifest: {exc.strerror}")
    except StoreError as exc:
        return OllamaModel(label, path, name, problem=f"unreadable manifest: {exc}")
    if manifest.layer(MEDIA_MODEL) is None:
        # Ollama's safetensors-based or adapter-only models: nothing llama.cpp can load here.
        return OllamaModel(label, path, name, manifest, problem="it has no GGUF model layer")
    return OllamaModel(label, path, name, manifest)


def scan_ollama_store(root: Path) -> list[OllamaModel]:
    """Every manifest of the Ollama store at ``root``, read and checked, in name order."""
    models = [_read_model(path, parts) for path, parts in _manifest_files(root)]
    return sorted(models, key=lambda m: m.label)


def missing_models(root: Path, store: Store) -> list[OllamaModel]:
    """The importable models of the Ollama store that ``store`` has no model of that name for
    (what the TUI offers to import)."""
    return [
        m
        for m in scan_ollama_store(root)
        if m.problem is None and m.name is not None and not store.exists(m.name)
    ]


# -- bringing one blob over -----------------------------------------------------------------


def _ficlone_request() -> int | None:
    """The FICLONE ioctl number (``_IOW(0x94, 9, int)``), whose encoding depends on the CPU."""
    if not sys.platform.startswith("linux"):
        return None
    machine = platform.machine().lower()
    # _IOC_WRITE is 4 (at bit 29) on these, 1 (at bit 30) on x86, ARM, RISC-V and the rest.
    if machine.startswith(("ppc", "powerpc", "mips", "sparc", "alpha")):
        return 0x80049409
    return 0x40049409


def _reflink(source: Path, temp: Path) -> bool:
    """Clone ``source`` to the new file ``temp`` copy-on-write; False when this file system (or
    platform) cannot, leaving no ``temp`` behind."""
    request = _ficlone_request()
    if request is not None:
        with open(source, "rb") as src:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                fcntl.ioctl(fd, request, src.fileno())
                return True
            except OSError:
                # EOPNOTSUPP (ext4, tmpfs), EXDEV (another file system), EINVAL...: copy instead.
                os.close(fd)
                fd = -1
                temp.unlink(missing_ok=True)
                return False
            finally:
                if fd >= 0:
                    os.close(fd)
    if sys.platform == "darwin":
        # APFS: clonefile(2) creates the destination itself (it must not exist yet).
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        if libc.clonefile(os.fsencode(source), os.fsencode(temp), 0) == 0:
            return True
        temp.unlink(missing_ok=True)
    return False


class _Skip(Exception):
    """This model cannot be imported; the message says why (one line)."""


class OllamaImporter:
    """Imports models from the Ollama store at ``root`` into ``store``.

    ``progress`` receives pull-shaped events (``importing <name>`` status lines, then a
    ``verifying <hex12>`` bar per blob), so the CLI's progress display and the TUI's transfer
    panel show them as they show a pull. Setting ``cancel`` stops the import at the next chunk
    (:class:`~localllm.OperationCancelledError`), leaving no partial blob behind.
    """

    def __init__(
        self,
        root: Path,
        store: Store,
        *,
        progress: Callable[[PullProgress], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> None:
        self.root = Path(root)
        """The Ollama store."""
        self.store = store
        """localllm's store."""
        self._progress = progress
        self._cancel = cancel

    def run(self, names: Iterable[str] = ()) -> ImportReport:
        """Import every model of the Ollama store (only those in ``names``, when given)."""
        if not is_ollama_store(self.root):
            raise LocalLLMError(
                f"{self.root} is not an Ollama models folder (it has no manifests/ folder)"
            )
        wanted = {parse_name(n) for n in names}
        started = time.monotonic()
        report = ImportReport(root=self.root)
        models = scan_ollama_store(self.root)
        if wanted:
            found = {m.name for m in models}
            unknown = sorted(str(n) for n in wanted - found)
            if unknown:
                raise LocalLLMError(f"the Ollama store at {self.root} has no {', '.join(unknown)}")
            models = [m for m in models if m.name in wanted]
        for model in models:
            report.outcomes.append(self.import_model(model))
        report.seconds = time.monotonic() - started
        return report

    def import_model(self, model: OllamaModel) -> ModelOutcome:
        """Import one model; never raises for a problem of that model alone (it is skipped)."""
        if model.problem is not None or model.manifest is None or model.name is None:
            return ModelOutcome(model.label, "skipped", reason=model.problem or "unreadable")
        try:
            return self._import(model.label, model.name, model.manifest)
        except _Skip as exc:
            return ModelOutcome(model.label, "skipped", reason=str(exc), size=model.size)

    # -- one model ----------------------------------------------------------------------

    def _import(self, label: str, name: ModelName, manifest: Manifest) -> ModelOutcome:
        # Under the shared lock from the first check to the manifest: a concurrent garbage
        # collection (a daemon deleting a model) can neither remove a blob counted as present
        # nor one published here before the manifest references it.
        with self.store.transaction(f"importing {label}", change=[name]) as tx:
            if self.store.exists(name) and self._already_imported(label, name, manifest):
                return ModelOutcome(label, "present", size=manifest.size)
            self._emit(PullProgress(f"importing {label}"))
            todo = [x for x in _unique_layers(manifest) if not self.store.has_blob(x.digest)]
            sources = [(layer, self._source(layer)) for layer in todo]  # all there, else skip
            # Every blob is verified in partial/ before any is published, so a model skipped
            # for its third blob leaves no stray blobs of its first two.
            verified: list[tuple[Path, Layer, LinkMethod]] = []
            try:
                for layer, source in sources:
                    temp = self.store.temp_path()
                    verified.append((temp, layer, self._adopt(source, temp, layer)))
                self._check_gguf(manifest, {layer.digest: temp for temp, layer, _ in verified})
                for temp, layer, _ in verified:
                    self.store.publish(temp, layer.digest)
                tx.commit(name, manifest)
            finally:
                for temp, _, _ in verified:
                    temp.unlink(missing_ok=True)  # gone already once published
        methods = tuple(dict.fromkeys(method for _, _, method in verified))
        new_bytes = sum(layer.size for _, layer, m in verified if m is LinkMethod.COPIED)
        return ModelOutcome(
            label, "imported", methods=methods, size=manifest.size, new_bytes=new_bytes
        )

    def _already_imported(self, label: str, name: ModelName, manifest: Manifest) -> bool:
        """True when localllm has this very model; False when it has its manifest but lost a
        blob (the import then repairs it); skips when the name holds another model."""
        try:
            existing = self.store.entry(name).manifest
        except StoreError:
            existing = None
        if existing != manifest:
            # Never overwrite a model the user pulled or created under the same name.
            raise _Skip(
                f"localllm already has a different {label} (remove it with "
                f"`localllm rm {label}` to import Ollama's)"
            )
        return all(self.store.has_blob(d) for d in manifest.digests)

    def _source(self, layer: Layer) -> Path:
        short = layer.digest.removeprefix("sha256:")[:12]
        path = self.root / "blobs" / layer.digest.replace(":", "-")
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise _Skip(f"blob {short} is missing from the Ollama store") from None
        except OSError as exc:
            raise _Skip(f"cannot read blob {short}: {exc.strerror}") from None
        if size != layer.size:
            raise _Skip(
                f"blob {short} is {size} bytes but its manifest says {layer.size} "
                "(an unfinished or corrupted download)"
            )
        return path

    def _check_gguf(self, manifest: Manifest, pending: dict[str, Path]) -> None:
        """Read the GGUF's header defensively before anything may load it (from its verified
        file in ``pending`` when not yet published)."""
        from ..gguf_info import inspect_gguf

        layer = manifest.layer(MEDIA_MODEL)
        assert layer is not None  # models without one were skipped when scanned
        try:
            info = inspect_gguf(pending.get(layer.digest) or self.store.blob_path(layer.digest))
        except GGUFError as exc:
            raise _Skip(f"its model layer is not a GGUF localllm can read: {exc}") from None
        # Its LoRA adapters are checked against the weights now, as a create checks them: an
        # adapter llama.cpp would refuse at load time keeps the model out, with the reason.
        adapters = manifest.layers_of(MEDIA_ADAPTER)
        rest = manifest.layers_of(MEDIA_MODEL)[1:] if adapters else []
        try:
            parts = [info]
            for part in rest:
                parts.append(
                    inspect_gguf(pending.get(part.digest) or self.store.blob_path(part.digest))
                )
        except GGUFError as exc:
            raise _Skip(
                f"a part of its model layer is not a GGUF localllm can read: {exc}"
            ) from None
        for adapter in adapters:
            path = pending.get(adapter.digest) or self.store.blob_path(adapter.digest)
            try:
                check_adapter(path, parts, adapter.digest.removeprefix("sha256:")[:12])
            except AdapterError as exc:
                raise _Skip(str(exc)) from None

    # -- one blob -----------------------------------------------------------------------

    def _adopt(self, source: Path, temp: Path, layer: Layer) -> LinkMethod:
        """Bring ``source`` to ``temp`` (in ``partial/``) and verify it as ``layer``'s blob;
        returns how. The caller publishes or removes ``temp``."""
        try:
            method = self._link_or_clone(source, temp)
            if method is None:
                method = LinkMethod.COPIED
                digest = self._copy(source, temp, layer)
            else:
                digest = self._hash(temp, layer)
            if digest != layer.digest:
                raise _Skip(
                    f"blob {layer.digest.removeprefix('sha256:')[:12]} is corrupted "
                    "(its sha256 does not match its name)"
                )
            if method is not LinkMethod.LINKED:
                os.chmod(temp, 0o644)  # a link keeps Ollama's inode and mode: not ours to change
            return method
        except OSError as exc:
            temp.unlink(missing_ok=True)
            error = self.store.write_error(exc, f"blob {layer.digest[7:19]}")
            if isinstance(error, StoreError):
                raise error from exc
            raise _Skip(f"cannot import blob {layer.digest[7:19]}: {exc}") from None
        except BaseException:
            temp.unlink(missing_ok=True)
            raise

    def _link_or_clone(self, source: Path, temp: Path) -> LinkMethod | None:
        """A hard link, else a reflink, at ``temp``; None when neither is possible here."""
        try:
            self.store.ops.link(source, temp)
            return LinkMethod.LINKED
        except OSError as exc:
            if exc.errno not in _NO_LINK:
                raise
        if _reflink(source, temp):
            return LinkMethod.REFLINKED
        return None

    def _hash(self, path: Path, layer: Layer) -> str:
        hasher = hashlib.sha256()
        with open(path, "rb") as handle:
            for chunk in self._chunks(handle, layer):
                hasher.update(chunk)
        return f"sha256:{hasher.hexdigest()}"

    def _copy(self, source: Path, temp: Path, layer: Layer) -> str:
        """Copy while hashing (one read of the source); fsynced before it may be published."""
        hasher = hashlib.sha256()
        ops = self.store.ops
        with open(source, "rb") as src:
            fd = ops.create(temp)
            try:
                for chunk in self._chunks(src, layer):
                    ops.write_all(fd, chunk)
                    hasher.update(chunk)
                ops.fsync(fd)
            finally:
                os.close(fd)
        return f"sha256:{hasher.hexdigest()}"

    def _chunks(self, handle: BinaryIO, layer: Layer) -> Iterator[bytes]:
        """The file's chunks, with progress events and cancellation between them."""
        read = handle.read
        status = f"verifying {layer.digest.removeprefix('sha256:')[:12]}"
        meter = RateMeter()
        done = 0
        last = 0.0
        self._emit(PullProgress(status, layer.digest, layer.size, 0))
        while chunk := read(_CHUNK):
            if self._cancel is not None and self._cancel.is_set():
                raise OperationCancelledError("import cancelled")
            yield chunk
            done += len(chunk)
            now = time.monotonic()
            meter.add(done, now)
            if now - last >= _PROGRESS_INTERVAL:
                last = now
                self._emit(PullProgress(status, layer.digest, layer.size, done, meter.rate()))
        self._emit(PullProgress(status, layer.digest, layer.size, done, meter.rate()))

    def _emit(self, event: PullProgress) -> None:
        if self._progress is not None:
            self._progress(event)


def _unique_layers(manifest: Manifest) -> list[Layer]:
    """The config and the layers, each digest once (two layers may share a blob)."""
    seen: set[str] = set()
    unique = []
    for layer in (manifest.config, *manifest.layers):
        if layer.digest not in seen:
            seen.add(layer.digest)
            unique.append(layer)
    return unique
