"""Checking and cleaning the model store: the daemon's start-up check, ``doctor``, ``prune``.

:func:`check_store` looks at everything under the store's root and says, one line each, what is
not as the store promises: temporary files a killed write left (removed: nobody can finish
them), blobs no manifest references (reported; ``localllm prune`` removes them), resumable
partial downloads, and models that must not be served (a blob missing, of the wrong size or,
with ``digests=True``, whose bytes do not match its digest), each by name with the fix. Sizes
are checked at every start (a few ``stat`` calls); full digests only when asked (``localllm
doctor``), since re-hashing gigabytes at every start would keep the daemon from answering.

:func:`prune` removes what :func:`check_store` reports as unused and says how much it freed.
Both take the store's lock exclusively, without waiting, so they never touch work in progress.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._exceptions import StoreBusyError
from .._format import human_size
from .._locks import try_lock
from .names import ModelName
from .store import CORRUPT_PREFIX, ModelEntry, Store

__all__ = ["DamagedModel", "PruneReport", "StoreReport", "check_store", "prune"]

# Below this much free space the check warns that creates and pulls will fail.
_LOW_SPACE = 64 << 20


@dataclass(frozen=True)
class DamagedModel:
    """A model that is never served, and why."""

    name: str
    """Its name (or its manifest's path, when that is no valid name)."""
    problem: str
    """What is wrong."""

    @property
    def fix(self) -> str:
        """What the user can do about it."""
        return f"remove it with `localllm rm {self.name}` and pull or create it again"


@dataclass
class StoreReport:
    """What :func:`check_store` found."""

    root: Path
    """The store's root."""
    models: int = 0
    """Whole models (served)."""
    damaged: list[DamagedModel] = field(default_factory=list)
    """Models that are never served."""
    unreferenced: list[tuple[str, int]] = field(default_factory=list)
    """Blobs no manifest references: (digest, bytes)."""
    partial_downloads: list[tuple[str, int]] = field(default_factory=list)
    """Resumable downloads: (file name, bytes so far)."""
    corrupt: list[tuple[str, int]] = field(default_factory=list)
    """Blobs set aside because their bytes do not match their digest: (file name, bytes)."""
    removed_temporaries: list[tuple[str, int]] = field(default_factory=list)
    """Temporary files of killed writes, removed by this check: (file name, bytes)."""
    verified: int | None = None
    """Blobs re-hashed (``digests=True``), else None."""
    busy: bool = False
    """Another process was writing, so temporary files were not swept this time."""
    error: str | None = None
    """Why the store cannot be used or written (one line naming its path), else None."""
    warning: str | None = None
    """A problem that does not stop the store (little free space)."""

    @property
    def ok(self) -> bool:
        """Nothing to report but whole models."""
        return not (self.damaged or self.unreferenced or self.corrupt or self.error)

    def lines(self) -> list[str]:
        """One line per finding, for the daemon's log and ``localllm doctor``."""
        lines = []
        if self.error:
            lines.append(self.error)
        if self.warning:
            lines.append(self.warning)
        for model in self.damaged:
            lines.append(f"model {model.name} is not served: {model.problem}; {model.fix}")
        if self.removed_temporaries:
            size = sum(s for _, s in self.removed_temporaries)
            lines.append(
                f"removed {len(self.removed_temporaries)} temporary file(s) of interrupted "
                f"writes ({human_size(size)})"
            )
        if self.busy:
            lines.append("another process is writing to the store: temporary files not checked")
        if self.unreferenced:
            size = sum(s for _, s in self.unreferenced)
            lines.append(
                f"{len(self.unreferenced)} blob(s) no model uses ({human_size(size)}); "
                "`localllm prune` removes them"
            )
        if self.corrupt:
            size = sum(s for _, s in self.corrupt)
            lines.append(
                f"{len(self.corrupt)} corrupted blob(s) set aside ({human_size(size)}); "
                "`localllm prune` removes them"
            )
        if self.partial_downloads:
            size = sum(s for _, s in self.partial_downloads)
            lines.append(
                f"{len(self.partial_downloads)} partial download(s) ({human_size(size)}) are "
                "kept so a pull resumes them; `localllm prune` removes them"
            )
        return lines

    def summary(self) -> str:
        """One line: how many models, and whether anything needs attention."""
        verified = f", {self.verified} blob(s) re-hashed" if self.verified is not None else ""
        state = "ok" if self.ok else "needs attention"
        return f"model store {self.root}: {self.models} model(s){verified}, {state}"

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        return {
            "root": str(self.root),
            "ok": self.ok,
            "models": self.models,
            "damaged": [{"name": m.name, "problem": m.problem, "fix": m.fix} for m in self.damaged],
            "unreferenced": [{"digest": d, "size": s} for d, s in self.unreferenced],
            "partial_downloads": [{"file": f, "size": s} for f, s in self.partial_downloads],
            "corrupt": [{"file": f, "size": s} for f, s in self.corrupt],
            "removed_temporaries": [{"file": f, "size": s} for f, s in self.removed_temporaries],
            "verified": self.verified,
            "busy": self.busy,
            "error": self.error,
            "warning": self.warning,
        }


@dataclass
class PruneReport:
    """What :func:`prune` removed."""

    blobs: list[tuple[str, int]] = field(default_factory=list)
    """Unreferenced blobs removed: (digest, bytes)."""
    other: list[tuple[str, int]] = field(default_factory=list)
    """Partial downloads, corrupted blobs and temporary files removed: (file name, bytes)."""

    @property
    def freed(self) -> int:
        """Bytes freed in all."""
        return sum(s for _, s in self.blobs) + sum(s for _, s in self.other)

    def summary(self) -> str:
        """One line: what was removed and how much it freed."""
        if not self.blobs and not self.other:
            return "nothing to prune: every blob belongs to a model"
        return (
            f"removed {len(self.blobs)} unused blob(s) and {len(self.other)} other file(s), "
            f"freed {human_size(self.freed)}"
        )

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-ready data (``/api/prune``'s answer)."""
        return {
            "blobs": [{"digest": d, "size": s} for d, s in self.blobs],
            "files": [{"file": f, "size": s} for f, s in self.other],
            "freed": self.freed,
            "summary": self.summary(),
        }


def _size(path: Path) -> int:
    try:
        if path.is_dir() and not path.is_symlink():  # a conversion's work folder
            return sum(_size(child) for child in path.iterdir() if not child.is_symlink())
        return path.stat().st_size
    except OSError:
        return 0


def _remove(path: Path) -> None:
    """Remove a temporary file, or a conversion's work folder (a checkout's links and its
    F16 file) left by a killed write."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _temporaries(store: Store) -> list[Path]:
    """Temporary files of writes: blobs in ``partial/``, manifests beside their target, small
    files (the starter's marker) in the root."""
    found = list(store.partial_dir.glob("tmp-*")) if store.partial_dir.is_dir() else []
    if store.manifests_dir.is_dir():
        found += store.manifests_dir.glob("**/.*.tmp-*")
    if store.root.is_dir():
        found += store.root.glob(".*.tmp-*")
    return found


def _writable_problem(store: Store) -> str | None:
    root = store.root
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"the model store {root} cannot be created ({exc.strerror}): no model can be served"
    if not os.access(root, os.W_OK) or os.statvfs(root).f_flag & os.ST_RDONLY:
        return (
            f"the model store {root} is read-only: its models are served, but creating, "
            "pulling, copying and removing models fail"
        )
    return None


def check_store(store: Store, *, digests: bool = False) -> StoreReport:
    """Check the store (see the module docstring); with ``digests``, re-hash every blob and
    set aside those whose bytes do not match. Never raises for what it finds."""
    report = StoreReport(root=store.root)
    report.error = _writable_problem(store)
    if report.error is not None and not store.root.is_dir():
        return report
    if report.error is None:
        try:
            with store.exclusive() as acquired:
                if acquired:
                    for path in _temporaries(store):
                        size = _size(path)
                        _remove(path)
                        report.removed_temporaries.append((path.name, size))
                    if digests:
                        report.verified = len(store.verify(set_aside_bad=True))
                report.busy = not acquired
        except OSError as exc:
            report.error = f"the model store {store.root} cannot be written ({exc})"
        free = store.free_space()
        if free < _LOW_SPACE:
            report.warning = (
                f"the disk holding the model store {store.root} is full ({human_size(free)} "
                "free): creating and pulling models will fail until space is freed"
            )
    referenced: set[str] = set()
    for name, entry in store.manifests():
        label = name.short if isinstance(name, ModelName) else str(name)
        if not isinstance(entry, ModelEntry):
            report.damaged.append(DamagedModel(label, f"its manifest cannot be read ({entry})"))
            continue
        referenced |= entry.manifest.digests
        problem = store.damage(entry.manifest)
        if problem is None:
            report.models += 1
        else:
            report.damaged.append(DamagedModel(label, problem))
    for digest in store.iter_blobs():
        if digest not in referenced:
            report.unreferenced.append((digest, _size(store.blob_path(digest))))
    if store.partial_dir.is_dir():
        for path in sorted(store.partial_dir.iterdir()):
            if path.name.endswith(".partial"):
                report.partial_downloads.append((path.name, _size(path)))
            elif path.name.startswith(CORRUPT_PREFIX):
                report.corrupt.append((path.name, _size(path)))
    return report


def _in_use(path: Path) -> bool:
    """True when a download holds ``path``'s lock (it is being written)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        return not try_lock(fd)
    finally:
        os.close(fd)


def prune(store: Store) -> PruneReport:
    """Remove blobs no model references, partial downloads, corrupted blobs set aside and
    temporary files of killed writes. Raises :class:`StoreBusyError` while a change runs."""
    report = PruneReport()
    with store.exclusive() as acquired:
        if not acquired:
            raise StoreBusyError(
                "the store is busy (a create, pull, copy or import is writing); prune again "
                "when it finishes"
            )
        referenced = store.referenced_digests()
        for digest in store.iter_blobs():
            if digest not in referenced:
                path = store.blob_path(digest)
                report.blobs.append((digest, _size(path)))
                path.unlink(missing_ok=True)
        leftovers = _temporaries(store)
        if store.partial_dir.is_dir():
            leftovers += [
                p
                for p in store.partial_dir.iterdir()
                if p.name.startswith(CORRUPT_PREFIX)
                or (p.name.endswith(".partial") and not _in_use(p))
            ]
        for path in leftovers:
            size = _size(path)
            with contextlib.suppress(FileNotFoundError):
                _remove(path)
                report.other.append((path.name, size))
    return report
