"""A full disk, for real: the store lives on a small tmpfs mounted for the test (needs root).

Where mounting is not possible (not root, no ``mount``), these tests skip and say why; nothing
here fakes ENOSPC.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest
from fakes.helpers import EventLog, TinyModels
from fakes.hf_hub import FakeHub
from fakes.ollama_registry import FakeRegistry
from store_support import fill_disk
from test_cli_support import cli_home

from localllm import DiskFullError
from localllm.settings import Settings
from localllm.sources import pull
from localllm.sources.transfer import partial_path
from localllm.store.store import Store

pytest_plugins = ["fakes.fixtures"]

MiB = 1 << 20


def _digest(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def test_a_model_that_cannot_fit_fails_before_downloading(
    small_disk: Callable[[int], Path],
    hf_settings: Settings,
    hub: FakeHub,
    tiny_models: TinyModels,
) -> None:
    disk = small_disk(4 * MiB)
    settings = hf_settings.replace(home=disk)
    store = Store(settings.data_dir)
    pull(store, "hf.co/tester/tiny-GGUF:F16", settings)  # 2.7 MB: fits

    with pytest.raises(DiskFullError, match="not enough disk space to pull") as info:
        pull(store, "hf.co/tester/tiny-GGUF:F32", settings)  # 5.3 MB: does not
    assert "more are needed" in str(info.value)
    assert hub.cdn.requests_for(hub.cdn.object_path(tiny_models.f32)) == []
    # What was complete stays complete.
    assert store.blob_path(_digest(tiny_models.f16)).read_bytes() == tiny_models.f16
    assert store.exists("hf.co/tester/tiny-GGUF:F16")


def test_the_disk_filling_up_midway_stops_cleanly_and_resumes_later(
    small_disk: Callable[[int], Path],
    registry_settings: Settings,
    registry: FakeRegistry,
    tiny_models: TinyModels,
) -> None:
    disk = small_disk(8 * MiB)
    settings = registry_settings.replace(home=disk)
    store = Store(settings.data_dir)
    gguf = _digest(tiny_models.f32)
    pause = registry.add_fault("pause", 2_500_000, f"/v2/library/tiny/blobs/{gguf}")
    log = EventLog()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(pull, store, "tiny", settings, on_progress=log)
        log.wait_for(lambda e: e.digest == gguf and (e.completed or 0) >= 2 * MiB)
        filler = fill_disk(disk)  # someone else fills the disk meanwhile
        pause.resume.set()
        with pytest.raises(DiskFullError, match="disk full while downloading") as info:
            future.result(timeout=60)
    assert "pull again to resume" in str(info.value)

    manifest = registry.models[("library/tiny", "latest")]
    small = [d for d in manifest.blobs if d != gguf]
    assert small and all(
        store.blob_path(d).read_bytes() == manifest.blobs[d] for d in small
    )  # complete blobs were kept
    kept = partial_path(store, gguf).stat().st_size
    assert kept >= 2 * MiB
    assert not store.exists("tiny")

    filler.unlink()
    pull(store, "tiny", settings)
    assert store.blob_path(gguf).read_bytes() == tiny_models.f32
    ranges = [
        r.headers.get("range") for r in registry.requests_for(f"/v2/library/tiny/blobs/{gguf}")
    ]
    assert ranges[-1] == f"bytes={kept}-"


def test_the_cli_says_disk_full_in_one_line(
    small_disk: Callable[[int], Path], hub: FakeHub
) -> None:
    # The CLI goes through a daemon it starts on the 1 MiB home; the daemon cannot import the
    # 100 MB starter model there, says so in its log, and serves anyway.
    with cli_home(small_disk(1 * MiB), HF_ENDPOINT=hub.url) as cli:
        error = cli.fails("pull", "hf.co/tester/tiny-GGUF:F32")
        assert error.strip().splitlines()[-1].startswith("Error: not enough disk space to pull")
        assert cli.daemon_pid() is not None
