"""Saved prompt prefixes: the KV cache's tiers below the llama.cpp context.

The engine keeps the KV cells of recent prompts in the context (tier 0) for as long as their
slots are idle and the cells are not wanted. When a slot is reused for an unrelated prompt, or
the cache is full, the engine saves that sequence's state (``llama_state_seq_get_data``) here
instead of dropping it:

* **host RAM** (tier 1): the most recently used prefixes, up to ``ram_budget`` bytes;
* **disk** (tier 2): what RAM evicts, and everything still in RAM when the runner stops, as
  files under ``directory`` (one folder per model and KV layout), up to ``disk_budget`` bytes
  over the whole cache folder. Files are written atomically and checked when read (magic,
  header, length, sha256); a bad file is deleted, never used. This is what makes a cached
  system prompt survive a runner unload or a daemon restart.

Each saved prefix belongs to one LoRA adapter set (its ``namespace``: the set's key, empty for
the base model alone), part of its key, file and header: a prompt finds the prefixes of its own
set only. A new prompt asks :meth:`PrefixCache.best` for the saved prefix sharing the longest
start with it; the engine restores that state into a slot (``llama_state_seq_set_data``) and
trims it to the shared part. Nothing here touches llama.cpp: the cache holds opaque bytes.
"""

from __future__ import annotations

import array
import collections
import contextlib
import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CacheStats", "PrefixCache", "SavedPrefix", "layout_folder"]

log = logging.getLogger("localllm.runner.kvcache")

_MAGIC = b"LOCALLLM-KV 1\n"
# Headers hold the token list; one of a 1M-token context is ~8 MB of JSON.
_MAX_HEADER = 16 << 20


def _key(tokens: list[int] | tuple[int, ...], namespace: str = "") -> str:
    data = array.array("i", tokens).tobytes()
    if namespace:
        data = namespace.encode() + b"\n" + data
    return hashlib.sha256(data).hexdigest()[:32]


