"""Float conversions numpy does slowly or not at all: bf16 to float32 and to float16.

numpy has no bf16, and its float32 → float16 cast runs element by element (about 1.4 GB/s of
bf16 input on an AVX-512 core with numpy 2.4), which made it the bottleneck of a conversion.
bf16 → f16 needs no float at all:

- A bf16 whose exponent lies in f16's normal range (magnitudes 2**-14 up to 65280, nearly every
  weight of a model) is exactly an f16: its 7 mantissa bits become the top of f16's 10, its
  exponent is rebiased (127 → 15). That is a few integer passes over the bits, which numpy
  runs in SIMD.
- Every other value (zeros, f16 subnormals, which are rounded, beyond f16's range, inf, nan) is
  taken from a 128 KiB table of all 65536 bf16 values built once with numpy's own cast.

So the result equals ``bf16_to_f32(x).astype(float16)`` bit for bit (the table is that cast;
the test checks all 65536 values). A plain gather from the table for every element does the
same, but numpy first turns the uint16 indices into intp (four times the input's bytes):
the integer passes cost about 0.25 CPU-seconds per GB of input here, the gather 0.35, and the
gather over 32 MB chunks (its intp temporary through main memory) about twice that.
The work runs in blocks that stay in the core's L2 cache.
"""

from __future__ import annotations

from functools import cache

import numpy as np

__all__ = ["bf16_to_f16", "bf16_to_f32"]

_BLOCK = 1 << 17
"""Elements per block: 256 KiB of input, output and scratch each (and a 128 KiB mask), in a
core's 1 MiB L2 (3.3 GB/s of input read and rounded, against 2.8 with blocks of 2**15)."""
_NORMAL_LOW, _NORMAL_SPAN = 0x3880, 0x0F00
"""bf16 magnitudes (sign dropped) that are f16 normals: exponents 113..142 of 255, i.e. the
bits from 0x3880 up to, not including, 0x3880 + 0x0F00."""
_REBIAS = 0x3800 << 3 & 0xFFFF
"""The exponent bias difference (127 - 15 = 112, i.e. 0x3800 in bf16's exponent field) as it
lies after the shift by 3 that moves bf16's bits into f16's positions."""


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """bf16 values (their raw uint16 bits) as float32: the bits in the upper half."""
    return np.left_shift(bits, 16, dtype=np.uint32).view(np.float32)


@cache
def _f16_table() -> np.ndarray:
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    with np.errstate(over="ignore"):  # beyond f16's range: inf, as numpy casts it
        table = bf16_to_f32(every).astype(np.float16)
    table.flags.writeable = False
    return table


def _convert_block(b: np.ndarray, o: np.ndarray, x: np.ndarray, k: np.ndarray) -> None:
    """``o`` (uint16) = f16 bits of ``b`` (bf16 bits); ``x`` and ``k`` are scratch."""
    table = _f16_table().view(np.uint16)
    # Which values are outside f16's normal range: b << 1 drops the sign, and one unsigned
    # subtraction and compare checks both ends (below the range wraps round to large).
    np.left_shift(b, 1, out=x)
    np.subtract(x, _NORMAL_LOW << 1, out=x)
    np.greater_equal(x, _NORMAL_SPAN << 1, out=k)
    # Exponent and mantissa into f16's places (the shift drops the sign and two high exponent
    # bits, which the rebiasing subtraction would remove anyway), rebiased, the sign put back.
    np.left_shift(b, 3, out=o)
    np.subtract(o, _REBIAS, out=o)
    np.bitwise_and(b, 0x8000, out=x)
    np.bitwise_or(o, x, out=o)
    rest = np.flatnonzero(k)
    if rest.size > b.size >> 3:
        # Mostly zeros or tiny values (a pruned or padded tensor): the table for the whole block.
        # mode="clip" never clips (a uint16 is a valid index of the 65536 entries); the
        # default, "raise", would gather into a temporary and copy it into ``o``.
        np.take(table, b, out=o, mode="clip")
    elif rest.size:
        o[rest] = table[b[rest]]


def bf16_to_f16(bits: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """bf16 values (raw uint16 bits) as float16, rounded as numpy's cast rounds them.

    ``out`` (float16, C-contiguous, of ``bits``' size; any shape) receives them instead of a new
    array of ``bits``' shape, and is returned."""
    bits = np.ascontiguousarray(bits, dtype=np.uint16)
    if out is None:
        out = np.empty(bits.shape, dtype=np.float16)
    elif out.dtype != np.float16 or out.size != bits.size or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous float16 array of {bits.size} elements")
    src, dst = bits.reshape(-1), out.reshape(-1).view(np.uint16)
    block = min(_BLOCK, src.size)
    x, k = np.empty(block, dtype=np.uint16), np.empty(block, dtype=np.bool_)
    for start in range(0, src.size, block):
        b = src[start : start + block]
        _convert_block(b, dst[start : start + block], x[: b.size], k[: b.size])
    return out
