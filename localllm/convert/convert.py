"""Convert a safetensors folder to one GGUF file, streaming tensor by tensor.

The header (metadata and every tensor's name, type and shape) is written first, from the plan;
then each tensor is read from its memory map in chunks of rows, fixed (row order, offsets),
cast to the output type and handed to a writer thread (:mod:`.sink`). Nothing but one mapped
tensor and a few chunks is in memory at a time. A tensor whose bytes stay as they are (the
``auto`` output type keeps a bf16 checkpoint's matrices BF16, as llama.cpp's converter does
with ``--outtype auto``) is copied shard to GGUF by the kernel, as ``cp`` copies: that is most
of a model, so such a conversion runs near the disk's speed. Rounding bf16 to F16 (the default)
is a pass of the CPU over every weight: read with ``pread`` in blocks that stay in the L2 cache,
rounded with integer operations (:mod:`.floats`) straight into a few reused buffers that the
writer thread writes as they are, so it costs about as much CPU as the write itself and, with
a core free, runs at about the writer's speed. The file is written under a
temporary name beside ``out`` and renamed only once it is complete and flushed; any error (or
interrupt) removes it.
"""

from __future__ import annotations

import errno
import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np

from localllm._exceptions import ConvertError, DiskFullError, OperationCancelledError
from localllm.convert.base import OutTensor
from localllm.convert.families import family_for
from localllm.convert.floats import bf16_to_f16
from localllm.convert.folder import inspect_folder
from localllm.convert.shards import TensorEntry, index_folder, read_blocks, read_rows
from localllm.convert.sink import BackgroundWriter, BufferPool, FileSpan, Lent
from localllm.convert.vocab import load_vocab, write_vocab
from localllm.convert.writer import GGUFWriter

__all__ = ["OUTTYPES", "ConvertResult", "auto_outtype", "convert_folder"]

_Q = gguf.GGMLQuantizationType
OUTTYPES: dict[str, gguf.LlamaFileType] = {
    "f32": gguf.LlamaFileType.ALL_F32,
    "f16": gguf.LlamaFileType.MOSTLY_F16,
    "bf16": gguf.LlamaFileType.MOSTLY_BF16,
    "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
}
"""The output types by name; ``auto`` picks one of them with :func:`auto_outtype`."""
_MATRIX = {"f32": _Q.F32, "f16": _Q.F16, "bf16": _Q.BF16, "q8_0": _Q.Q8_0}
# A source tensor's stored type → the ggml type that holds its bytes unchanged.
_SAME_BYTES = {"BF16": _Q.BF16, "F16": _Q.F16, "F32": _Q.F32}
_READ_BYTES = 512 << 10
"""The buffer bf16 is read into when rounded to F16 (whole, or half of it for rows reordered):
with what the rounding touches, it stays in the core's L2 cache."""
_CHUNK_BYTES = 4 << 20
"""Most bytes of one chunk handed to the writer thread (a pooled F16 buffer, or a chunk of
float32 rows read), so the queue below holds at most its depth times this."""
_WRITE_DEPTH = 16
"""Chunks queued for the writer thread (and for the hash thread after it): 64 MiB, about 25 ms
of writing. On a loaded machine a thread woken for the next chunk may wait several
milliseconds for a core; with 3 chunks of 4 MiB queued the writer ran dry while the producer
waited (F16 of the 2.47 GB benchmark checkpoint, load 5-6 on 2 cores: median 653 MB/s with 3,
840-1094 with 16)."""


def auto_outtype(stored: str) -> str:
    """The output type ``auto`` picks for weights stored as ``stored`` (``FolderInfo.dtype``:
    ``bf16``, ``f16``, ``f32``...): the checkpoint's own 16-bit type, so its matrices are
    copied unchanged (bf16 → BF16, f16 → F16); F16 for wider floats."""
    return stored if stored in ("bf16", "f16") else "f16"


@dataclass(frozen=True)
class ConvertResult:
    """What a conversion wrote."""

    path: Path
    architecture: str
    tensor_count: int
    bytes_written: int
    seconds: float
    sha256: str | None = None
    """``sha256:<hex>`` of the file, when asked for (hashed as it was written)."""
    notes: list[str] = field(default_factory=list)
    """What the converter decided for the user (a pre-tokenizer found by its regex, a type
    kept wider than asked for a tensor that cannot take it...), to be reported."""