def _common_prefix(a: tuple[int, ...], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    # Compare in blocks first: prompts share long prefixes, and tuple slices compare in C.
    step = 256
    while i + step <= n and list(a[i : i + step]) == b[i : i + step]:
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i


def layout_folder(root: Path, model_identity: str, layout: str) -> Path:
    """The folder of one model's saved prefixes for one KV layout (type, attention, llama.cpp
    version): states saved under another layout can never be restored by mistake."""
    digest = hashlib.sha256(f"{model_identity}\n{layout}".encode()).hexdigest()[:24]
    return root / digest


@dataclass
class SavedPrefix:
    """One saved sequence state."""

    tokens: tuple[int, ...]
    """The tokens whose KV state it holds, at positions 0..len-1."""
    size: int
    """Bytes of state."""
    data: bytes | None = None
    """The state, while it is in RAM."""
    path: Path | None = None
    """Its file, once it is on disk."""
    namespace: str = ""
    """The LoRA adapter set its cells were computed with (empty: none)."""


@dataclass
class CacheStats:
    """Gauges for /api/ps and the dashboard."""

    ram_entries: int
    ram_bytes: int
    disk_entries: int
    disk_bytes: int
    restored: int
    """Prefixes restored since the runner started."""


class PrefixCache:
    """Host-RAM and disk tiers of saved prefixes for one model; used on the engine thread."""

    def __init__(self, directory: Path | None, ram_budget: int, disk_budget: int) -> None:
        self.directory = directory if disk_budget > 0 else None
        self.ram_budget = max(ram_budget, 0)
        self.disk_budget = max(disk_budget, 0)
        self.restored = 0
        # key -> entry, least recently used first.
        self._entries: collections.OrderedDict[str, SavedPrefix] = collections.OrderedDict()
        self._ram_bytes = 0
        if self.directory is not None:
            self._index_disk()

    # -- lookups -----------------------------------------------------------------------------

    def best(self, prompt: list[int], namespace: str = "") -> tuple[int, str] | None:
        """The saved prefix of ``namespace`` sharing the most leading tokens with ``prompt``:
        (length, key)."""
        best_length, best_key = 0, None
        for key, entry in self._entries.items():
            if entry.namespace != namespace:
                continue
            if entry.tokens and entry.tokens[0] == (prompt[0] if prompt else None):
                length = _common_prefix(entry.tokens, prompt)
                if length > best_length:
                    best_length, best_key = length, key
        return (best_length, best_key) if best_key is not None else None

    def load(self, key: str) -> bytes | None:
        """The state saved under ``key`` (from RAM, else its verified file), now the most
        recently used; None when it is gone or its file was bad (and is now deleted)."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        data = entry.data
        if data is None and entry.path is not None:
            data = self._read(entry.path, entry.tokens, entry.namespace)
            if data is None:
                self._drop(key)
                return None
            with contextlib.suppress(OSError):
                os.utime(entry.path)  # the disk tier's LRU order is the files' mtimes
        self._entries.move_to_end(key)
        self.restored += 1
        return data

    def in_ram(self, key: str) -> bool:
        """Whether the state saved under ``key`` is held in RAM (restoring it reads no file)."""
        entry = self._entries.get(key)
        return entry is not None and entry.data is not None

    def tokens(self, key: str) -> tuple[int, ...] | None:
        """The tokens whose state is saved under ``key``."""
        entry = self._entries.get(key)
        return entry.tokens if entry is not None else None

    def forget(self, key: str) -> None:
        """Drop an entry whose state llama.cpp refused (and its file)."""
        self._drop(key)

    def stats(self) -> CacheStats:
        """Counts and sizes of both tiers."""
        on_disk = [e for e in self._entries.values() if e.path is not None]
        return CacheStats(
            ram_entries=sum(1 for e in self._entries.values() if e.data is not None),
            ram_bytes=self._ram_bytes,
            disk_entries=len(on_disk),
            disk_bytes=sum(e.size for e in on_disk),
            restored=self.restored,
        )

    # -- saving ------------------------------------------------------------------------------

    def save(self, tokens: list[int], data: bytes, namespace: str = "") -> None:
        """Keep ``data`` as the state of ``tokens`` (computed with the adapter set
        ``namespace``) in RAM, moving older entries to disk.

        A saved prefix of the same namespace that ``tokens`` extends is replaced: restoring the
        longer one and trimming it serves every prompt the shorter one served.
        """
        if not tokens or not data:
            return
        frozen = tuple(tokens)
        for key, entry in list(self._entries.items()):
            if entry.namespace != namespace:
                continue
            if len(entry.tokens) <= len(frozen) and frozen[: len(entry.tokens)] == entry.tokens:
                self._drop(key)
            elif len(entry.tokens) > len(frozen) and entry.tokens[: len(frozen)] == frozen:
                self._entries.move_to_end(key)  # already covered by a longer prefix
                return
        key = _key(frozen, namespace)
        self._entries[key] = SavedPrefix(
            tokens=frozen, size=len(data), data=data, namespace=namespace
        )
        self._ram_bytes += len(data)
        self._fit_ram()

    def persist(self) -> None:
        """Write every entry still only in RAM to disk (the runner is stopping)."""
        if self.directory is None:
            return
        for key, entry in list(self._entries.items()):
            if entry.path is None and entry.data is not None:
                self._write(key, entry)
        self._fit_disk()

    # -- tiers -------------------------------------------------------------------------------

    def _fit_ram(self) -> None:
        for key, entry in list(self._entries.items()):
            if self._ram_bytes <= self.ram_budget:
                break
            if entry.data is None:
                continue
            if self.directory is not None and entry.path is None:
                self._write(key, entry)
            self._ram_bytes -= entry.size
            entry.data = None
            if entry.path is None:
                del self._entries[key]
        self._fit_disk()

    def _write(self, key: str, entry: SavedPrefix) -> None:
        assert self.directory is not None and entry.data is not None
        if entry.size > self.disk_budget:
            return
        fields = {
            "tokens": list(entry.tokens),
            "size": entry.size,
            "sha256": hashlib.sha256(entry.data).hexdigest(),
        }
        if entry.namespace:
            fields["adapters"] = entry.namespace
        header = json.dumps(fields).encode()
        path = self.directory / f"{key}.kv"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(
                dir=self.directory, prefix=".tmp-", delete=False
            ) as handle:
                handle.write(_MAGIC + header + b"\n")
                handle.write(entry.data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(handle.name, path)
        except OSError as exc:  # a full disk costs the cache entry, nothing else
            log.warning("could not save a prompt prefix to %s: %s", path, exc)
            with contextlib.suppress(OSError, UnboundLocalError):
                os.unlink(handle.name)
            return
        entry.path = path

    def _fit_disk(self) -> None:
        """Delete least recently used files, over the whole cache folder, beyond the budget."""
        if self.directory is None:
            return
        root = self.directory.parent
        files = []
        with contextlib.suppress(OSError):
            for path in root.glob("*/*.kv"):
                with contextlib.suppress(OSError):
                    stat = path.stat()
                    files.append((stat.st_mtime, stat.st_size, path))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total <= self.disk_budget:
                break
            with contextlib.suppress(OSError):
                path.unlink()
            total -= size
            for key, entry in list(self._entries.items()):
                if entry.path == path:
                    entry.path = None
                    if entry.data is None:
                        del self._entries[key]

    def _index_disk(self) -> None:
        """Learn the prefixes saved by earlier runs (headers only; states load on use)."""
        assert self.directory is not None
        with contextlib.suppress(OSError):
            for tmp in self.directory.glob(".tmp-*"):
                tmp.unlink()  # a writer killed mid-write
        paths = sorted(self.directory.glob("*.kv"), key=lambda p: p.stat().st_mtime)
        for path in paths:
            header = self._header(path)
            if header is None:
                log.warning("deleting unreadable saved prefix %s", path)
                with contextlib.suppress(OSError):
                    path.unlink()
                continue
            tokens, size, _, namespace = header
            self._entries[path.stem] = SavedPrefix(
                tokens=tokens, size=size, path=path, namespace=namespace
            )

    @staticmethod
    def _header(path: Path) -> tuple[tuple[int, ...], int, str, str] | None:
        try:
            with open(path, "rb") as handle:
                if handle.read(len(_MAGIC)) != _MAGIC:
                    return None
                line = handle.readline(_MAX_HEADER)
            header = json.loads(line)
            tokens = tuple(int(t) for t in header["tokens"])
            size, digest = int(header["size"]), str(header["sha256"])
            namespace = str(header.get("adapters", ""))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None
        if path.stat().st_size != len(_MAGIC) + len(line) + size:
            return None
        if path.stem != _key(tokens, namespace):
            return None
        return tokens, size, digest, namespace

    def _read(self, path: Path, tokens: tuple[int, ...], namespace: str) -> bytes | None:
        header = self._header(path)
        if header is None or header[0] != tokens or header[3] != namespace:
            log.warning("deleting damaged saved prefix %s", path)
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        _, size, digest, _ = header
        try:
            with open(path, "rb") as handle:
                handle.readline(len(_MAGIC) + 1)
                handle.readline(_MAX_HEADER)
                data = handle.read(size + 1)
        except OSError:
            return None
        if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
            log.warning("deleting damaged saved prefix %s (checksum)", path)
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        return data

    def _drop(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        if entry.data is not None:
            self._ram_bytes -= entry.size
        if entry.path is not None:
            with contextlib.suppress(OSError):
                entry.path.unlink()
