"""Split a GGUF file into parts the way ``gguf-split`` does (``<stem>-0000i-of-0000n.gguf``).

The metadata and tensors are copied with ``gguf.GGUFReader`` and written again with
``gguf.GGUFWriter(split_max_tensors=...)``, which adds the ``split.*`` keys llama.cpp reads.
"""

from __future__ import annotations

from pathlib import Path

import gguf

__all__ = ["split_gguf"]


def split_gguf(source: Path, folder: Path, parts: int) -> list[Path]:
    """Write ``source`` as ``parts`` files in ``folder``; returns them in order."""
    reader = gguf.GGUFReader(source)
    tensors = list(reader.tensors)
    per_part = -(-len(tensors) // parts)
    architecture = reader.fields["general.architecture"].contents()
    folder.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(folder / source.name, architecture, split_max_tensors=per_part)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        main_type = field.types[0]
        sub_type = field.types[-1] if main_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), main_type, sub_type=sub_type)
    for tensor in tensors:
        writer.add_tensor(
            tensor.name,
            tensor.data,
            raw_shape=tuple(reversed([int(d) for d in tensor.shape])),
            raw_dtype=tensor.tensor_type,
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    written = sorted(folder.glob(f"{source.stem}-*-of-*.gguf"))
    assert len(written) == parts, f"expected {parts} parts, got {[p.name for p in written]}"
    return written
