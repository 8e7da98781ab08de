"""The test hooks act only where a test fixture switched them on.

``LOCALLLM_TEST_FAULT`` and ``LOCALLLM_TEST_PAUSE`` are read only by the hooks module in the
test tree (tests/support/hooks/), which a daemon finds on the ``PYTHONPATH`` the fixtures give it. A
user who sets them in a daemon's environment gets a daemon that ignores them: the model
answers and stays on its device, a store write does not pause. The same daemon with the
fixture's switch (the control, same home, same worker) fails the decode the variable names,
and a daemon the CLI starts (as test_gpu_daemon's are) gets the switch too.

The device is an RPC worker on loopback: a model with layers there counts as offloaded (the
fault hook only stands in for faults of a model on a GPU), and it exists on every machine
whose llama.cpp has RPC.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from rpc_support import NEEDS_RPC, Worker
from test_cli_support import cli_home
from test_daemon_support import running_daemon
from test_fault_support import create_from_file
from tiny_gguf import write_tiny_gguf

pytestmark = pytest.mark.slow

MODEL = "tiny:rpc"
TIMEOUT = 60.0  # seconds: an upper bound for an answer, never a delay
FAULT = "decode-failed@2"  # the first generated token's decode


def _generate(http: httpx.Client) -> httpx.Response:
    body = {
        "model": MODEL,
        "prompt": "a few words for the device",
        "raw": True,
        "stream": False,
        "options": {"num_predict": 4, "temperature": 0},
    }
    return http.post("/api/generate", json=body, timeout=TIMEOUT)


def _ps_entry(http: httpx.Client) -> dict[str, Any]:
    (entry,) = http.get("/api/ps").json()["models"]
    return dict(entry)


@NEEDS_RPC
def test_a_users_test_fault_and_pause_do_nothing_and_the_fixtures_fault_fires(
    tmp_path: Path,
) -> None:
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf", n_layers=5, never_ends=True)
    worker = Worker(tmp_path / "worker")
    home = tmp_path / "home"
    common: dict[str, Any] = {
        "num_threads": 1,
        "num_parallel": 1,
        "context_length": 256,
        "rpc_workers": worker.endpoint,
        "test_fault": FAULT,
    }
    try:
        # Set the way a user would: in the daemon's environment, without the fixture's switch.
        with (
            running_daemon(home, hooks=False, test_pause="blob-written", **common) as daemon,
            daemon.http() as http,
        ):
            # A store write passes the step the pause names: the create ends, no marker.
            create_from_file(http, MODEL, tiny)
            assert not (home / "test-pause").exists()
            answer = _generate(http)
            assert answer.status_code == 200, answer.text
            assert answer.json()["eval_count"] == 4
            again = _generate(http)
            assert again.status_code == 200, again.text
            entry = _ps_entry(http)
            # Still on its device, as loaded: layers on the worker, no fallback to the CPU.
            on_worker = [d for d in entry["devices"] if d["endpoint"] == worker.endpoint]
            assert on_worker and on_worker[0]["layers"] > 0, entry["devices"]
            assert "gpu_fallback" not in entry, entry
            log = daemon.log()
            assert "the GPU failed" not in log and "runs on the CPU" not in log

        # The control: the same daemon and model with the fixture's switch on.
        with (
            running_daemon(home, **common) as daemon,
            daemon.http() as http,
        ):
            failed = _generate(http)
            assert failed.status_code >= 500, failed.text
            assert "the GPU failed to compute the batch" in failed.text, failed.text
    finally:
        assert worker.stop() == 0, worker.log()


def test_a_daemon_the_cli_starts_gets_the_hooks_the_fixture_switched_on(tmp_path: Path) -> None:
    # The way test_gpu_daemon's faults reach their daemon (auto-started by the CLI, detached,
    # in "/"): here with a pause, which needs no GPU.
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf")
    with cli_home(tmp_path / "home", LOCALLLM_TEST_PAUSE="blob-written") as cli:
        marker = cli.home / "test-pause"
        cli.ok("list")  # starts the daemon
        create = cli.popen("create", "tiny", "--from", str(tiny))
        deadline = time.monotonic() + TIMEOUT
        while not marker.exists():  # paused at the step: the hooks module was found
            assert create.poll() is None, create.communicate()
            assert time.monotonic() < deadline, "the daemon never paused"
            time.sleep(0.02)
        assert marker.read_text() == "blob-written"
        marker.unlink()  # resumed: the create ends as usual
        assert create.wait(TIMEOUT) == 0, create.communicate()
        assert "tiny:latest" in cli.ok("list")