def _out_type(t: OutTensor, outtype: str) -> _Q:
    # Norms, biases and other vectors stay f32, as llama.cpp's converter keeps them.
    if len(t.shape) < 2:
        return _Q.F32
    q = _MATRIX[outtype]
    if q == _Q.Q8_0 and t.shape[-1] % 32:
        return _Q.F16
    return q


def _encode(chunk: np.ndarray, q: _Q) -> np.ndarray:
    if q == _Q.F32:
        return chunk.astype(np.float32, copy=False)
    if q == _Q.F16:
        return chunk.astype(np.float16)
    return gguf.quants.quantize(chunk, q)


def _nbytes(shape: tuple[int, ...], q: _Q) -> int:
    block, size = gguf.GGML_QUANT_SIZES[q]
    n = 1
    for d in shape:
        n *= d
    return n // block * size


def _total_out(plan: list[OutTensor], types: list[_Q]) -> int:
    return sum(_nbytes(t.shape, q) for t, q in zip(plan, types, strict=True))


def _bf16_as_f16(source: TensorEntry, order: np.ndarray | None, pool: BufferPool) -> Iterator[Lent]:
    """``source`` (bf16) as float16, rows in ``order``, in the pool's buffers filled to the end
    (the last one as far as the tensor goes).

    The source is read in blocks the size of the L2 cache (with ``pread``, rows gathered in
    ``order``) and each block rounded straight into the buffer: no chunk-sized temporaries, no
    fresh pages to fault in, and the writer thread writes the buffer itself."""
    buffer, fill = pool.take().view(np.float16), 0
    staging = np.empty(_READ_BYTES, dtype=np.uint8)
    for flat in read_blocks(source, staging, order=order):
        done = 0
        while done < flat.size:
            n = min(flat.size - done, buffer.size - fill)
            bf16_to_f16(flat[done : done + n], out=buffer[fill : fill + n])
            done, fill = done + n, fill + n
            if fill == buffer.size:
                yield pool.lend(buffer, buffer)
                buffer, fill = pool.take().view(np.float16), 0
    if fill:
        yield pool.lend(buffer, buffer[:fill])
    else:
        pool.give(buffer)


def _encoded_chunks(
    t: OutTensor, q: _Q, span_bytes: int = 64 << 20, pool: BufferPool | None = None
) -> Iterator[np.ndarray | FileSpan | Lent]:
    """The tensor's bytes in the output type, chunk by chunk (experts one after another):
    spans of the shard itself where the bytes stay as they are; with a ``pool``, bf16 rounded
    to F16 in its buffers (given back once written)."""
    if t.source is None:
        assert t.data is not None
        yield _encode(np.asarray(t.data, dtype=np.float32), q)
        return
    for source in t.sources:
        if _SAME_BYTES.get(source.dtype) == q and t.order is None and not t.offset:
            # Unchanged bytes: copied by the kernel, in pieces so cancel and progress stay
            # responsive on a large tensor.
            for start in range(0, source.nbytes, span_bytes):
                yield FileSpan(
                    source.file, source.offset + start, min(span_bytes, source.nbytes - start)
                )
            continue
        if source.dtype == "BF16" and not t.offset and q == _Q.F16 and pool is not None:
            # The default's common case: a bf16 checkpoint rounded to F16 on the bits.
            yield from _bf16_as_f16(source, t.order, pool)
            continue
        if source.dtype == "BF16" and not t.offset and q in (_Q.F16, _Q.BF16):
            # The same without a pool, and bf16 rows reordered (BF16 output): no float32.
            for raw in read_rows(source, chunk_bytes=_CHUNK_BYTES, order=t.order, raw=True):
                # A copy for the writer thread: the view dies with the map.
                yield np.array(raw) if q == _Q.BF16 else bf16_to_f16(raw)
            continue
        for chunk in read_rows(source, chunk_bytes=_CHUNK_BYTES, order=t.order):
            if t.offset:
                chunk += np.float32(t.offset)
            yield _encode(chunk, q)


