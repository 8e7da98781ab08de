"""The conversion's writers. The writer thread: arrays, pooled buffers, bytes and spans of a
shard copied by the kernel (``copy_file_range``, else ``sendfile``, else reads and writes) land
in order, byte for byte, and are hashed in order on the hash thread; a span past the end of its
file is an error, not a short tensor, and so is a failed hash. The GGUF writer:
long metadata arrays packed in bulk, byte for byte as gguf's own."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from localllm._exceptions import TruncatedShardError
from localllm.convert.sink import BackgroundWriter, BufferPool, FileSpan, Lent


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "shard.bin"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 3 << 20, dtype=np.uint8).tobytes())
    return path


@pytest.mark.parametrize("methods", [None, ["sendfile"], []], ids=["kernel", "sendfile", "reads"])
def test_spans_arrays_and_bytes_land_in_order(
    source: Path, tmp_path: Path, methods: list[str] | None
) -> None:
    data = source.read_bytes()
    array = np.arange(1000, dtype=np.float32)
    out = tmp_path / "out.bin"
    with out.open("wb") as fh:
        fh.write(b"HEAD")
        sink = BackgroundWriter(fh, depth=2)
        if methods is not None:
            sink._spans._methods = methods  # the fallbacks a filesystem may force
        sink.write(FileSpan(source, 5, 1 << 20))
        sink.write(array)
        sink.pad(32)
        sink.write(FileSpan(source, (2 << 20) + 3, (1 << 20) - 3))
        sink.write(b"tail")
        sink.close()
        assert sink.position == fh.tell()
    expected = b"HEAD" + data[5 : 5 + (1 << 20)] + array.tobytes()
    expected += bytes(-len(expected) % 32) + data[(2 << 20) + 3 :] + b"tail"
    assert out.read_bytes() == expected


def test_a_span_past_the_end_of_its_file_is_an_error(source: Path, tmp_path: Path) -> None:
    with (tmp_path / "out.bin").open("wb") as fh:
        sink = BackgroundWriter(fh)
        sink.write(FileSpan(source, (3 << 20) - 10, 20))
        with pytest.raises(TruncatedShardError, match=r"shard\.bin ended at byte"):
            sink.close()


def test_bulk_packed_metadata_is_gguf_writers_bytes(tmp_path: Path) -> None:
    """The converter's writer packs long arrays (a vocabulary) in bulk: the file's bytes are
    those gguf's own writer writes, and mixed arrays are still refused as it refuses them."""
    import gguf

    from localllm.convert.writer import GGUFWriter

    tokens = [f"tok{i}\u00e9" for i in range(300)] + [b"raw", bytearray(b"\xff")] * 40
    files = []
    for cls in (gguf.GGUFWriter, GGUFWriter):
        writer = cls(None, "llama")
        writer.add_token_list(tokens)
        writer.add_token_scores([-float(i) / 7 for i in range(380)])
        writer.add_token_types([gguf.TokenType.NORMAL] * 300 + [1, 3] * 40)
        writer.add_array("test.ints", list(range(-100, 100)))
        writer.add_array("test.short", [1, 2, 3])
        path = tmp_path / f"{cls.__module__}.gguf"
        writer.write_header_to_file(path)
        writer.write_kv_data_to_file()
        writer.close()
        files.append(path.read_bytes())
    assert files[0] == files[1] and len(files[0]) > 5000
    mixed = GGUFWriter(None, "llama")
    mixed.add_array("test.mixed", [1] * 100 + ["a"])
    mixed.write_header_to_file(tmp_path / "mixed.gguf")
    with pytest.raises(ValueError, match="same type"):
        mixed.write_kv_data_to_file()
    mixed.close()


@pytest.mark.parametrize("hashed", [False, True], ids=["plain", "hashed"])
def test_lent_buffers_are_written_in_order_and_given_back(
    source: Path, tmp_path: Path, hashed: bool
) -> None:
    """Pooled buffers (the F16 path's) among arrays, spans and bytes: written in order, hashed
    in order on the hash thread (the header first), each buffer back in the pool once done."""
    import hashlib

    data = source.read_bytes()
    pool = BufferPool(3, 1000)
    hasher = hashlib.sha256() if hashed else None
    out = tmp_path / "out.bin"
    expected = b"HEAD"
    given: list[int] = []
    with out.open("wb") as fh:
        fh.write(b"HEAD")
        sink = BackgroundWriter(fh, depth=1, hasher=hasher)
        for i in range(20):  # more than the pool holds: taking waits for buffers given back
            buffer = pool.take()
            buffer[:] = i
            lent = pool.lend(buffer, buffer[: 100 + i])
            sink.write(Lent(lent.array, lambda b=lent: (given.append(1), b.give_back())))
            expected += bytes([i]) * (100 + i)
            if i % 7 == 3:
                sink.write(FileSpan(source, i, 5000))
                sink.write(b"-")
                expected += data[i : i + 5000] + b"-"
        sink.close()
    assert out.read_bytes() == expected and len(given) == 20
    assert pool._free.qsize() == pool._made <= 3  # every buffer back
    if hasher is not None:
        assert hasher.hexdigest() == hashlib.sha256(expected).hexdigest()


def test_a_hashing_error_is_raised_and_nothing_blocks(tmp_path: Path) -> None:
    class Failing:
        def __init__(self) -> None:
            self.calls = 0

        def update(self, data: object) -> None:
            self.calls += 1
            if self.calls == 3:
                raise OSError(5, "the hash failed")

    pool = BufferPool(2, 64)
    with (tmp_path / "out.bin").open("wb") as fh:
        sink = BackgroundWriter(fh, depth=1, hasher=Failing())
        with pytest.raises(OSError, match="the hash failed"):
            for _ in range(50):  # the error surfaces at a later write or at close
                buffer = pool.take()
                sink.write(pool.lend(buffer, buffer))
            sink.close()
