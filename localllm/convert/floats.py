"""Float conversions numpy does slowly or not at all: bf16 to float32 and to float16.

numpy has no bf16, and its float32 → float16 cast runs element by element (about 10 ns each
here), which made it the bottleneck of a conversion. bf16 has only 65536 values, so bf16 → f16
is one gather from a 128 KiB table built once with numpy's own cast: the result equals
``bf16_to_f32(x).astype(float16)`` bit for bit (inf beyond f16's range, f16 subnormals rounded
as numpy rounds them), at the cost of one pass over the data.
"""

from __future__ import annotations

from functools import cache

import numpy as np

__all__ = ["bf16_to_f16", "bf16_to_f32"]


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


def bf16_to_f16(bits: np.ndarray) -> np.ndarray:
    """bf16 values (raw uint16 bits) as float16, rounded as numpy's cast rounds them."""
    return _f16_table()[np.asarray(bits, dtype=np.uint16)]
