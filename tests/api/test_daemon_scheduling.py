"""Scheduling on a real daemon: the wait queue, disconnects, eviction, reloads, shutdown.

The module's daemon has one slot per model, a wait queue of one and room for one loaded
model, so every limit is reached with a handful of requests.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_daemon_support import (
    Daemon,
    run_daemon_expecting_failure,
    running_daemon,
    start_daemon,
    wait_for_stats,
)

from localllm._exceptions import APIError
from localllm.client import Client

SMOL = "smollm2:135m"
TINY = "tiny:sched"
BUSY = "server busy, please try again.  maximum pending requests exceeded"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Daemon]:
    home = tmp_path_factory.mktemp("sched") / "home"
    with running_daemon(
        home,
        num_parallel=1,
        max_queue=1,
        max_loaded_models=1,
        num_threads=1,
        context_length=8192,
    ) as d:
        list(Client(d.settings).create(TINY, from_=str(tiny_gguf)))
        yield d


@pytest.fixture(scope="module")
def client(daemon: Daemon) -> Client:
    return daemon.client()


def _loaded(client: Client) -> dict[str, dict[str, Any]]:
    return {m["model"]: dict(m) for m in client.ps()}


def _load_count(client: Client, model: str) -> float:
    pattern = rf'localllm_model_load_seconds_count\{{model="{re.escape(model)}"\}} (\S+)'
    match = re.search(pattern, client.metrics())
    return float(match.group(1)) if match else 0.0


def test_queue_full_503_and_disconnect_frees_the_slot(daemon: Daemon, client: Client) -> None:
    # Greedy counting goes on until the context (8192) is full: thousands of tokens.
    long_request = {
        "model": SMOL,
        "prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,",
        "raw": True,
        "options": {"temperature": 0},
    }
    queued: dict[str, Any] = {}

    def second() -> None:
        queued["answer"] = daemon.client().generate(SMOL, "Hi", options={"num_predict": 2})

    with (
        httpx.Client(base_url=daemon.url, timeout=120) as http,
        http.stream("POST", "/api/generate", json=long_request) as stream,
    ):
        lines = stream.iter_lines()  # keep it: dropping the iterator closes the connection
        first = json.loads(next(lines))
        assert first["done"] is False  # the only slot is busy now
        waiter = threading.Thread(target=second)
        waiter.start()
        # It waits in the runner's queue, its prompt prepared, to take the slot at the step
        # that frees it; the daemon and /api/ps count it as waiting all the same.
        snapshot = wait_for_stats(
            daemon,
            lambda s: (
                s["queue_depth"] == 1 and any(m.get("runner_waiting") == 1 for m in s["models"])
            ),
        )
        (model,) = [m for m in snapshot["models"] if m["name"] == SMOL]
        assert (model["active_requests"], model["queued_requests"]) == (1, 1)
        (ps,) = [m for m in http.get("/api/ps").json()["models"] if m["name"] == SMOL]
        assert (ps["active_requests"], ps["queued_requests"]) == (1, 1)
        # The queue (size 1) is full: the next request is refused at once, in both shapes.
        busy = http.post("/api/generate", json={"model": SMOL, "prompt": "x", "stream": False})
        assert busy.status_code == 503
        assert busy.headers["retry-after"]
        assert busy.json() == {"error": BUSY}
        busy = http.post(
            "/v1/chat/completions",
            json={"model": SMOL, "messages": [{"role": "user", "content": "x"}]},
        )
        assert busy.status_code == 503
        assert busy.json()["error"]["message"] == BUSY
    # Leaving the stream closed the connection: the runner cancels it and the queued request
    # gets the slot (the long one alone would run for thousands of tokens).
    waiter.join(120)
    assert not waiter.is_alive()
    assert queued["answer"]["eval_count"] == 2
    snapshot = client.stats()
    model = next(m for m in snapshot["models"] if m["name"] == SMOL)
    # The cancelled request is on the dashboard's record too, before the queued one.
    assert [r["done_reason"] for r in model["recent"]][-2:] == ["cancel", "length"]
    assert all(slot["state"] == "idle" for slot in model["slots"])


def test_lru_eviction_with_one_model_allowed(client: Client) -> None:
    client.load(SMOL)
    assert set(_loaded(client)) == {SMOL}
    client.load(TINY)
    assert set(_loaded(client)) == {TINY}


def test_keep_alive_negative_never_expires(client: Client) -> None:
    client.load(TINY, keep_alive=-1)
    assert _loaded(client)[TINY]["expires_at"].startswith("9999-")
    client.load(TINY, keep_alive="2m")
    assert not _loaded(client)[TINY]["expires_at"].startswith("9999-")


def test_keep_alive_expiry_unloads(daemon: Daemon, client: Client) -> None:
    client.load(TINY, keep_alive="1s")
    assert TINY in _loaded(client)
    wait_for_stats(daemon, lambda s: not s["models"])
    assert _loaded(client) == {}


def test_client_gone_during_load_leaves_an_owned_runner(daemon: Daemon, client: Client) -> None:
    client.unload(TINY)
    client.unload(SMOL)
    body = json.dumps({"model": TINY, "prompt": "abc", "raw": True}).encode()
    with socket.create_connection(("127.0.0.1", daemon.settings.bind_port), timeout=30) as sock:
        sock.sendall(
            b"POST /api/generate HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
    # The load finishes and the daemon owns the runner (listed, so it will be unloaded).
    snapshot = wait_for_stats(daemon, lambda s: any(m["name"] == TINY for m in s["models"]))
    pid = next(m for m in snapshot["models"] if m["name"] == TINY)["runner_pid"]
    client.unload(TINY)
    assert TINY not in _loaded(client)
    wait_for_stats(daemon, lambda s: not s["models"])
    assert pid not in [m.get("runner_pid") for m in client.ps()]


def test_concurrent_first_requests_load_once(daemon: Daemon, client: Client) -> None:
    client.unload(TINY)
    client.unload(SMOL)
    assert _loaded(client) == {}
    before = _load_count(client, TINY)
    results: list[Any] = []

    def run() -> None:
        results.append(daemon.client().generate(TINY, "abc", raw=True, options={"num_predict": 2}))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert [r["eval_count"] for r in results] == [2, 2]
    assert _load_count(client, TINY) == before + 1


def test_changed_load_options_reload_the_runner(client: Client) -> None:
    client.generate(TINY, "abc", raw=True, options={"num_predict": 1, "num_ctx": 256})
    first = _loaded(client)[TINY]
    assert first["context_length"] == 256
    client.generate(TINY, "abc", raw=True, options={"num_predict": 1, "num_ctx": 512})
    second = _loaded(client)[TINY]
    assert second["context_length"] == 512
    assert second["runner_pid"] != first["runner_pid"]
    # sampling options alone do not reload
    client.generate(TINY, "abc", raw=True, options={"num_predict": 1, "num_ctx": 512, "top_k": 5})
    assert _loaded(client)[TINY]["runner_pid"] == second["runner_pid"]


def _maps_a_model_blob(pid: int) -> bool:
    """Whether the process has a store blob (the GGUF) mapped into its memory; True where the
    system shows no process maps (Linux's /proc does)."""
    maps = Path(f"/proc/{pid}/maps")
    return not maps.parent.exists() or "sha256-" in maps.read_text()


def test_use_mmap_main_gpu_and_use_mlock_reach_llama_cpp(client: Client) -> None:
    options: dict[str, Any] = {"num_predict": 1, "num_ctx": 512}
    client.generate(TINY, "abc", raw=True, options=options)
    mapped = _loaded(client)[TINY]["runner_pid"]
    assert _maps_a_model_blob(mapped)

    client.generate(TINY, "abc", raw=True, options={**options, "use_mmap": False})
    read = _loaded(client)[TINY]["runner_pid"]
    assert read != mapped
    assert not _maps_a_model_blob(read) or not Path("/proc/self/maps").exists()

    # main_gpu is handed to llama.cpp as given (a CPU build has no GPU to choose): a change
    # reloads, a bad value is refused naming it.
    client.generate(TINY, "abc", raw=True, options={**options, "use_mmap": False, "main_gpu": 1})
    chosen = _loaded(client)[TINY]["runner_pid"]
    assert chosen != read
    # use_mlock asks llama.cpp to lock the weights (it warns in its log where the memlock
    # limit is too small, and serves anyway).
    answer = client.generate(TINY, "abc", raw=True, options={**options, "use_mlock": True})
    assert answer["done"] and _loaded(client)[TINY]["runner_pid"] != chosen
    for bad in (-1, "one", 1.5):
        with pytest.raises(APIError) as info:
            client.generate(TINY, "abc", raw=True, options={**options, "main_gpu": bad})
        assert info.value.status_code == 400 and "main_gpu" in str(info.value)
    with pytest.raises(APIError) as info:
        client.generate(TINY, "abc", raw=True, options={**options, "use_mmap": "maybe"})
    assert info.value.status_code == 400 and "use_mmap" in str(info.value)


def test_second_daemon_for_the_same_home_refuses(daemon: Daemon) -> None:
    with pytest.raises(RuntimeError) as info:
        start_daemon(daemon.home)
    assert "already running" in str(info.value)


def test_busy_port_is_reported(daemon: Daemon, tmp_path: Path) -> None:
    result = run_daemon_expecting_failure(tmp_path / "other", host=daemon.settings.host)
    assert result.returncode == 1
    assert "already in use" in result.stderr
    assert "Traceback" not in result.stderr


def test_sigterm_during_a_stream_shuts_down_cleanly(tmp_path: Path, tiny_gguf: Path) -> None:
    daemon = start_daemon(tmp_path / "home", num_threads=1)
    try:
        list(daemon.client().create("tiny:bye", from_=str(tiny_gguf)))
        daemon.client().load("tiny:bye")
        runner_pid = daemon.client().ps()[0]["runner_pid"]
        lines: list[str] = []
        with (
            httpx.Client(base_url=daemon.url, timeout=120) as http,
            http.stream(
                "POST",
                "/api/generate",
                json={"model": "tiny:bye", "prompt": "a", "raw": True, "options": {}},
            ) as stream,
        ):
            iterator = stream.iter_lines()
            lines.append(next(iterator))
            daemon.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(httpx.HTTPError):  # cut when the grace period ends
                lines.extend(iterator)
        assert daemon.process.wait(60) == 0
    finally:
        daemon.kill()
    assert json.loads(lines[0])["done"] is False
    assert not daemon.settings.socket_path.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(runner_pid, 0)
    assert "daemon stopped" in daemon.log()
