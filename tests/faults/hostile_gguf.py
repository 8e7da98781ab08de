"""A corpus of crafted GGUF files: each breaks one rule of the format, or of being a model.

GGUF files come from strangers (pulls, uploads, paths). The daemon must read them defensively
before llama.cpp ever sees them (see ``localllm/gguf_info.py``): every case here must be
refused with a clear message, fast, without taking the daemon down.

Layout reminder (little-endian)::

    "GGUF" u32 version  u64 tensor_count  u64 kv_count
    kv:     string key, u32 value_type, value      (string = u64 length + bytes)
    tensor: string name, u32 n_dims, u64 dims[n_dims], u32 ggml_type, u64 offset
    padding to general.alignment (32), then tensor data at the given offsets

:func:`hostile_corpus` returns ``{case: HostileCase}``; ``structural`` cases break the file
format (the header reader must refuse them), the others are well-formed files that are still
no model (no tensors, no or a mistyped architecture).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = ["HostileCase", "hostile_corpus"]

# GGUF value types (gguf.GGUFValueType)
U8, U32, F32_VALUE, STRING, ARRAY, U64 = 0, 4, 6, 8, 9, 10
# ggml tensor types
F32, Q4_0 = 0, 2


@dataclass(frozen=True)
class HostileCase:
    """One crafted file."""

    data: bytes
    structural: bool = True
    """True when the file breaks the GGUF format itself (not only the model's contents)."""


def _u32(value: int) -> bytes:
    return struct.pack("<I", value)


def _u64(value: int) -> bytes:
    return struct.pack("<Q", value)


def _string(value: bytes | str) -> bytes:
    raw = value.encode() if isinstance(value, str) else value
    return _u64(len(raw)) + raw


def _kv(key: str, value_type: int, payload: bytes) -> bytes:
    return _string(key) + _u32(value_type) + payload


def _kv_string(key: str, value: str) -> bytes:
    return _kv(key, STRING, _string(value))


def _tensor(name: str, dims: tuple[int, ...], ggml_type: int = F32, offset: int = 0) -> bytes:
    return (
        _string(name) + _u32(len(dims)) + b"".join(map(_u64, dims)) + _u32(ggml_type) + _u64(offset)
    )


def _file(
    kvs: list[bytes],
    tensors: list[bytes],
    data: bytes = b"",
    *,
    version: int = 3,
    n_kvs: int | None = None,
    n_tensors: int | None = None,
) -> bytes:
    head = b"GGUF" + _u32(version) + _u64(len(tensors) if n_tensors is None else n_tensors)
    head += _u64(len(kvs) if n_kvs is None else n_kvs)
    body = head + b"".join(kvs) + b"".join(tensors)
    return body + b"\0" * (-len(body) % 32) + data


ARCH = _kv_string("general.architecture", "llama")
EMBD = _tensor("token_embd.weight", (8, 4))  # 32 F32 values: 128 bytes at offset 0
EMBD_DATA = b"\0" * 128


def _with_tensor(tensor: bytes, data: bytes = EMBD_DATA, kvs: list[bytes] | None = None) -> bytes:
    return _file([ARCH, *(kvs or [])], [tensor], data)


def hostile_corpus(tiny: bytes) -> dict[str, HostileCase]:
    """The crafted files; ``tiny`` is a real (tiny) GGUF model to cut and patch."""
    cases = {
        # not GGUF at all
        "empty": b"",
        "text-file": b"this is not a model at all, just some text\n" * 4,
        "bad-magic": b"GGML" + _u32(3) + _u64(0) + _u64(0) + b"\0" * 32,
        "truncated-header": b"GGUF" + _u32(3) + b"\0\0\0\0",
        "version-1": _file([ARCH], [], version=1),
        "version-99": _file([ARCH], [], version=99),
        "version-big-endian": _file([ARCH], [], version=3 << 24),
        # counts that the bytes cannot hold
        "kv-count-absurd": _file([ARCH], [], n_kvs=1 << 60) + b"\0" * 64,
        "tensor-count-absurd": _file([ARCH], [], n_tensors=1 << 62) + b"\0" * 64,
        "kv-count-overstated": _file([ARCH], [], n_kvs=5),
        "tensor-count-overstated": _file([ARCH], [EMBD], EMBD_DATA, n_tensors=3),
        # strings
        "key-length-absurd": _file([_u64(1 << 62) + b"key"], []) + b"\0" * 32,
        "string-beyond-file": _file([_kv("general.name", STRING, _u64(1 << 30) + b"abc")], []),
        "string-over-limit": _file([_kv("general.name", STRING, _u64(65 << 20) + b"abc")], []),
        # (no padding after it: zeros would complete the key)
        "key-truncated": b"GGUF"
        + _u32(3)
        + _u64(0)
        + _u64(2)
        + ARCH
        + _string("general.name")[:12],
        # values of the wrong or an unknown type
        "unknown-value-type": _file([_kv("general.name", 77, b"\0" * 16)], []),
        "array-unknown-element-type": _file(
            [_kv("tokenizer.ggml.tokens", ARRAY, _u32(77) + _u64(2) + b"\0" * 16)], []
        ),
        "array-count-absurd": _file(
            [_kv("tokenizer.ggml.scores", ARRAY, _u32(F32_VALUE) + _u64(1 << 40))], []
        )
        + b"\0" * 64,
        "array-of-strings-absurd": _file(
            [_kv("tokenizer.ggml.tokens", ARRAY, _u32(STRING) + _u64(1 << 31))], []
        )
        + b"\0" * 64,
        "array-nested-too-deep": _file(
            [
                _kv(
                    "x",
                    ARRAY,
                    _u32(ARRAY) + _u64(1) + _u32(ARRAY) + _u64(1) + _u32(ARRAY) + _u64(1),
                )
            ],
            [],
        )
        + b"\0" * 64,
        "alignment-not-power-of-two": _with_tensor(
            EMBD, kvs=[_kv("general.alignment", U32, _u32(3))]
        ),
        "alignment-zero": _with_tensor(EMBD, kvs=[_kv("general.alignment", U32, _u32(0))]),
        "alignment-wrong-type": _with_tensor(EMBD, kvs=[_kv_string("general.alignment", "32")]),
        # tensors
        "tensor-offset-beyond-file": _with_tensor(
            _tensor("token_embd.weight", (8, 4), offset=4096)
        ),
        "tensor-offset-misaligned": _with_tensor(
            _tensor("token_embd.weight", (8, 4), offset=4), EMBD_DATA + b"\0" * 32
        ),
        "tensor-data-short": _with_tensor(EMBD, EMBD_DATA[:100]),
        "tensor-zero-dimension": _with_tensor(_tensor("token_embd.weight", (0, 4))),
        "tensor-too-many-dimensions": _with_tensor(_tensor("token_embd.weight", (2,) * 9)),
        "tensor-absurd-shape": _with_tensor(_tensor("token_embd.weight", (1 << 50, 4))),
        "tensor-size-overflows": _with_tensor(_tensor("token_embd.weight", (1 << 40,) * 4)),
        "tensor-unknown-type": _with_tensor(_tensor("token_embd.weight", (8, 4), ggml_type=999)),
        "tensor-row-not-whole-blocks": _with_tensor(
            _tensor("token_embd.weight", (33, 1), ggml_type=Q4_0)
        ),
        # a real model, cut short
        "model-cut-in-metadata": tiny[:2000],
        "model-cut-in-tensor-data": tiny[: len(tiny) // 2],
        "model-missing-last-bytes": tiny[:-1000],
    }
    corpus = {name: HostileCase(data) for name, data in cases.items()}
    # Well-formed GGUF files that are still not a model llama.cpp could load.
    corpus["no-tensors"] = HostileCase(_file([ARCH], []), structural=False)
    corpus["no-architecture"] = HostileCase(_file([], [EMBD], EMBD_DATA), structural=False)
    corpus["architecture-wrong-type"] = HostileCase(
        _file([_kv("general.architecture", U32, _u32(7))], [EMBD], EMBD_DATA), structural=False
    )
    return corpus
