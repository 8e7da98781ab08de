"""Resuming, retrying, verifying and sharing downloads (through the fake Hub's CDN)."""

from __future__ import annotations

import concurrent.futures
import hashlib
import threading

import pytest
from fakes.helpers import ChildPull, EventLog, TinyModels, child_env
from fakes.hf_hub import FakeHub

from localllm import DigestMismatchError, NetworkError, OperationCancelledError
from localllm.settings import Settings
from localllm.sources import pull
from localllm.sources.transfer import partial_path
from localllm.store.store import Store

pytest_plugins = ["fakes.fixtures"]

NAME = "hf.co/tester/tiny-GGUF:F32"
WAIT = 60  # seconds; an upper bound for events, never a delay


def _digest(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def _ranges(hub: FakeHub, data: bytes) -> list[str | None]:
    return [r.headers.get("range") for r in hub.cdn.requests_for(hub.cdn.object_path(data))]


def test_dropped_connection_resumes_where_it_stopped(
    store: Store, hf_settings: Settings, hub: FakeHub, tiny_models: TinyModels
) -> None:
    path = hub.cdn.object_path(tiny_models.f32)
    hub.cdn.add_fault("drop", 2_000_000, path)
    pull(store, NAME, hf_settings)

    assert store.blob_path(_digest(tiny_models.f32)).read_bytes() == tiny_models.f32
    assert _ranges(hub, tiny_models.f32) == [None, "bytes=2000000-"]
    # Every byte crossed the wire once: nothing before the cut was fetched again.
    assert hub.cdn.body_bytes[path] == len(tiny_models.f32)


def test_stalled_connection_is_dropped_and_resumed(
    store: Store, hf_settings: Settings, hub: FakeHub, tiny_models: TinyModels
) -> None:
    settings = hf_settings.replace(pull_stall_timeout=0.5)
    path = hub.cdn.object_path(tiny_models.f32)
    hub.cdn.add_fault("stall", 1_500_000, path)
    pull(store, NAME, settings)

    assert store.has_blob(_digest(tiny_models.f32))
    assert _ranges(hub, tiny_models.f32) == [None, "bytes=1500000-"]


def test_retries_are_bounded(
    store: Store, hf_settings: Settings, hub: FakeHub, tiny_models: TinyModels
) -> None:
    hub.cdn.fail_status = 503
    with pytest.raises(NetworkError, match=r"failed 2 times in a row .*HTTP 503"):
        pull(store, NAME, hf_settings.replace(pull_retries=1))
    assert len(_ranges(hub, tiny_models.f32)) == 2
    assert not store.exists(NAME)


def test_a_corrupted_byte_is_caught_and_its_bytes_deleted(
    store: Store, hf_settings: Settings, hub: FakeHub, tiny_models: TinyModels
) -> None:
    hub.cdn.add_fault("corrupt", 1_234_567, hub.cdn.object_path(tiny_models.f32))
    with pytest.raises(DigestMismatchError) as info:
        pull(store, NAME, hf_settings)
    digest = _digest(tiny_models.f32)
    assert info.value.expected == digest and info.value.actual != digest
    assert not store.has_blob(digest)
    assert not partial_path(store, digest).exists()
    assert not store.exists(NAME)

    hub.cdn.faults.clear()
    pull(store, NAME, hf_settings)
    assert store.blob_path(digest).read_bytes() == tiny_models.f32


def test_cancel_returns_promptly_and_the_next_pull_resumes(
    store: Store, hf_settings: Settings, hub: FakeHub, tiny_models: TinyModels
) -> None:
    path = hub.cdn.object_path(tiny_models.f32)
    pause = hub.cdn.add_fault("pause", 2_500_000, path)
    cancel = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = pool.submit(pull, store, NAME, hf_settings, cancel=cancel)
        assert pause.reached.wait(WAIT)
        cancel.set()
        with pytest.raises(OperationCancelledError):
            first.result(timeout=WAIT)
    pause.resume.set()

    pull(store, NAME, hf_settings)
    assert store.blob_path(_digest(tiny_models.f32)).read_bytes() == tiny_models.f32
    ranges = _ranges(hub, tiny_models.f32)
    assert len(ranges) == 2 and ranges[1] is not None
    resumed_at = int(ranges[1].removeprefix("bytes=").rstrip("-"))
    assert 0 < resumed_at <= 2_500_000


def test_concurrent_pulls_in_one_process_share_one_download(
    store: Store, hf_settings: Settings, hub: FakeHub, tiny_models: TinyModels
) -> None:
    path = hub.cdn.object_path(tiny_models.f32)
    pause = hub.cdn.add_fault("pause", 1_000_000, path)
    second_log = EventLog()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(pull, store, NAME, hf_settings)
        assert pause.reached.wait(WAIT)
        second = pool.submit(pull, store, NAME, hf_settings, on_progress=second_log)
        assert second_log.seen_digest.wait(WAIT)  # the second pull is waiting on the blob
        pause.resume.set()
        entries = [first.result(timeout=WAIT), second.result(timeout=WAIT)]

    assert entries[0].manifest == entries[1].manifest
    assert len(hub.cdn.requests_for(path)) == 1
    assert hub.cdn.body_bytes[path] == len(tiny_models.f32)
    assert second_log.events[-1].status == "success"


def test_concurrent_pulls_in_two_processes_share_one_download(
    store: Store, hf_settings: Settings, hub: FakeHub, tiny_models: TinyModels
) -> None:
    path = hub.cdn.object_path(tiny_models.f32)
    pause = hub.cdn.add_fault("pause", 1_000_000, path)
    env = child_env(hf_settings)
    first = ChildPull(NAME, env)
    try:
        assert pause.reached.wait(WAIT)
        second = ChildPull(NAME, env)
        try:
            # The second process reports the first one's progress while it waits for the lock.
            second.wait_for(lambda event: event.get("digest") == _digest(tiny_models.f32))
            pause.resume.set()
            results = [first.finish(WAIT), second.finish(WAIT)]
        finally:
            second.kill()
    finally:
        first.kill()

    assert results[0].get("done") and results[0] == results[1]
    assert len(hub.cdn.requests_for(path)) == 1
    assert store.blob_path(_digest(tiny_models.f32)).read_bytes() == tiny_models.f32


def test_a_killed_pull_resumes_after_a_restart(
    store: Store, hf_settings: Settings, hub: FakeHub, tiny_models: TinyModels
) -> None:
    digest = _digest(tiny_models.f32)
    path = hub.cdn.object_path(tiny_models.f32)
    pause = hub.cdn.add_fault("pause", 3_000_000, path)
    child = ChildPull(NAME, child_env(hf_settings))
    try:
        child.wait_for(lambda e: e.get("digest") == digest and e.get("completed", 0) >= 2 << 20)
    finally:
        child.kill()  # SIGKILL: no cleanup runs in the child
    pause.resume.set()
    kept = partial_path(store, digest).stat().st_size
    assert kept >= 2 << 20

    pull(store, NAME, hf_settings)
    assert store.blob_path(digest).read_bytes() == tiny_models.f32
    assert _ranges(hub, tiny_models.f32)[-1] == f"bytes={kept}-"
    assert not partial_path(store, digest).exists()
