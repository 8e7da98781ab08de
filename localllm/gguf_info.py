"""GGUF inspection: what a model file is, read defensively before llama.cpp ever sees it.

GGUF files come from strangers. :func:`inspect_gguf` walks the whole header with a bounded
reader: every count, length and offset is checked against the bytes that actually exist, so a
truncated file, a file that is not GGUF, or one with absurd counts fails fast with
:class:`GGUFError` instead of hanging or exhausting memory.

The walk collects scalar metadata and array lengths but skips array contents; the vocabulary
of a 150k-token model is not materialised. (``gguf.GGUFReader`` builds numpy views of every
field, about 3 s for SmolLM2's 49k-token vocabulary; the tests check that this module agrees with
it.) Type tables, quantization block sizes and key names come from the ``gguf`` package.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._exceptions import GGUFError
from ._gguf_constants import gguf_constants

# gguf's own enums, without importing the gguf package (numpy and more: see _gguf_constants)
_constants = gguf_constants()
GGML_QUANT_SIZES = _constants.GGML_QUANT_SIZES
GGMLQuantizationType = _constants.GGMLQuantizationType
GGUFValueType = _constants.GGUFValueType
LlamaFileType = _constants.LlamaFileType

__all__ = [
    "GGUFInfo",
    "HeaderIncomplete",
    "TensorInfo",
    "draft_incompatibility",
    "estimate_memory",
    "format_parameter_count",
    "inspect_gguf",
    "inspect_gguf_header",
]

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
MAX_DIMS = 4
MAX_STRING = 64 << 20  # a chat template or license can be long, not 64 MiB long
MAX_ARRAY_DEPTH = 2
# Scalars kept as metadata; arrays are summarised by their length (see ArrayInfo).
_SCALAR_FORMATS: dict[int, str] = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
# Small arrays (per-layer head counts, languages) are kept whole; big ones only counted.
_SMALL_ARRAY = 1024
# Bytes per element of the KV cache by type (q8_0: 34 bytes per 32, q4_0: 18 per 32).
KV_BYTES_PER_ELEMENT = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}


@dataclass(frozen=True)
class ArrayInfo:
    """A metadata array too large to keep: its element type and length."""

    element_type: str
    """Name of the element type (``STRING``, ``INT32``...)."""
    length: int
    """Number of elements."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's header entry."""

    name: str
    """Tensor name, e.g. ``blk.0.attn_q.weight``."""
    shape: tuple[int, ...]
    """Dimensions, innermost first (ggml order)."""
    type: str
    """ggml type name (``F32``, ``Q4_K``...)."""
    offset: int
    """Offset of the data relative to the start of the data section."""
    n_bytes: int
    """Bytes of data."""

    @property
    def n_elements(self) -> int:
        """Number of elements."""
        count = 1
        for dim in self.shape:
            count *= dim
        return count


