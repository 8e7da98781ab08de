"""The CPU governor on a real daemon: real busy processes take threads from a generating runner
and give them back when they end, and every report says so.

A behaviour, not a timing: the test waits (with deadlines) for what ``/api/stats`` says, never
for a speed.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_daemon_support import Daemon, busy_processes, running_daemon, wait_for_stats

from localllm.daemon.devices.procfs import allowed_cpus

SMOL = "smollm2:135m"
# The runner's own count: 2 whatever the machine, so there is a thread to take away.
THREADS = 2

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    home = tmp_path_factory.mktemp("governor") / "home"
    with running_daemon(
        home, num_threads=THREADS, num_parallel=2, context_length=512, keep_alive=-1
    ) as d:
        yield d


@contextlib.contextmanager
def endless_generation(daemon: Daemon) -> Iterator[None]:
    """Streams that generate, one after the other, until the block ends (a stream that ends
    by itself is followed by the next at once)."""
    stop = threading.Event()
    body = {
        "model": SMOL,
        "prompt": "Count from one to one thousand, one number per line.",
        "options": {"num_predict": 100_000, "temperature": 0.8, "seed": 7},
    }

    def read() -> None:
        with httpx.Client(base_url=daemon.url, timeout=300) as http:
            while not stop.is_set():
                with http.stream("POST", "/api/generate", json=body) as response:
                    for _ in response.iter_lines():
                        if stop.is_set():
                            return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield
    finally:
        stop.set()
        reader.join(60)


def answer(http: httpx.Client, **options: Any) -> dict[str, Any]:
    """The final chunk of a short answer asked with ``options``."""
    body = {"model": SMOL, "prompt": "Hi", "stream": False, "options": options}
    final: dict[str, Any] = http.post("/api/generate", json=body).json()
    return final


def threads_of(snapshot: dict[str, Any]) -> dict[str, Any] | None:
    """The generating model's governor state in a stats snapshot."""
    for model in snapshot.get("models", []):
        if model.get("name") == SMOL and any(s["state"] == "decode" for s in model["slots"]):
            threads = model.get("threads")
            return threads if isinstance(threads, dict) else None
    return None


@pytest.mark.alone  # gives threads back once the CPU is free: no other test beside it
def test_busy_processes_take_threads_from_a_generating_runner_and_give_them_back(
    daemon: Daemon,
) -> None:
    # Enough spinning processes to leave this runner one core, whatever the machine.
    spinners = max(1, len(allowed_cpus()) - 1)
    with endless_generation(daemon):
        first = wait_for_stats(daemon, lambda s: threads_of(s) is not None, timeout=120)
        state = threads_of(first)
        assert state is not None and state["max"] == THREADS and state["mode"] == "auto"
        with busy_processes(spinners):
            held = wait_for_stats(daemon, lambda s: (threads_of(s) or {}).get("decode") == 1)
            state = threads_of(held)
            assert state is not None
            assert state["limit"] == "cpu"
            assert state["reason"].startswith("CPU busy: other processes need")
            assert state["last_change"].startswith("2 → 1: CPU busy")
            # /api/ps says it too, and a request answered now says what it ran with.
            with daemon.http() as http:
                (entry,) = http.get("/api/ps").json()["models"]
                assert entry["threads"]["decode"] == 1
                assert entry["threads"]["reason"].startswith("CPU busy")
                final = answer(http, num_predict=8)
            assert final["threads_of"] == THREADS
            assert final["threads_min"] == 1
            assert final["threads_why"].startswith("CPU busy")
        back = wait_for_stats(
            daemon, lambda s: (threads_of(s) or {}).get("decode") == THREADS, timeout=120
        )
        state = threads_of(back)
        assert state is not None
        assert state["limit"] == "max"
        assert state["last_change"] == "1 → 2: CPU free again"
        assert state["changes"] >= 2
        metrics = _metrics(daemon)
        assert metrics[("localllm_runner_threads", (("kind", "max"), ("model", SMOL)))] == THREADS
        assert metrics[("localllm_runner_thread_changes", (("model", SMOL),))] >= 2


def test_a_fixed_count_is_kept_and_says_why(daemon: Daemon) -> None:
    with daemon.http() as http:
        final = answer(http, num_predict=4, num_thread=1)
        assert (final["threads_min"], final["threads_max"], final["threads_of"]) == (1, 1, 1)
        (entry,) = http.get("/api/ps").json()["models"]
        assert entry["threads"]["mode"] == "fixed"
        assert entry["threads"]["limit"] == "fixed"
        assert "num_thread" in entry["threads"]["reason"]


def _metrics(daemon: Daemon) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with daemon.http() as http:
        text = http.get("/metrics").text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_the_threads_a_stream_ran_with_are_in_its_final_chunk(daemon: Daemon) -> None:
    body = {"model": SMOL, "prompt": "Hello", "options": {"num_predict": 4}}
    with daemon.http() as http, http.stream("POST", "/api/generate", json=body) as response:
        lines = [json.loads(line) for line in response.iter_lines() if line]
    final = lines[-1]
    assert final["done"] is True
    assert 1 <= final["threads_min"] <= final["threads_max"] <= final["threads_of"]
