"""The F16 path of a conversion (bf16 read with pread in blocks, rows reordered, rounded into
pooled buffers): its bytes are ``bf16_to_f16`` of the tensor's rows in order, whatever the
block and buffer edges, for every bf16 value (zeros, subnormals, inf, nan included)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from localllm._exceptions import TruncatedShardError
from localllm.convert import convert as convert_module
from localllm.convert.base import llama_rope_permutation
from localllm.convert.floats import bf16_to_f16
from localllm.convert.shards import TensorEntry, read_blocks
from localllm.convert.sink import BufferPool, Lent

ROWS, COLS, HEADS = 2048, 37, 32  # heads of 64 rows, rows of 74 bytes (odd on purpose)


@pytest.fixture
def tensor(tmp_path: Path) -> tuple[TensorEntry, np.ndarray]:
    """A bf16 tensor holding every bf16 value (then more at random), shuffled, at offset 13
    of a file."""
    rng = np.random.default_rng(0)
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    more = rng.integers(0, 1 << 16, ROWS * COLS - every.size, dtype=np.uint16)
    bits = rng.permutation(np.concatenate([every, more])).reshape(ROWS, COLS)
    path = tmp_path / "shard.bin"
    path.write_bytes(b"x" * 13 + bits.tobytes() + b"tail")
    return TensorEntry("w", path, "BF16", (ROWS, COLS), 13, bits.nbytes), bits


def _joined(blocks: object) -> np.ndarray:
    return np.concatenate([np.array(b) for b in blocks])  # type: ignore[attr-defined]


@pytest.mark.parametrize("buffer_bytes", [2, 1000, 74 * 64 * 2, 74 * 67 * 2, 1 << 20])
@pytest.mark.parametrize("ordered", [False, True], ids=["rows", "rope-order"])
def test_blocks_are_the_rows_in_order(
    tensor: tuple[TensorEntry, np.ndarray], buffer_bytes: int, ordered: bool
) -> None:
    """pread blocks of any size; rows reordered block by block where blocks hold whole heads
    (74*64*2), from the map where they cannot (67 rows, a row larger than half of 1000)."""
    entry, bits = tensor
    order = llama_rope_permutation(ROWS, HEADS) if ordered else None
    want = (bits[order] if order is not None else bits).reshape(-1)
    got = _joined(read_blocks(entry, np.empty(buffer_bytes, dtype=np.uint8), order=order))
    assert got.dtype == np.uint16 and np.array_equal(got, want)


def test_a_shard_cut_short_is_an_error(tensor: tuple[TensorEntry, np.ndarray]) -> None:
    entry, bits = tensor
    with entry.file.open("r+b") as fh:
        fh.truncate(13 + bits.nbytes - 5)
    with pytest.raises(TruncatedShardError, match=r"shard\.bin ended at byte"):
        _joined(read_blocks(entry, np.empty(4096, dtype=np.uint8)))


@pytest.mark.parametrize("pool_bytes", [1000, 4096, 74 * 64 * 2, 1 << 20])
@pytest.mark.parametrize("ordered", [False, True], ids=["rows", "rope-order"])
def test_pooled_f16_is_bf16_to_f16_of_the_rows(
    tensor: tuple[TensorEntry, np.ndarray],
    monkeypatch: pytest.MonkeyPatch,
    pool_bytes: int,
    ordered: bool,
) -> None:
    """The conversion's fast path: buffers filled to their end across read blocks (3000 bytes
    read at a time here), the last one as far as the tensor goes, each given back once
    written; the bytes equal bf16_to_f16 of the rows in order."""
    entry, bits = tensor
    monkeypatch.setattr(convert_module, "_READ_BYTES", 3000)
    order = llama_rope_permutation(ROWS, HEADS) if ordered else None
    pool = BufferPool(2, pool_bytes)
    chunks = []
    for lent in convert_module._bf16_as_f16(entry, order, pool):
        assert isinstance(lent, Lent) and lent.array.dtype == np.float16
        chunks.append(lent.array.view(np.uint16).copy())
        lent.give_back()  # as the writer does: with two buffers, the next take() needs it
    want = bf16_to_f16(bits[order] if order is not None else bits).view(np.uint16).reshape(-1)
    assert all(c.nbytes == pool_bytes // 2 * 2 for c in chunks[:-1])
    assert np.array_equal(np.concatenate(chunks), want)
