"""The model store: atomic blobs, manifests, copy/delete, pruning."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from localllm import (
    BlobNotFoundError,
    DigestMismatchError,
    InvalidDigestError,
    ModelNotFoundError,
    StoreBusyError,
)
from localllm.store.check import check_store, prune
from localllm.store.manifest import MEDIA_MODEL, Manifest
from localllm.store.models import create_model, load_model
from localllm.store.names import parse_name
from localllm.store.store import Store


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def test_blob_is_published_only_with_the_right_digest(store: Store) -> None:
    data = b"hello blob" * 1000
    layer = store.write_blob([data[:10], data[10:]], expected_digest=digest_of(data))
    assert layer.digest == digest_of(data) and layer.size == len(data)
    assert store.blob_path(layer.digest).read_bytes() == data
    assert store.blob_path(layer.digest).name == "sha256-" + hashlib.sha256(data).hexdigest()

    with pytest.raises(DigestMismatchError):
        store.write_blob([b"other bytes"], expected_digest=digest_of(b"not these"))
    assert not store.has_blob(digest_of(b"other bytes"))
    assert list(store.partial_dir.iterdir()) == []


@pytest.mark.parametrize(
    "bad", ["sha256:../../etc/passwd", "sha256-xyz", "md5:abc", "", "sha256:" + "g" * 64]
)
def test_invalid_digests_never_become_paths(store: Store, bad: str) -> None:
    with pytest.raises(InvalidDigestError):
        store.blob_path(bad)


def test_manifest_requires_its_blobs(store: Store) -> None:
    layer = store.write_blob_bytes(b"gguf-ish", MEDIA_MODEL)
    config = store.write_blob_bytes(b"{}", "application/vnd.docker.container.image.v1+json")
    missing = type(layer)(MEDIA_MODEL, digest_of(b"absent"), 6)
    with pytest.raises(BlobNotFoundError):
        store.write_manifest(parse_name("m:1"), Manifest(config=config, layers=(missing,)))
    assert not store.exists("m:1")
    store.write_manifest(parse_name("m:1"), Manifest(config=config, layers=(layer,)))
    assert store.get("m:1").manifest.layers == (layer,)


def test_create_list_copy_delete_and_gc(store: Store, tiny_gguf: Path) -> None:
    entry = create_model(
        store, "tiny", gguf_file=tiny_gguf, system="Be brief.", parameters={"temperature": 0.2}
    )
    assert [e.name.short for e in store.list()] == ["tiny:latest"]
    model = load_model(store, "tiny")
    assert model.gguf_path.read_bytes() == tiny_gguf.read_bytes()
    assert model.system == "Be brief."
    assert model.parameters == {"temperature": 0.2}
    assert model.template and "im_start" in model.template  # from the GGUF
    assert len(entry.id) == 12

    store.copy("tiny", "copy:v2")
    assert {e.name.short for e in store.list()} == {"tiny:latest", "copy:v2"}
    blobs = set(store.iter_blobs())

    store.delete("tiny")
    assert set(store.iter_blobs()) == blobs  # still referenced by copy:v2
    with pytest.raises(ModelNotFoundError, match="localllm pull tiny"):
        store.get("tiny")

    store.delete("copy:v2")
    assert list(store.iter_blobs()) == []
    assert not any(store.manifests_dir.rglob("*"))  # empty dirs pruned


def test_prune_waits_for_no_writer_and_frees_unreferenced_blobs(store: Store) -> None:
    orphan = store.write_blob_bytes(b"orphan", MEDIA_MODEL)
    with store.writing(), pytest.raises(StoreBusyError, match="prune again when it finishes"):
        prune(store)
    assert store.has_blob(orphan.digest)
    report = prune(store)
    assert report.blobs == [(orphan.digest, 6)]
    assert report.summary() == "removed 1 unused blob(s) and 0 other file(s), freed 6 B"
    assert not store.has_blob(orphan.digest)


def test_verify_sets_corrupted_blobs_aside(store: Store) -> None:
    good = store.write_blob_bytes(b"good", MEDIA_MODEL)
    bad = store.write_blob_bytes(b"will rot", MEDIA_MODEL)
    store.blob_path(bad.digest).write_bytes(b"rotten!!")
    results = {r.digest: r.ok for r in store.verify(set_aside_bad=True)}
    assert results == {good.digest: True, bad.digest: False}
    assert not store.has_blob(bad.digest)
    assert (store.partial_dir / f"corrupt-{bad.digest.replace(':', '-')}").is_file()


_SLOW_WRITER = """
import sys, time
from pathlib import Path
from localllm.store.store import Store
from localllm.store.check import check_store, prune
store = Store(Path(sys.argv[1]))
with store.blob_writer() as writer:
    writer.write(b"x" * 4096)
    print(writer.temp_path, flush=True)
    sys.stdin.readline()  # wait here until killed
    writer.commit()
