"""A real daemon SIGKILLed at each step of a quantizing create and of a pull, then restarted.

``LOCALLLM_TEST_PAUSE`` stops the daemon's write at one step (it writes ``<home>/test-pause``
and waits); the test SIGKILLs the daemon there, so nothing of its cleanup runs. After a restart:
the store lists only whole models whose blobs hash to their digests, no temporary file is left
(the start-up check removed them), the name being written is absent or whole (a create's
Q8_0 weights and system prompt; a pull's every blob), and the starter model still answers.

The same hook, resumed instead of killed, lets another program fill the disk while llama.cpp
quantizes: the create ends with a 507 and the store is as it was.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fakes.helpers import TinyModels
from fakes.ollama_registry import FakeRegistry
from store_support import assert_consistent, fill_disk, temporaries
from test_daemon_support import Daemon, running_daemon, start_daemon

from localllm.starter import ensure_starter
from localllm.store.models import load_model
from localllm.store.store import Store

pytest_plugins = ["fakes.fixtures"]
pytestmark = pytest.mark.slow

MiB = 1 << 20
SMOL = "smollm2:135m"
WAIT = 60.0  # seconds: an upper bound for any event, never a delay


@pytest.fixture(scope="module")
def starter_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data root with the starter imported (so a daemon's start writes nothing)."""
    root = tmp_path_factory.mktemp("starter") / "home"
    ensure_starter(Store(root))
    return root


@pytest.fixture
def seeded(starter_store: Path, home: Path) -> Path:
    """``home`` holding the starter: blobs hard-linked (they are never written in place)."""
    shutil.rmtree(home)
    shutil.copytree(starter_store, home, copy_function=os.link)
    return home


def _wait_paused(home: Path, request: concurrent.futures.Future[Any]) -> str:
    """The step the daemon paused at (its marker's content), once it is there."""
    marker = home / "test-pause"
    deadline = time.monotonic() + WAIT
    while not marker.exists():
        if request.done():
            raise AssertionError(f"the request ended without pausing: {request.result()}")
        assert time.monotonic() < deadline, "the daemon never reached the step"
        time.sleep(0.02)
    return marker.read_text()


def _post_lines(daemon: Daemon, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with (
        httpx.Client(base_url=daemon.url, timeout=WAIT) as http,
        http.stream("POST", path, json=body) as response,
    ):
        return [json.loads(line) for line in response.iter_lines() if line.strip()]


def _kill_at(
    home: Path, step: str, path: str, body: dict[str, Any], **settings: Any
) -> concurrent.futures.Future[Any]:
    """Start a daemon paused at ``step``, send the request, SIGKILL the daemon there."""
    daemon = start_daemon(home, num_threads=1, test_pause=step, **settings)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        try:
            request = pool.submit(_post_lines, daemon, path, body)
            assert _wait_paused(home, request) == step.split("#")[0]
        finally:
            daemon.kill()
        concurrent.futures.wait([request], timeout=WAIT)
    assert daemon.process.returncode == -9
    (home / "test-pause").unlink()
    return request


def _after_restart(
    home: Path,
    check: Callable[[Store], None],
    then: Callable[[Daemon], None] | None = None,
    **settings: Any,
) -> None:
    """A daemon restarted on ``home`` after the kill: the store is consistent, ``check``
    holds, the starter answers; then ``then`` (more requests to the same daemon)."""
    # A short context: the answer below is 2 tokens, and a load zeroes its whole KV cache
    # (the starter's default 4 x 8192 cells: 0.3 s of CPU in each of these 13 restarts).
    settings.setdefault("context_length", 512)
    with running_daemon(home, num_threads=1, **settings) as daemon, daemon.http() as http:
        # The daemon answers once its start-up check is done.
        assert http.get("/api/version").status_code == 200
        assert temporaries(home) == []  # the start-up check removed them
        listed = assert_consistent(home)
        assert SMOL in listed
        check(Store(home))
        answer = http.post(
            "/api/generate",
            json={"model": SMOL, "prompt": "Hi", "stream": False, "options": {"num_predict": 2}},
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["done"] is True
        if then is not None:
            then(daemon)


CREATE_STEPS = [
    "quantize-ready",
    "quantize-started",
    "quantize-written",
    "blob-written",  # the quantized weights, before their rename
    "blob-published",  # the quantized weights, named by digest; no manifest yet
    "blob-published#3",  # the config, the last blob
    "manifest-written",
    "manifest-published",
]


@pytest.mark.parametrize("step", CREATE_STEPS)
def test_a_kill_at_each_step_of_a_quantizing_create(
    seeded: Path, tiny_gguf: Path, step: str
) -> None:
    home = seeded
    body = {"model": "mid:q8", "from": str(tiny_gguf), "quantize": "q8_0", "system": "Be brief."}
    _kill_at(home, step, "/api/create", body)

    def check(store: Store) -> None:
        if store.exists("mid:q8"):
            model = load_model(store, "mid:q8")
            assert model.info.file_type == "Q8_0"
            assert model.system == "Be brief."
        else:
            assert step != "manifest-published"  # renamed before the kill: it must be whole

    _after_restart(home, check)


PULL_STEPS = [
    "download-started#6",  # the GGUF, the last of six blobs (config first)
    "blob-written#6",
    "blob-published#6",
    "manifest-written",
    "manifest-published",
]


@pytest.mark.parametrize("step", PULL_STEPS)
def test_a_kill_at_each_step_of_a_pull(
    seeded: Path, registry: FakeRegistry, tiny_models: TinyModels, step: str
) -> None:
    home = seeded
    _kill_at(home, step, "/api/pull", {"model": "tiny"}, registry=registry.url)
    expected = set(registry.models[("library/tiny", "latest")].blobs)

    def check(store: Store) -> None:
        if store.exists("tiny"):
            assert store.get("tiny").manifest.digests == expected
        else:
            assert step != "manifest-published"

    def pull_again(daemon: Daemon) -> None:
        # Whatever the kill left, pulling again (in the restarted daemon) completes the model.
        assert _post_lines(daemon, "/api/pull", {"model": "tiny"})[-1] == {"status": "success"}

    _after_restart(home, check, pull_again, registry=registry.url)
    assert "tiny:latest" in assert_consistent(home)


def test_the_disk_filling_up_while_quantizing_is_a_507_and_leaves_nothing(
    small_disk: Callable[[int], Path], tiny_gguf: Path
) -> None:
    home = small_disk(160 * MiB)  # the starter (94 MiB) and room for the tiny model's Q8_0
    ensure_starter(Store(home))
    with running_daemon(home, num_threads=1, test_pause="quantize-ready") as daemon:
        before = assert_consistent(home)
        assert before == [SMOL]
        body = {"model": "mid:q8", "from": str(tiny_gguf), "quantize": "q8_0", "stream": False}
        with concurrent.futures.ThreadPoolExecutor(1) as pool, daemon.http() as http:
            request = pool.submit(http.post, "/api/create", json=body)
            _wait_paused(home, request)
            filler = fill_disk(home)  # another program takes the space meanwhile
            (home / "test-pause").unlink()
            answer = request.result(timeout=WAIT)
        assert answer.status_code == 507, answer.text
        message = answer.json()["error"]
        assert message.startswith("disk full while creating mid:q8"), message
        assert "the store is as it was" in message
        filler.unlink()
        assert assert_consistent(home) == before
        assert http_names(daemon) == before


def http_names(daemon: Daemon) -> list[str]:
    """The names ``/api/tags`` lists, sorted."""
    with daemon.http() as http:
        return sorted(m["name"] for m in http.get("/api/tags").json()["models"])
