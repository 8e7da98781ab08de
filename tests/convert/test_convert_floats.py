"""The converter's bit-level bf16 conversions equal numpy's float casts for every bf16 value."""

from __future__ import annotations

import numpy as np

from localllm.convert.floats import bf16_to_f16, bf16_to_f32


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
