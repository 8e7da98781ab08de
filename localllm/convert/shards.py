"""The weights of a safetensors folder: headers, the index, and tensors read from memory maps.

A safetensors file is an 8-byte little-endian header length, a JSON header (name → dtype, shape,
byte range), then the raw bytes. The header is parsed here and checked against the file's size
before any byte of weights is read, so a truncated download is reported by name instead of
surfacing as a bus error in the middle of a conversion. bf16 has no numpy dtype: it is read as
uint16 and shifted into the high half of a float32, which is exactly what bf16 is.

Each tensor is mapped on its own (``numpy.memmap`` at its offset) and the map is closed when the
tensor is done: the file's pages a conversion touches leave its resident set with the map, so the
peak stays near one tensor however large the model is. The hot path (bf16 rounded to F16) reads
with ``pread`` into one small buffer instead (:func:`read_blocks`): no map, so nothing of the
shard counts in the resident set (97 MB peak instead of 590 for the benchmark's checkpoint),
and no page faults nor unmapping. Mapped, that conversion took 1.7-2.4x as long here, the writer
thread's CPU time up as much (unmapping interrupts every thread of the process, the likely
cause; measured, not proven).
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localllm._exceptions import (
    MissingShardError,
    PickleCheckpointError,
    TensorMismatchError,
    TruncatedShardError,
)
from localllm.convert.floats import bf16_to_f32

__all__ = [
    "INDEX_NAME",
    "PICKLE_PATTERNS",
    "TensorEntry",
    "header_length",
    "index_folder",
    "parse_header",
    "read_blocks",
    "read_header",
    "read_rows",
    "shard_names",
]

INDEX_NAME = "model.safetensors.index.json"
PICKLE_PATTERNS = ("pytorch_model*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")

# safetensors dtype names → numpy storage dtype (bf16 stored as its raw 16 bits).
_STORAGE: dict[str, np.dtype] = {
    "BF16": np.dtype("<u2"),
    "F16": np.dtype("<f2"),
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
}
_ITEMSIZE = {
    "BF16": 2,
    "F16": 2,
    "F32": 4,
    "F64": 8,
    "I8": 1,
    "U8": 1,
    "I16": 2,
    "U16": 2,
    "I32": 4,
    "U32": 4,
    "I64": 8,
    "U64": 8,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}
# A header larger than this is not a header (real ones are well under 1 MB per thousand tensors).
_MAX_HEADER = 100 * 1024 * 1024


@dataclass(frozen=True)
class TensorEntry:
    """One tensor as a safetensors header describes it: where its bytes are and what they are."""

    name: str
    file: Path
    dtype: str
    shape: tuple[int, ...]
    offset: int
    """Absolute byte offset of the tensor's first byte in ``file``."""
    nbytes: int

    @property
    def rows(self) -> int:
        """The size of the first dimension (1 for a scalar)."""
        return self.shape[0] if self.shape else 1


def shard_names(folder: Path) -> list[str]:
    """The safetensors files holding the folder's weights, as the index names them (or the
    folder's ``*.safetensors`` when there is no index). Refuses pickles-only folders."""
    index = folder / INDEX_NAME
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise MissingShardError(f"{index}: not a safetensors index ({exc})") from None
        for name in names:
            if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
                raise MissingShardError(f"{index}: shard name {name!r} is not a file in the folder")
        return names
    names = sorted(p.name for p in folder.glob("*.safetensors") if p.is_file())
    if names:
        return names
    pickles = sorted({p.name for pat in PICKLE_PATTERNS for p in folder.glob(pat)})
    if pickles:
        raise PickleCheckpointError(
            f"{folder} holds only pickled weights ({', '.join(pickles)}): loading a pickle runs "
            "code from the file, so localllm never opens them; use the model's safetensors "
            "release (most Hub repositories have one) or convert it with the author's tools"
        )
    raise MissingShardError(f"{folder} has no weights: no *.safetensors file and no {INDEX_NAME}")


def header_length(head: bytes, name: str, size: int) -> int:
    """The JSON header's length from a safetensors file's first 8 bytes, checked against the
    file's ``size``; raises :class:`TruncatedShardError` for what cannot be a header."""
    if len(head) < 8:
        raise TruncatedShardError(f"{name}: {size} bytes, too short for a header")
    (length,) = struct.unpack("<Q", head[:8])
    if length > _MAX_HEADER or length > size - 8:
        raise TruncatedShardError(
            f"{name}: header says {length} bytes but the file has {size}: "
            "truncated or not a safetensors file"
        )
    return int(length)