def convert_folder(
    folder: Path,
    out: Path,
    *,
    progress: Callable[[int, int], None] | None = None,
    outtype: str = "f16",
    cancel: threading.Event | None = None,
    sha256: bool = False,
) -> ConvertResult:
    """Convert the safetensors model in ``folder`` to a GGUF at ``out``.

    ``outtype`` is the matrices' type: ``f16`` (default), ``auto`` (the checkpoint's own
    16-bit type, copied: bf16 → BF16, f16 → F16, else F16; see :func:`auto_outtype`),
    ``bf16``, ``f32`` or ``q8_0``; vectors (norms, biases) are f32 whatever it is.
    ``progress(done, total)`` is called with source bytes as tensors are written; an
    exception it raises stops the conversion. Setting ``cancel`` stops it too, with
    :class:`~localllm._exceptions.OperationCancelledError`. Raises a
    :class:`~localllm._exceptions.ConvertError` subclass for bad input; on any error ``out``
    does not exist (or keeps what it held before) and no temporary file is left. With
    ``sha256`` the file is hashed as it is written (``ConvertResult.sha256``): a caller that
    makes it a blob need not read it again.
    """
    if outtype != "auto" and outtype not in OUTTYPES:
        raise ConvertError(f"outtype {outtype!r} is not one of auto, {', '.join(OUTTYPES)}")
    started = time.monotonic()
    folder, out = Path(folder), Path(out)
    info = inspect_folder(folder)
    if outtype == "auto":
        outtype = auto_outtype(info.dtype)
    family = family_for(info.config)
    tensors = index_folder(folder)
    vocab = load_vocab(folder, family.vocab, prefer_sentencepiece=family.prefer_sentencepiece)
    family.check_vocab(vocab.tokens)
    dtype = info.config.get("torch_dtype") or info.config.get("dtype")
    plan = family.plan(tensors, str(dtype) if dtype else None)
    total = sum(t.source_bytes for t in plan)

    writer = GGUFWriter(None, gguf.MODEL_ARCH_NAMES[family.gguf_arch])
    # The Hub id when config.json carries one; never a path of the author's machine.
    hub_id = str(info.config.get("_name_or_path") or "")
    local = not hub_id or hub_id.startswith(("/", ".", "~")) or "\\" in hub_id
    writer.add_name(folder.name if local else hub_id)
    writer.add_file_type(int(OUTTYPES[outtype]))
    if outtype == "q8_0":
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    family.write_hparams(writer)
    notes = write_vocab(writer, vocab) + family.notes
    types = [_out_type(t, outtype) for t in plan]
    for t, q in zip(plan, types, strict=True):
        if q != _Q.F32 and len(t.shape) >= 2 and q != _MATRIX[outtype]:
            notes.append(
                f"{t.name} kept as {q.name}: its rows ({t.shape[-1]}) do not fit {outtype}'s blocks"
            )
        # Shapes in the writer's numpy order; the writer reverses them into GGUF's.
        writer.add_tensor_info(
            t.name, t.shape, np.dtype(np.float32), _nbytes(t.shape, q), raw_dtype=q
        )

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.partial")
    done = 0
    try:
        writer.write_header_to_file(tmp)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        assert writer.fout is not None
        fh = writer.fout[0]
        hasher = hashlib.sha256() if sha256 else None
        sink = BackgroundWriter(fh, depth=_WRITE_DEPTH, hasher=hasher)
        # Enough buffers for the queue, the one being written and the one being filled (and,
        # hashing, the hash thread's queue and the one it hashes).
        pool = BufferPool((_WRITE_DEPTH + 1) * (2 if sha256 else 1) + 1, _CHUNK_BYTES)
        try:
            for t, q in zip(plan, types, strict=True):
                sink.pad(writer.data_alignment)
                start = sink.position
                for data in _encoded_chunks(t, q, pool=pool):
                    if cancel is not None and cancel.is_set():
                        raise OperationCancelledError(f"conversion of {folder.name} cancelled")
                    sink.write(data)
                written, expected = sink.position - start, _nbytes(t.shape, q)
                if written != expected:
                    raise ConvertError(f"{t.name}: wrote {written} bytes, expected {expected}")
                done += t.source_bytes
                if progress is not None:
                    progress(done, total)
            sink.pad(writer.data_alignment)
        finally:
            sink.close()
        fh.flush()
        os.fsync(fh.fileno())
        writer.close()
        os.replace(tmp, out)
    except BaseException as exc:
        writer.close()
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            raise DiskFullError(
                f"the disk filled up writing {out.name}: the partial file was "
                f"removed; the GGUF needs about {_total_out(plan, types)} "
                "bytes"
            ) from None
        raise
    return ConvertResult(
        path=out,
        architecture=info.architecture,
        tensor_count=len(plan),
        bytes_written=out.stat().st_size,
        seconds=time.monotonic() - started,
        sha256=f"sha256:{hasher.hexdigest()}" if hasher is not None else None,
        notes=notes,
    )