"""


def test_a_killed_writer_leaves_no_blob(store: Store) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _SLOW_WRITER, str(store.root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    temp_path = Path(proc.stdout.readline().strip())  # type: ignore[union-attr]
    assert temp_path.exists()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert list(store.iter_blobs()) == []
    report = check_store(store)  # sweeps temporaries nobody is writing
    assert report.removed_temporaries == [(temp_path.name, 4096)]
    assert not temp_path.exists()


def _write_same_blob(root: str, data: bytes) -> str:
    return (
        Store(Path(root))
        .write_blob([data[i : i + 65536] for i in range(0, len(data), 65536)])
        .digest
    )


def test_concurrent_writers_of_one_blob(store: Store) -> None:
    data = os.urandom(3 << 20)
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        digests = pool.starmap(_write_same_blob, [(str(store.root), data)] * 8)
    assert set(digests) == {digest_of(data)}
    assert store.blob_path(digest_of(data)).read_bytes() == data
    assert list(store.partial_dir.iterdir()) == []


def test_unreadable_manifest_is_skipped_in_listing(store: Store, tiny_gguf: Path) -> None:
    create_model(store, "good", gguf_file=tiny_gguf)
    bad = store.manifest_path(parse_name("bad"))
    bad.parent.mkdir(parents=True)
    bad.write_text("{not json")
    assert [e.name.short for e in store.list()] == ["good:latest"]


def test_model_cache_reuses_a_model_until_its_manifest_changes(
    store: Store, tiny_gguf: Path
) -> None:
    from localllm._exceptions import DamagedModelError
    from localllm.store.models import ModelCache

    cache = ModelCache(store)
    name = parse_name("cached")
    create_model(store, name, gguf_file=tiny_gguf, system="one")
    first = cache.get(name)
    assert cache.get(name) is first  # the same manifest: resolved once
    # replaced (an atomic rename): read again, never the stale system prompt
    create_model(store, name, gguf_file=tiny_gguf, system="two")
    second = cache.get(name)
    assert second is not first and second.system == "two"
    # a blob gone is still reported, as the store reports it
    system_layer = next(x for x in second.entry.manifest.layers if "system" in x.media_type)
    store.blob_path(system_layer.digest).unlink()
    with pytest.raises(DamagedModelError):
        cache.get(name)
    store.delete(name)
    with pytest.raises(ModelNotFoundError):
        cache.get(name)


def test_model_cache_reports_a_blob_of_another_size(store: Store, tiny_gguf: Path) -> None:
    from localllm._exceptions import DamagedModelError
    from localllm.store.models import ModelCache

    cache = ModelCache(store)
    name = parse_name("resized")
    create_model(store, name, gguf_file=tiny_gguf, system="one")
    model = cache.get(name)
    layer = next(x for x in model.entry.manifest.layers if "system" in x.media_type)
    store.blob_path(layer.digest).write_bytes(b"x" * (layer.size + 1))
    with pytest.raises(DamagedModelError, match="the manifest says"):
        cache.get(name)