def parse_header(raw: bytes, path: Path, size: int) -> dict[str, TensorEntry]:
    """The tensors of one safetensors header (``raw``: the JSON after the 8 length bytes) of
    a file of ``size`` bytes, each checked to lie inside the file. ``path`` names the file
    (it need not exist here: a pull checks a shard's header before downloading it)."""
    length = len(raw)
    try:
        header = json.loads(raw)
        if not isinstance(header, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        raise TruncatedShardError(f"{path.name}: unreadable header ({exc})") from None
    base = 8 + length
    out: dict[str, TensorEntry] = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = str(spec["dtype"])
            shape = tuple(int(d) for d in spec["shape"])
            begin, end = (int(x) for x in spec["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise TruncatedShardError(f"{path.name}: bad header entry for {name!r}") from None
        itemsize = _ITEMSIZE.get(dtype)
        if itemsize is None or any(d < 0 for d in shape):
            raise TensorMismatchError(
                f"{path.name}: tensor {name!r} has dtype {dtype} shape "
                f"{list(shape)}, which cannot be a model weight"
            )
        if end - begin != math.prod(shape) * itemsize or begin < 0:
            raise TruncatedShardError(
                f"{path.name}: tensor {name!r} spans {end - begin} bytes but {dtype} "
                f"{list(shape)} needs {math.prod(shape) * itemsize}"
            )
        if base + end > size:
            raise TruncatedShardError(
                f"{path.name} is shorter than its header says: tensor {name!r} ends at byte "
                f"{base + end} but the file has {size} bytes (an interrupted download?)"
            )
        out[name] = TensorEntry(name, path, dtype, shape, base + begin, end - begin)
    return out


def read_header(path: Path) -> dict[str, TensorEntry]:
    """Parse one safetensors file's header and check every tensor's bytes lie inside the file."""
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            length = header_length(fh.read(8), path.name, size)
            raw = fh.read(length)
    except FileNotFoundError:
        raise MissingShardError(f"shard {path.name} is missing from {path.parent}") from None
    return parse_header(raw, path, size)


def index_folder(folder: Path) -> dict[str, TensorEntry]:
    """Every tensor of the folder's shards, by name, each checked against its file's size."""
    tensors: dict[str, TensorEntry] = {}
    for name in shard_names(folder):
        path = folder / name
        if not path.is_file():
            raise MissingShardError(f"shard {name} named by {INDEX_NAME} is missing from {folder}")
        tensors.update(read_header(path))
    index = folder / INDEX_NAME
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        for tname, shard in weight_map.items():
            if tname not in tensors:
                raise MissingShardError(
                    f"tensor {tname!r} is listed in {INDEX_NAME} under "
                    f"{shard} but that shard does not hold it"
                )
    return tensors


@contextmanager
def _mapped(entry: TensorEntry) -> Iterator[np.ndarray]:
    storage = _STORAGE.get(entry.dtype)
    if storage is None:
        raise TensorMismatchError(
            f"tensor {entry.name!r} is {entry.dtype}: only float weights "
            "(BF16, F16, F32, F64) can be converted"
        )
    if entry.nbytes == 0:
        yield np.zeros(entry.shape, dtype=storage)
        return
    mm = np.memmap(entry.file, dtype=storage, mode="r", offset=entry.offset, shape=entry.shape)
    mapping = getattr(mm, "_mmap", None)
    if mapping is not None and hasattr(mmap, "MADV_SEQUENTIAL"):
        # Read once, front to back: ask the kernel for read-ahead and early reclaim.
        with suppress(OSError):
            mapping.madvise(mmap.MADV_SEQUENTIAL)
    try:
        yield mm
    finally:
        # Closing the map now (not at garbage collection) returns its pages: the resident set
        # stays at about one tensor.
        del mm
        if mapping is not None:
            # A view still alive (BufferError): the collector unmaps it instead.
            with suppress(BufferError):
                mapping.close()


def _to_f32(raw: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "BF16":
        return bf16_to_f32(raw)
    return raw.astype(np.float32)


def read_rows(
    entry: TensorEntry,
    chunk_bytes: int = 64 << 20,
    order: np.ndarray | None = None,
    raw: bool = False,
) -> Iterator[np.ndarray]:
    """The tensor as float32 (or, with ``raw``, as stored: bf16 as its uint16 bits), in chunks
    of whole rows (first dimension), optionally gathered in ``order`` (a permutation of the
    rows). A float32 chunk is a fresh array the caller may modify; a raw one may be a view of
    the memory map, valid only until the next chunk is asked for."""
    # Raw chunks are views of the map when no reordering copies them anyway: the caller reads
    # them once (a gather, a copy), saving a pass over the data.
    convert = (
        (lambda a: a.view(np.ndarray)) if raw else (lambda a: _to_f32(np.asarray(a), entry.dtype))
    )
    with _mapped(entry) as mm:
        if mm.ndim == 0:
            yield convert(mm.reshape(()))
            return
        row_bytes = max(1, entry.nbytes // max(1, entry.rows)) * 2  # f32 is up to twice bf16
        step = max(1, chunk_bytes // row_bytes)
        for start in range(0, entry.rows, step):
            stop = min(entry.rows, start + step)
            yield convert(mm[order[start:stop]] if order is not None else mm[start:stop])


def _pread_into(fd: int, view: memoryview, offset: int, entry: TensorEntry) -> None:
    """Fill ``view`` with the file's bytes from ``offset`` (pread returns short reads)."""
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            raise TruncatedShardError(
                f"{entry.file.name} ended at byte {offset + done} while "
                f"tensor {entry.name!r} was read (changed since its "
                "header was checked?)"
            )
        done += n


def _contiguous_blocks(order: np.ndarray, step: int) -> bool:
    """Whether each block of ``step`` entries of the permutation ``order`` is a permutation of a
    contiguous range (so the block's rows are read at once and reordered in memory): Llama's
    q/k order is, per head, when blocks hold whole heads."""
    starts = np.arange(0, order.size, step)
    sizes = np.diff(np.append(starts, order.size))
    lows, highs = np.minimum.reduceat(order, starts), np.maximum.reduceat(order, starts)
    return bool(np.all(highs - lows + 1 == sizes))


def read_blocks(
    entry: TensorEntry, buffer: np.ndarray, order: np.ndarray | None = None
) -> Iterator[np.ndarray]:
    """The tensor's elements as stored (bf16 as its uint16 bits), flat and in row order (rows
    gathered in ``order``, a permutation of the first dimension, when given), read with
    ``pread`` into ``buffer`` (a C-contiguous byte array) a block at a time. Each block is a
    view of ``buffer``, valid until the next is asked for.

    Where ``order`` cannot be read in blocks that fit (a row larger than half the buffer, rows
    that come from far apart), the rows are gathered from a memory map (:func:`read_rows`)."""
    storage = _STORAGE.get(entry.dtype)
    if storage is None:
        raise TensorMismatchError(
            f"tensor {entry.name!r} is {entry.dtype}: only float weights "
            "(BF16, F16, F32, F64) can be converted"
        )
    if entry.nbytes == 0:
        return
    raw = buffer.view(np.uint8).reshape(-1)
    rows = entry.rows if entry.shape else 1
    row_bytes = entry.nbytes // rows
    step = raw.nbytes // 2 // row_bytes if order is not None else 0
    if order is not None and (step == 0 or not _contiguous_blocks(order, step)):
        for block in read_rows(entry, order=order, raw=True):
            yield block.reshape(-1)
        return
    fd = os.open(entry.file, os.O_RDONLY)
    try:
        if order is None:
            block = raw.nbytes // storage.itemsize * storage.itemsize
            if block == 0:
                raise ValueError(f"a buffer of {raw.nbytes} bytes holds no {entry.dtype} element")
            for start in range(0, entry.nbytes, block):
                n = min(block, entry.nbytes - start)
                _pread_into(fd, memoryview(raw[:n]), entry.offset + start, entry)
                yield raw[:n].view(storage)
            return
        # Half the buffer receives the block's rows as stored, the other half their new order.
        half = step * row_bytes
        for start in range(0, rows, step):
            stop = min(rows, start + step)
            wanted = order[start:stop]
            low = int(wanted.min())
            n = (stop - start) * row_bytes
            _pread_into(fd, memoryview(raw[:n]), entry.offset + low * row_bytes, entry)
            stored = raw[:n].view(storage).reshape(stop - start, -1)
            ordered = raw[half : half + n].view(storage).reshape(stop - start, -1)
            np.take(stored, wanted - low, axis=0, out=ordered, mode="clip")
            yield ordered.reshape(-1)
    finally:
        os.close(fd)
