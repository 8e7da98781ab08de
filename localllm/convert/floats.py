"""Float conversions numpy does slowly or not at all: bf16 to float32 and to float16.

numpy has no bf16, and its float32 → float16 cast runs element by element (about 10 ns each
here), which made it the bottleneck of a conversion. bf16 → f16 is done on the bits instead:
for every value whose exponent f16 can hold as a normal number the result is exact (bf16's
7-bit mantissa fits f16's 10 bits), and it is a handful of vectorised integer operations. The
rare others (zeros, f16 subnormals, values beyond f16's range, inf, nan) go through numpy's own
cast, so the result equals ``bf16_to_f32(x).astype(float16)`` bit for bit.
"""

from __future__ import annotations

import numpy as np

__all__ = ["bf16_to_f16", "bf16_to_f32"]

# bf16 exponents (bias 127) that are normal f16 exponents (bias 15): 2**-14 .. 2**15.
_LOW, _HIGH = 127 - 14, 127 + 15


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """bf16 values (their raw uint16 bits) as float32: the bits in the upper half."""
    return np.left_shift(bits, 16, dtype=np.uint32).view(np.float32)


def bf16_to_f16(bits: np.ndarray) -> np.ndarray:
    """bf16 values (raw uint16 bits) as float16, rounded as numpy's cast rounds them."""
    bits = np.ascontiguousarray(bits, dtype=np.uint16)
    exp = (bits >> 7) & 0xFF
    out = ((exp - np.uint16(_LOW - 1)) << 10) | ((bits & 0x7F) << 3) | (bits & 0x8000)
    odd = np.flatnonzero((exp < _LOW) | (exp > _HIGH))
    if odd.size:
        flat = out.reshape(-1)
        with np.errstate(over="ignore"):  # beyond f16: inf, as numpy casts it
            flat[odd] = bf16_to_f32(bits.reshape(-1)[odd]).astype(np.float16).view(np.uint16)
    return out.view(np.float16)
