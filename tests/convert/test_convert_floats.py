"""The converter's bit-level bf16 conversions equal numpy's float casts for every bf16 value,
whatever the size, block edges and values outside f16's normal range."""

from __future__ import annotations

import numpy as np
import pytest

from localllm.convert.floats import _BLOCK, _f16_table, bf16_to_f16, bf16_to_f32


def test_bf16_to_f32_is_the_upper_half() -> None:
    x = np.array([1.0, -2.5, 3.140625, 0.0, -0.0, np.inf], dtype=np.float32)
    bits = (x.view(np.uint32) >> 16).astype(np.uint16)
    assert np.array_equal(bf16_to_f32(bits), x)


def test_bf16_to_f16_equals_numpys_cast_for_all_65536_values() -> None:
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).reshape(256, 256)
    with np.errstate(over="ignore"):
        want = bf16_to_f32(bits).astype(np.float16)
        got = bf16_to_f16(bits)
    assert got.shape == bits.shape and got.dtype == np.float16
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan])


def _every_bf16() -> np.ndarray:
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


@pytest.mark.parametrize("size", [1, 7, _BLOCK - 1, _BLOCK, _BLOCK + 1, 3 * _BLOCK + 11])
def test_bf16_to_f16_is_the_tables_bits_at_any_size(size: int) -> None:
    """The integer path (f16's normal range) and the table (zeros, subnormals, beyond range,
    inf, nan) meet at every block edge: bit for bit the table's gather, nan payloads too."""
    rng = np.random.default_rng(size)
    bits = np.concatenate(
        [rng.permutation(_every_bf16()), rng.integers(0, 1 << 16, size, dtype=np.uint16)]
    )[:size]
    want = _f16_table().view(np.uint16)[bits]
    assert np.array_equal(bf16_to_f16(bits).view(np.uint16), want)
    out = np.full(size, 7, dtype=np.float16)
    assert bf16_to_f16(bits, out=out) is out
    assert np.array_equal(out.view(np.uint16), want)


def test_bf16_to_f16_in_a_block_of_mostly_zeros_and_edges() -> None:
    """A block mostly outside the integer path (a pruned or padded tensor) takes the table for
    the whole block; the range's edges (smallest normal, largest finite, first overflow)."""
    edges = np.array(
        [
            0x0000,
            0x8000,
            0x3880,
            0x387F,
            0xB880,
            0x477F,
            0x4780,
            0xC780,
            0x7F80,
            0xFF80,
            0x7FC1,
            0x0001,
            0x3800,
            0x37FF,
        ],
        dtype=np.uint16,
    )
    bits = np.zeros(_BLOCK + 200_000, dtype=np.uint16)
    bits[::97] = np.resize(edges, bits[::97].size)
    for x in (bits, edges):
        assert np.array_equal(bf16_to_f16(x).view(np.uint16), _f16_table().view(np.uint16)[x])
    assert bf16_to_f16(edges)[3] != 0 and bf16_to_f16(edges)[2] == np.float16(2.0**-14)


def test_bf16_to_f16_keeps_the_shape_and_checks_out() -> None:
    bits = _every_bf16().reshape(64, 1024)
    assert bf16_to_f16(bits).shape == (64, 1024)
    assert bf16_to_f16(bits[:, ::2]).shape == (64, 512)  # a strided view is copied first
    with pytest.raises(ValueError, match="C-contiguous float16"):
        bf16_to_f16(bits, out=np.empty(bits.size, dtype=np.float32))
    with pytest.raises(ValueError, match="C-contiguous float16"):
        bf16_to_f16(bits, out=np.empty(bits.size - 1, dtype=np.float16))


def test_bf16_to_f16_fixes_up_every_value_among_weights() -> None:
    """Weights as models hold them (nearly all in f16's normal range) with every one of the
    65536 bf16 values spread among them, a few per block: each block takes the integer path
    and fixes its outsiders from the table, bit for bit."""
    rng = np.random.default_rng(7)
    weights = rng.standard_normal(50 << 16, dtype=np.float32) * 0.02
    bits = (weights.view(np.uint32) >> 16).astype(np.uint16)
    bits[::50] = rng.permutation(_every_bf16())
    outside = (bits & 0x7FFF) - np.uint16(0x3880) >= 0x0F00
    assert outside.reshape(-1, _BLOCK // 2).mean(axis=1).max() < 1 / 8  # the fix-up branch
    assert np.array_equal(bf16_to_f16(bits).view(np.uint16), _f16_table().view(np.uint16)[bits])
