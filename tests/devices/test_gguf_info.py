"""GGUF inspection of good files (checked against gguf.GGUFReader) and of broken ones."""

from __future__ import annotations

import struct
import time
from pathlib import Path

import gguf
import pytest

from localllm import GGUFError
from localllm.gguf_info import estimate_memory, inspect_gguf


def test_tiny_model(tiny_gguf: Path) -> None:
    info = inspect_gguf(tiny_gguf)
    assert info.architecture == "llama"
    assert info.file_type == "F32"
    assert info.block_count == 2
    assert (info.head_count, info.head_count_kv) == (4, 2)
    assert info.embedding_length == 256
    assert info.context_length == 4096
    assert info.vocab_size == 296
    assert info.tokenizer_kind == "BPE (byte-level)"
    assert info.chat_template and "<|im_start|>" in info.chat_template
    assert info.license == "MIT"
    assert info.file_size == tiny_gguf.stat().st_size


def test_smollm2_agrees_with_gguf_reader(smollm2_gguf: Path) -> None:
    info = inspect_gguf(smollm2_gguf)
    reader = gguf.GGUFReader(smollm2_gguf)
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        ours = info.metadata[key]
        if field.types[0] == gguf.GGUFValueType.ARRAY and len(field.data) > 1024:
            assert ours.length == len(field.data)
        else:
            assert (
                ours == pytest.approx(field.contents())
                if isinstance(ours, float)
                else ours == field.contents()
            )
    assert [t.name for t in info.tensors] == [t.name for t in reader.tensors]
    assert [t.n_bytes for t in info.tensors] == [int(t.n_bytes) for t in reader.tensors]
    assert info.parameter_count == sum(int(t.n_elements) for t in reader.tensors)
    assert info.parameter_size == "134.52M"
    assert info.file_type == "Q4_1"
    assert info.context_length == 8192
    assert (info.block_count, info.head_count, info.head_count_kv) == (30, 9, 3)
    assert info.license == "apache-2.0"


def test_memory_estimate_scales_with_context(smollm2_gguf: Path) -> None:
    info = inspect_gguf(smollm2_gguf)
    small = estimate_memory(info, 2048)
    large = estimate_memory(info, 8192)
    # 30 layers x 3 kv heads x (64 + 64) x 2 bytes = 23,040 bytes per cell in f16.
    assert small["kv_cache"] == 2048 * 23040
    assert large["kv_cache"] == 4 * small["kv_cache"]
    assert estimate_memory(info, 2048, "q8_0")["kv_cache"] < small["kv_cache"]
    assert small["weights"] <= info.file_size < small["total"]


def _header(version: int = 3, tensors: int = 0, kvs: int = 0) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, tensors, kvs)


def _kv_string(key: str, value: str) -> bytes:
    k, v = key.encode(), value.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<I", 8) + struct.pack("<Q", len(v)) + v


BROKEN = {
    "empty": b"",
    "text file": b"this is not a model at all, just some text\n",
    "bad magic": b"GGML" + b"\0" * 40,
    "version 1": _header(version=1) + b"\0" * 16,
    "version 99": _header(version=99) + b"\0" * 16,
    "huge kv count": _header(kvs=2**60) + b"\0" * 64,
    "huge tensor count": _header(tensors=2**62) + b"\0" * 64,
    "kv truncated": _header(kvs=1) + _kv_string("general.name", "x" * 100)[:50],
    "string length absurd": _header(kvs=1) + struct.pack("<Q", 2**62) + b"key",
    "array count absurd": _header(kvs=1)
    + struct.pack("<Q", 3)
    + b"arr"
    + struct.pack("<IIQ", 9, 8, 2**40)
    + b"\0" * 64,
    "unknown value type": _header(kvs=1)
    + struct.pack("<Q", 3)
    + b"key"
    + struct.pack("<I", 77)
    + b"\0" * 16,
    "too many dims": _header(tensors=1)
    + struct.pack("<Q", 1)
    + b"t"
    + struct.pack("<I", 9)
    + b"\0" * 80,
    "tensor beyond end": _header(tensors=1)
    + struct.pack("<Q", 1)
    + b"t"
    + struct.pack("<I", 1)
    + struct.pack("<Q", 1024)
    + struct.pack("<I", 0)
    + struct.pack("<Q", 0),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_files_fail_fast_with_a_clear_error(tmp_path: Path, case: str) -> None:
    path = tmp_path / "broken.gguf"
    path.write_bytes(BROKEN[case])
    started = time.monotonic()
    with pytest.raises(GGUFError) as info:
        inspect_gguf(path)
    assert time.monotonic() - started < 2, "inspection must not hang on absurd counts"
    message = str(info.value)
    assert any(word in message for word in ("GGUF", "truncated", "corrupt")), message


@pytest.mark.parametrize("fraction", [0.0001, 0.01, 0.5, 0.999])
def test_truncated_real_model(tmp_path: Path, tiny_gguf: Path, fraction: float) -> None:
    data = tiny_gguf.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: max(24, int(len(data) * fraction))])
    with pytest.raises(GGUFError, match=r"truncated|corrupt|not a GGUF"):
        inspect_gguf(cut)


def test_missing_and_directory(tmp_path: Path) -> None:
    with pytest.raises(GGUFError, match="no such file"):
        inspect_gguf(tmp_path / "absent.gguf")
    with pytest.raises(GGUFError, match="directory"):
        inspect_gguf(tmp_path)


def test_llama_cpp_loads_and_generates_from_the_tiny_model(tiny_gguf: Path) -> None:
    from llama_cpp import Llama

    llm = Llama(str(tiny_gguf), n_ctx=256, verbose=False)
    first = llm.create_completion("the sky is", max_tokens=8, temperature=0)["choices"][0]["text"]
    second = llm.create_completion("the sky is", max_tokens=8, temperature=0)["choices"][0]["text"]
    assert first and first == second
    assert llm.n_vocab() == 296