@dataclass(frozen=True)
class GGUFInfo:
    """What a GGUF file says about itself."""

    path: Path
    """The file inspected."""
    file_size: int
    """Size on disk in bytes."""
    version: int
    """GGUF format version."""
    metadata: dict[str, Any]
    """Every key/value; big arrays are :class:`ArrayInfo` summaries."""
    tensors: tuple[TensorInfo, ...] = field(repr=False)
    """Tensor headers in file order."""

    # -- convenience accessors ---------------------------------------------------------------

    def _arch_value(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(f"{self.architecture}.{key}", default)

    def _text(self, key: str) -> str | None:
        value = self.metadata.get(key)
        return value if isinstance(value, str) else None

    def require_model(self) -> None:
        """Raise :class:`GGUFError` unless this file can be a model llama.cpp loads (or the
        first part of one): a GGUF of metadata alone, or one naming no architecture, is not."""
        architecture = self.metadata.get("general.architecture")
        if not isinstance(architecture, str) or not architecture.strip():
            raise GGUFError(
                f"{self.path.name} is not a model: general.architecture is missing or not text"
            )
        if architecture == "clip":
            raise GGUFError(
                f"{self.path.name} is a vision projector (general.architecture 'clip'), not a "
                "model: name the model first, then the projector as a second FROM"
            )
        if self.metadata.get("general.type") == "adapter":
            raise GGUFError(
                f"{self.path.name} is a LoRA adapter (general.type 'adapter'), not a model: "
                "name the base model in FROM and the adapter in an ADAPTER line"
            )
        split = self.metadata.get("split.count", 1)
        if not self.tensors and (not isinstance(split, int) or split <= 1):
            raise GGUFError(f"{self.path.name} is not a model: it holds no tensors")

    @property
    def is_projector(self) -> bool:
        """True for a vision projector (``mmproj``): ``general.architecture`` is ``clip``."""
        return self.metadata.get("general.architecture") == "clip"

    def require_projector(self) -> None:
        """Raise :class:`GGUFError` unless this file is a vision projector with tensors."""
        if not self.is_projector:
            raise GGUFError(
                f"{self.path.name} is not a vision projector: its general.architecture is "
                f"{self.metadata.get('general.architecture')!r}, not 'clip'"
            )
        if not self.tensors:
            raise GGUFError(f"{self.path.name} is not a vision projector: it holds no tensors")

    @property
    def architecture(self) -> str:
        """``general.architecture`` (llama, qwen2, gemma3...)."""
        return str(self.metadata.get("general.architecture", "unknown"))

    @property
    def name(self) -> str | None:
        """``general.name``."""
        return self._text("general.name")

    @property
    def parameter_count(self) -> int:
        """Total elements over all tensors."""
        return sum(t.n_elements for t in self.tensors)

    @property
    def parameter_size(self) -> str:
        """Parameter count for people: ``134.52M``, ``8.0B``."""
        return format_parameter_count(self.parameter_count)

    @property
    def file_type(self) -> str:
        """Quantization of the file, Ollama-style (``Q4_K_M``, ``F16``, ``Q4_1``...)."""
        raw = self.metadata.get("general.file_type")
        if isinstance(raw, int):
            try:
                name = LlamaFileType(raw).name
            except ValueError:
                name = ""
            if name:
                return name.removeprefix("MOSTLY_").removeprefix("ALL_")
        # No (or unknown) file type: name the most common type among the matrices.
        counts: dict[str, int] = {}
        for tensor in self.tensors:
            if len(tensor.shape) >= 2:
                counts[tensor.type] = counts.get(tensor.type, 0) + tensor.n_bytes
        return max(counts, key=counts.__getitem__) if counts else "unknown"

    @property
    def context_length(self) -> int | None:
        """Context length the model was trained for."""
        return _whole(self._arch_value("context_length"))

    @property
    def embedding_length(self) -> int | None:
        """Hidden size (n_embd)."""
        return _whole(self._arch_value("embedding_length"))

    @property
    def block_count(self) -> int | None:
        """Number of layers."""
        return _whole(self._arch_value("block_count"))

    @property
    def head_count(self) -> int | None:
        """Attention heads (the first layer's, when given per layer)."""
        return _first_int(self._arch_value("attention.head_count"))

    @property
    def head_count_kv(self) -> int | None:
        """Key/value heads (GQA); equals :attr:`head_count` when absent."""
        return _first_int(self._arch_value("attention.head_count_kv")) or self.head_count

    @property
    def feed_forward_length(self) -> int | None:
        """FFN hidden size."""
        return _first_int(self._arch_value("feed_forward_length"))

    @property
    def vocab_size(self) -> int | None:
        """Tokens in the vocabulary."""
        tokens = self.metadata.get("tokenizer.ggml.tokens")
        if isinstance(tokens, ArrayInfo):
            return tokens.length
        if isinstance(tokens, list):
            return len(tokens)
        return _whole(self._arch_value("vocab_size"))

    @property
    def tokenizer_model(self) -> str | None:
        """``tokenizer.ggml.model``: ``gpt2`` (byte-level BPE), ``llama`` (SentencePiece)..."""
        return self._text("tokenizer.ggml.model")

    @property
    def tokenizer_kind(self) -> str:
        """The tokenizer family in words."""
        kinds = {
            "gpt2": "BPE (byte-level)",
            "llama": "SentencePiece",
            "bert": "WordPiece",
            "t5": "Unigram",
            "rwkv": "RWKV",
            "plamo2": "PLaMo-2",
        }
        model = self.tokenizer_model
        if model is None:
            return "none"
        return kinds.get(model, model)

    @property
    def chat_template(self) -> str | None:
        """``tokenizer.chat_template`` (a Jinja template), if present."""
        return self._text("tokenizer.chat_template")

    @property
    def license(self) -> str | None:
        """``general.license`` (an SPDX id or the license text)."""
        return self._text("general.license")

    @property
    def is_embedding_only(self) -> bool:
        """True for encoder models that cannot generate (BERT and friends)."""
        return self.architecture in {
            "bert",
            "nomic-bert",
            "jina-bert-v2",
            "modern-bert",
            "t5encoder",
        }

    @property
    def rank_pooling(self) -> bool:
        """True for rerankers: the file declares rank pooling (a classifier head scores a
        query and a document joined in one sequence; llama.cpp's pooling type 4)."""
        return self._arch_value("pooling_type") == 4

    @property
    def weights_bytes(self) -> int:
        """Bytes of tensor data."""
        return sum(t.n_bytes for t in self.tensors)

    def kv_cache_bytes(self, context_length: int, kv_cache_type: str = "f16") -> int:
        """Bytes of K and V cache for ``context_length`` cells of the given type."""
        layers = self.block_count or 0
        n_head = self.head_count or 1
        n_embd = self.embedding_length or 0
        key_length = self._arch_value("attention.key_length") or (n_embd // n_head if n_head else 0)
        value_length = self._arch_value("attention.value_length") or key_length
        kv_heads = self._arch_value("attention.head_count_kv", self.head_count or 0)
        per_layer_heads = (
            list(kv_heads) if isinstance(kv_heads, list) else [int(kv_heads or 0)] * layers
        )
        elements_per_cell = sum(h * (key_length + value_length) for h in per_layer_heads[:layers])
        return int(elements_per_cell * context_length * KV_BYTES_PER_ELEMENT[kv_cache_type])

    def summary(self) -> dict[str, Any]:
        """The facts ``localllm show`` prints."""
        return {
            "architecture": self.architecture,
            "parameters": self.parameter_size,
            "parameter_count": self.parameter_count,
            "quantization": self.file_type,
            "context_length": self.context_length,
            "embedding_length": self.embedding_length,
            "block_count": self.block_count,
            "head_count": self.head_count,
            "head_count_kv": self.head_count_kv,
            "vocab_size": self.vocab_size,
            "tokenizer": self.tokenizer_kind,
            "file_size": self.file_size,
        }


# llama.cpp's speculative example lets a draft's vocabulary differ from the target's by this
# many tokens (special tokens added at the end); the runner compares token texts at load.
MAX_DRAFT_VOCAB_DIFFERENCE = 128


def draft_incompatibility(target: GGUFInfo, draft: GGUFInfo) -> str | None:
    """Why ``draft`` cannot draft for ``target``, from metadata alone (None when it can):
    another tokenizer, other BOS/EOS tokens or vocabulary sizes too far apart. Token texts are
    compared by the runner when it loads the pair (the header walk skips the vocabulary)."""
    meta_t, meta_d = target.metadata, draft.metadata
    if target.tokenizer_model != draft.tokenizer_model:
        return f"tokenizers differ ({target.tokenizer_model} vs {draft.tokenizer_model})"
    for key, what in (
        ("tokenizer.ggml.bos_token_id", "BOS token"),
        ("tokenizer.ggml.eos_token_id", "EOS token"),
        ("tokenizer.ggml.add_bos_token", "adding BOS"),
        ("tokenizer.ggml.add_eos_token", "adding EOS"),
    ):
        if meta_t.get(key) != meta_d.get(key):
            return f"{what} differs ({meta_t.get(key)} vs {meta_d.get(key)})"
    size_t, size_d = target.vocab_size, draft.vocab_size
    if size_t is None or size_d is None or abs(size_t - size_d) > MAX_DRAFT_VOCAB_DIFFERENCE:
        return f"vocabulary sizes differ ({size_t} vs {size_d} tokens)"
    return None


def _whole(value: Any) -> int | None:
    return int(value) if isinstance(value, int) else None


def _first_int(value: Any) -> int | None:
    if isinstance(value, list):
        value = next((v for v in value if isinstance(v, int) and v > 0), None)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def format_parameter_count(count: int) -> str:
    """``134515008`` → ``134.52M``; ``8030261248`` → ``8.0B`` (Ollama's style)."""
    if count >= 1_000_000_000:
        return f"{count / 1e9:.1f}B"
    if count >= 1_000_000:
        return f"{count / 1e6:.2f}M"
    if count >= 1_000:
        return f"{count / 1e3:.2f}K"
    return str(count)


def estimate_memory(
    info: GGUFInfo, context_length: int, kv_cache_type: str = "f16", n_batch: int = 512
) -> dict[str, int]:
    """Estimate bytes needed to run ``info`` with ``context_length`` KV cells in total.

    Weights plus the KV cache plus a compute-buffer allowance (logits for one batch and a
    few activations of width n_embd/n_ff per batch token). An estimate, not a promise.
    """
    weights = info.weights_bytes
    kv_cache = info.kv_cache_bytes(context_length, kv_cache_type)
    width = (info.embedding_length or 0) * 4 + (info.feed_forward_length or 0) * 2
    compute = n_batch * ((info.vocab_size or 0) + width) * 4
    return {
        "weights": weights,
        "kv_cache": kv_cache,
        "compute": compute,
        "total": weights + kv_cache + compute,
    }


class HeaderIncomplete(GGUFError):
    """The bytes given end inside the header of a longer file: read more of it and try again
    (:func:`inspect_gguf_header`)."""

    def __init__(self, message: str, needed: int) -> None:
        super().__init__(message)
        self.needed = needed
        """Bytes from the start of the file the header needs at least."""


class _Cursor:
    """Reads little-endian values from a buffer, refusing to run past its end."""

    def __init__(self, buffer: mmap.mmap | bytes, size: int, file_size: int | None = None) -> None:
        self.buffer = buffer
        self.size = size
        self.file_size = size if file_size is None else file_size
        """Bytes of the whole file; more than ``size`` when the buffer holds its start only."""
        self.pos = 0

    def need(self, count: int, what: str) -> None:
        if count >= 0 and self.pos + count > self.size and self.pos + count <= self.file_size:
            raise HeaderIncomplete(
                f"the first {self.size} bytes end inside the GGUF header ({what})",
                self.pos + count,
            )
        if count < 0 or self.pos + count > self.size:
            raise GGUFError(
                f"truncated or corrupt GGUF: {what} needs {count} bytes at offset {self.pos}, "
                f"file has {self.size}"
            )

    def scalar(self, fmt: str, what: str) -> Any:
        width = struct.calcsize(fmt)
        self.need(width, what)
        (value,) = struct.unpack_from(fmt, self.buffer, self.pos)
        self.pos += width
        return value

    def u32(self, what: str) -> int:
        return int(self.scalar("<I", what))

    def u64(self, what: str) -> int:
        return int(self.scalar("<Q", what))

    def string(self, what: str) -> str:
        length = self.u64(f"length of {what}")
        if length > MAX_STRING:
            raise GGUFError(f"corrupt GGUF: {what} claims {length} bytes")
        self.need(length, what)
        raw = bytes(self.buffer[self.pos : self.pos + length])
        self.pos += length
        return raw.decode("utf-8", errors="replace")

    def skip_string(self, what: str) -> None:
        length = self.u64(f"length of {what}")
        self.need(length, what)
        self.pos += length


def _value_type(raw: int, key: str) -> GGUFValueType:
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise GGUFError(f"corrupt GGUF: key {key!r} has unknown value type {raw}") from None


def _read_value(cursor: _Cursor, value_type: GGUFValueType, key: str, depth: int = 0) -> Any:
    if value_type == GGUFValueType.STRING:
        return cursor.string(f"value of {key!r}")
    if value_type == GGUFValueType.ARRAY:
        if depth >= MAX_ARRAY_DEPTH:
            raise GGUFError(f"corrupt GGUF: key {key!r} nests arrays too deeply")
        element_type = _value_type(cursor.u32(f"array type of {key!r}"), key)
        length = cursor.u64(f"array length of {key!r}")
        # Every element takes at least one byte (strings at least eight): bound the count
        # by the bytes left before looping over it.
        minimum = (
            8
            if element_type in (GGUFValueType.STRING, GGUFValueType.ARRAY)
            else (struct.calcsize(_SCALAR_FORMATS[element_type]))
        )
        if length * minimum > cursor.file_size - cursor.pos:
            raise GGUFError(
                f"truncated or corrupt GGUF: array {key!r} claims {length} elements, "
                "more than the file holds"
            )
        if length <= _SMALL_ARRAY:
            return [_read_value(cursor, element_type, key, depth + 1) for _ in range(length)]
        if element_type == GGUFValueType.STRING:
            for _ in range(length):
                cursor.skip_string(f"element of {key!r}")
        elif element_type == GGUFValueType.ARRAY:
            for _ in range(length):
                _read_value(cursor, element_type, key, depth + 1)
        else:
            cursor.pos += length * minimum
        return ArrayInfo(element_type=element_type.name, length=length)
    return cursor.scalar(_SCALAR_FORMATS[value_type], f"value of {key!r}")


def _tensor_bytes(type_id: int, shape: tuple[int, ...], name: str) -> tuple[str, int]:
    try:
        qtype = GGMLQuantizationType(type_id)
    except ValueError:
        raise GGUFError(f"corrupt GGUF: tensor {name!r} has unknown type {type_id}") from None
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    if shape[0] % block_size:
        raise GGUFError(
            f"corrupt GGUF: tensor {name!r} row of {shape[0]} is not a multiple of "
            f"{qtype.name}'s block of {block_size}"
        )
    elements = 1
    for dim in shape:
        elements *= dim
    return qtype.name, elements // block_size * type_size


def inspect_gguf(path: str | Path) -> GGUFInfo:
    """Read and validate the header of the GGUF file at ``path``.

    Raises :class:`GGUFError` for anything that is not a complete, sane GGUF file.
    """
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, 2)
            if size < 24:
                raise GGUFError(f"{path.name} is not a GGUF file (only {size} bytes)")
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
                return _inspect(path, buffer, size)
    except FileNotFoundError:
        raise GGUFError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise GGUFError(f"{path} is a directory, not a GGUF file") from None
    except PermissionError:
        raise GGUFError(f"{path}: permission denied") from None


def inspect_gguf_header(data: bytes, file_size: int, name: str) -> GGUFInfo:
    """Read the header of a GGUF file of ``file_size`` bytes from its first bytes ``data``
    (a download's first range), with the same checks as :func:`inspect_gguf`; ``name`` names
    the file in messages and in :attr:`GGUFInfo.path`.

    Raises :class:`HeaderIncomplete` (with the bytes needed so far) when ``data`` ends inside
    the header, :class:`GGUFError` for anything that is not a sane GGUF.
    """
    if len(data) < 24 and file_size >= 24:
        raise HeaderIncomplete(f"{name}: {len(data)} bytes are too few for a GGUF header", 24)
    if file_size < 24:
        raise GGUFError(f"{name} is not a GGUF file (only {file_size} bytes)")
    return _inspect(Path(name), data, min(len(data), file_size), file_size)


def _inspect(
    path: Path, buffer: mmap.mmap | bytes, size: int, file_size: int | None = None
) -> GGUFInfo:
    cursor = _Cursor(buffer, size, file_size)
    size = cursor.file_size
    if buffer[:4] != GGUF_MAGIC:
        raise GGUFError(f"{path.name} is not a GGUF file (bad magic {bytes(buffer[:4])!r})")
    cursor.pos = 4
    version = cursor.u32("version")
    if version not in SUPPORTED_VERSIONS:
        raise GGUFError(f"{path.name}: GGUF version {version} is not supported (2 or 3 are)")
    tensor_count = cursor.u64("tensor count")
    kv_count = cursor.u64("metadata count")
    # The smallest key/value takes 13 bytes and the smallest tensor entry 24: bound the
    # counts by the file size before trusting them in a loop.
    if kv_count * 13 > size or tensor_count * 24 > size:
        raise GGUFError(
            f"truncated or corrupt GGUF: it claims {kv_count} metadata entries and "
            f"{tensor_count} tensors, more than {size} bytes can hold"
        )

    metadata: dict[str, Any] = {}
    for index in range(kv_count):
        key = cursor.string(f"key #{index}")
        value_type = _value_type(cursor.u32(f"type of {key!r}"), key)
        metadata[key] = _read_value(cursor, value_type, key)

    tensors: list[TensorInfo] = []
    for index in range(tensor_count):
        name = cursor.string(f"tensor name #{index}")
        n_dims = cursor.u32(f"dimension count of {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise GGUFError(f"corrupt GGUF: tensor {name!r} has {n_dims} dimensions")
        shape = tuple(cursor.u64(f"dimension of {name!r}") for _ in range(n_dims))
        if any(d == 0 or d > 1 << 40 for d in shape):
            raise GGUFError(f"corrupt GGUF: tensor {name!r} has absurd shape {shape}")
        type_id = cursor.u32(f"type of {name!r}")
        offset = cursor.u64(f"offset of {name!r}")
        type_name, n_bytes = _tensor_bytes(type_id, shape, name)
        tensors.append(
            TensorInfo(name=name, shape=shape, type=type_name, offset=offset, n_bytes=n_bytes)
        )

    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise GGUFError(f"corrupt GGUF: alignment {alignment!r} is not a power of two")
    data_start = (cursor.pos + alignment - 1) // alignment * alignment
    data_size = size - data_start
    for tensor in tensors:
        if tensor.offset % alignment or tensor.offset + tensor.n_bytes > data_size:
            raise GGUFError(
                f"truncated or corrupt GGUF: tensor {tensor.name!r} lies outside the file "
                f"(needs {data_start + tensor.offset + tensor.n_bytes} bytes, file has {size})"
            )
    return GGUFInfo(
        path=path, file_size=size, version=version, metadata=metadata, tensors=tuple(tensors)
    )
