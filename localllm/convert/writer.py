"""gguf's ``GGUFWriter``, packing a vocabulary's long arrays in bulk.

The writer packs a metadata array element by element through ``struct`` (about 3 µs each):
a 128k-token vocabulary (tokens, scores, types) and its merges took longer to pack than the
weights of a small model took to copy. This subclass packs arrays of strings, integers and
floats in one pass each, byte for byte as the writer would (little-endian files only; anything
else goes through the writer's own code).
"""

from __future__ import annotations

import struct
from typing import Any

import gguf
from gguf import GGUFEndian, GGUFValueType

__all__ = ["GGUFWriter"]

_BULK = {GGUFValueType.INT32: "i", GGUFValueType.FLOAT32: "f"}
_MIN_BULK = 64  # shorter arrays: the writer's own packing costs nothing worth saving


class GGUFWriter(gguf.GGUFWriter):
    """A ``gguf.GGUFWriter`` whose long string/int/float metadata arrays pack in bulk."""

    def _pack_val(
        self,
        val: Any,
        vtype: GGUFValueType,
        add_vtype: bool,
        sub_type: GGUFValueType | None = None,
    ) -> bytes:
        bulk = (
            self._pack_array(val)
            if (
                vtype == GGUFValueType.ARRAY
                and sub_type is None
                and self.endianess == GGUFEndian.LITTLE
                and isinstance(val, list | tuple)
                and len(val) >= _MIN_BULK
            )
            else None
        )
        if bulk is None:
            return super()._pack_val(val, vtype, add_vtype, sub_type)
        return (struct.pack("<I", vtype) if add_vtype else b"") + bulk

    @staticmethod
    def _pack_array(val: list[Any] | tuple[Any, ...]) -> bytes | None:
        # One element of each Python type tells the array's GGUF type, as the writer decides
        # it per element; mixed types go to the writer, which refuses them.
        kinds = {GGUFValueType.get_type(x) for x in {type(x): x for x in val}.values()}
        if len(kinds) != 1:
            return None
        (kind,) = kinds
        head = struct.pack("<IQ", kind, len(val))
        if kind == GGUFValueType.STRING:
            encoded = [x.encode("utf-8") if isinstance(x, str) else bytes(x) for x in val]
            lengths = struct.pack(f"<{len(encoded)}Q", *map(len, encoded))
            parts = [b""] * (2 * len(encoded))
            parts[0::2] = (lengths[i : i + 8] for i in range(0, len(lengths), 8))
            parts[1::2] = encoded
            return head + b"".join(parts)
        fmt = _BULK.get(kind)
        if fmt is None:
            return None
        return head + struct.pack(f"<{len(val)}{fmt}", *val)
