"""SIGKILL of the daemon in the middle of a pull, then a restart: the pull resumes from the
partial file, and no blob whose hash does not match its name is ever registered.

The registry is the loopback fake (``fakes.ollama_registry``) serving ``library/tiny``; a
``pause`` fault holds the model file's download at 3 MB, so the kill lands mid-download with
the first megabytes on disk. After the restart a ``corrupt`` fault flips a byte beyond the
resume point: that pull must fail verification and register nothing; the next, clean, pull
completes the model.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import httpx
import pytest
from fakes.helpers import TinyModels
from fakes.ollama_registry import FakeRegistry
from test_daemon_support import Daemon, start_daemon

from localllm.settings import Settings
from localllm.sources.transfer import partial_path
from localllm.store.store import Store

pytest_plugins = ["fakes.fixtures"]
pytestmark = pytest.mark.slow

WAIT = 60.0  # seconds: an upper bound for any event, never a delay


def _digest(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def _blob_route(digest: str) -> str:
    return f"/v2/library/tiny/blobs/{digest}"


def _ranges(registry: FakeRegistry, digest: str) -> list[str | None]:
    return [r.headers.get("range") for r in registry.requests_for(_blob_route(digest))]


def _blobs_are_honest(store: Store) -> list[str]:
    """Every registered blob's name is the sha256 of its bytes; their digests."""
    digests = []
    for path in sorted(store.blobs_dir.glob("sha256-*")):
        actual = hashlib.sha256(path.read_bytes()).hexdigest()
        assert path.name == f"sha256-{actual}", f"{path.name} holds bytes hashing to {actual}"
        digests.append(f"sha256:{actual}")
    return digests


def _pull_lines(daemon: Daemon, model: str = "tiny") -> list[dict[str, object]]:
    with (
        httpx.Client(base_url=daemon.url, timeout=WAIT) as http,
        http.stream("POST", "/api/pull", json={"model": model}) as response,
    ):
        assert response.status_code == 200
        return [json.loads(line) for line in response.iter_lines() if line.strip()]


def test_a_pull_killed_with_the_daemon_resumes_after_a_restart_and_is_verified(
    home: Path, registry: FakeRegistry, tiny_models: TinyModels
) -> None:
    digest = _digest(tiny_models.f32)
    store = Store(Settings.from_env({"LOCALLLM_HOME": str(home)}).data_dir)
    pause = registry.add_fault("pause", 3_000_000, _blob_route(digest))

    first = start_daemon(home, registry=registry.url, num_threads=1)
    try:
        with (
            httpx.Client(base_url=first.url, timeout=WAIT) as http,
            http.stream("POST", "/api/pull", json={"model": "tiny"}) as response,
        ):
            assert response.status_code == 200
            for line in response.iter_lines():
                event = json.loads(line)
                assert "error" not in event, event
                if event.get("digest") == digest and int(event.get("completed", 0)) >= 2 << 20:
                    first.kill()  # SIGKILL: nothing of the daemon's cleanup runs
                    break
            else:
                raise AssertionError("the pull ended before the kill")
    finally:
        first.kill()
        pause.resume.set()
    assert first.process.returncode == -9

    kept = partial_path(store, digest).stat().st_size
    assert kept >= 2 << 20
    assert digest not in _blobs_are_honest(store)
    assert not store.exists("tiny")

    # Restarted, with a byte flipped beyond the resume point: verification must refuse it.
    registry.add_fault("corrupt", len(tiny_models.f32) - 1000, _blob_route(digest))
    second = start_daemon(home, registry=registry.url, num_threads=1)
    try:
        lines = _pull_lines(second)
        assert "error" in lines[-1], lines[-3:]
        assert "sha256" in str(lines[-1]["error"]) or "digest" in str(lines[-1]["error"])
        assert _ranges(registry, digest)[-1] == f"bytes={kept}-"  # it resumed
        assert digest not in _blobs_are_honest(store)
        assert not store.exists("tiny")
        with httpx.Client(base_url=second.url, timeout=WAIT) as http:
            assert http.post("/api/show", json={"model": "tiny"}).status_code == 404

        # A clean pull completes the model; every blob is what its name says.
        registry.faults.clear()
        lines = _pull_lines(second)
        assert lines[-1] == {"status": "success"}, lines[-3:]
        assert store.blob_path(digest).read_bytes() == tiny_models.f32
        assert digest in _blobs_are_honest(store)
        assert not partial_path(store, digest).exists()
        with httpx.Client(base_url=second.url, timeout=WAIT) as http:
            shown = http.post("/api/show", json={"model": "tiny"})
            assert shown.status_code == 200, shown.text
    finally:
        status = second.stop()
    assert status == 0
