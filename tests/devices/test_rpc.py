"""One model across several machines, on loopback: real ``localllm worker`` processes (ggml's
RPC server) take a share of a tiny model's layers.

* split across two workers and the local CPU, several concurrent greedy streams give the
  tokens of a local run (same run, same prompts);
* a worker down before the load is named in one line, and the load fails without an abort;
* a worker killed mid-stream ends that stream with an error event naming it, and the next
  request is served (the model reloads without it);
* ``/api/ps`` lists the devices and their layers; ``localllm ps`` prints them.

On a build without RPC these tests are skipped, saying so (see ``rpc_support.NEEDS_RPC``).
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from rpc_support import NEEDS_RPC, Worker
from runner_harness import RunnerHarness, greedy
from test_daemon_support import Daemon, running_daemon
from test_fault_support import create_from_file, read_stream
from tiny_gguf import write_tiny_gguf

from localllm.cli.ps import ps_rows
from localllm.daemon.devices.rpc import doctor_line
from localllm.daemon.runner import GenerationRequest, RunnerConfig

pytestmark = [NEEDS_RPC, pytest.mark.slow]

TIMEOUT = 60.0
MODEL = "split:rpc"
PROMPTS = ["the sky is blue", "hello there", "a river of stone", "once upon a time"]


@pytest.fixture(scope="module")
def tiny5(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A five-layer tiny model: with the output layer, six units, two per device."""
    folder = tmp_path_factory.mktemp("rpc-model")
    return write_tiny_gguf(folder / "tiny5.gguf", n_layers=5, never_ends=True)


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Worker]]:
    """Two workers for the module (the tests that kill one start their own)."""
    home = tmp_path_factory.mktemp("rpc-workers")
    started = [Worker(home), Worker(home)]
    yield started
    for worker in started:
        assert worker.stop() == 0, worker.log()


def _config(model: Path, workers: list[str]) -> RunnerConfig:
    return RunnerConfig(
        model_path=str(model), n_slots=4, n_ctx_per_slot=256, n_threads=1, rpc_workers=workers
    )


def _greedy_tokens(harness: RunnerHarness) -> list[list[int]]:
    requests = [
        GenerationRequest(
            id=f"r{i}", prompt=text, raw=True, options=greedy(20), return_context=True
        )
        for i, text in enumerate(PROMPTS)
    ]
    results = harness.generate_many(requests)
    return [list(result.context or []) for _, result in results]


def test_a_model_split_across_two_workers_gives_the_local_greedy_tokens(
    tiny5: Path, workers: list[Worker], tmp_path: Path
) -> None:
    local = RunnerHarness(_config(tiny5, []), tmp_path / "local")
    try:
        expected = _greedy_tokens(local)
    finally:
        local.close()
    endpoints = [w.endpoint for w in workers]
    split = RunnerHarness(_config(tiny5, endpoints), tmp_path / "split")
    try:
        health = split.run(split.client.health())
        got = _greedy_tokens(split)
    finally:
        split.close()
    assert got == expected
    assert all(len(tokens) > 20 for tokens in got)
    devices = health["devices"]
    assert [d["kind"] for d in devices] == ["cpu", "rpc", "rpc"]
    assert [d["endpoint"] for d in devices] == [None, *endpoints]
    # Equal free memory on loopback: layers 0-1 local, 2-3 on one worker, 4 and the output on
    # the other.
    assert [(d["first_layer"], d["layers"], d["output"]) for d in devices] == [
        (0, 2, False),
        (2, 2, False),
        (4, 1, True),
    ]
    assert health["gpu_layers"] == 0, "RPC layers are not local GPU layers"
    for worker in workers:
        assert "Accepted client connection" in worker.log()


def _stream_killing(daemon: Daemon, model: str, victim: Worker) -> Any:
    """An endless stream whose worker is SIGKILLed at the first text; read to its end."""

    def kill_at_first_text(event: Any) -> None:
        if (event.get("message") or {}).get("content") and victim.process.poll() is None:
            victim.kill()

    async def run() -> Any:
        async with (
            httpx.AsyncClient(base_url=daemon.url, timeout=TIMEOUT) as http,
            asyncio.timeout(TIMEOUT),
        ):
            body = {
                "model": model,
                "messages": [{"role": "user", "content": "a long answer"}],
                "options": {"num_predict": 100000},
            }
            return await read_stream(http, "/api/chat", body, kill_at_first_text)

    return asyncio.run(run())


def _ps_entry(http: httpx.Client, model: str) -> dict[str, Any]:
    models = {m["name"]: m for m in http.get("/api/ps").json()["models"]}
    assert model in models, models
    return models[model]


def test_worker_faults_are_errors_naming_the_worker_and_the_daemon_goes_on(
    tiny5: Path, tmp_path: Path
) -> None:
    survivor, victim = Worker(tmp_path / "w"), Worker(tmp_path / "w")
    # Bound but not listening: connections are refused, and no other process can take it.
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    dead = f"127.0.0.1:{closed.getsockname()[1]}"
    try:
        with (
            running_daemon(
                tmp_path / "home",
                num_parallel=2,
                num_threads=1,
                context_length=512,
                rpc_workers=f"{survivor.endpoint},{victim.endpoint}",
            ) as daemon,
            daemon.http() as http,
        ):
            create_from_file(http, MODEL, tiny5)

            # A worker that is down before the load: one line naming it, nothing loaded.
            refused = http.post(
                "/api/generate",
                json={"model": MODEL, "options": {"rpc_workers": f"{survivor.endpoint},{dead}"}},
                timeout=TIMEOUT,
            )
            assert refused.status_code == 500, refused.text
            message = refused.json()["error"]
            assert f"RPC worker {dead} is not answering" in message, message
            assert "\n" not in message and survivor.endpoint not in message, message
            assert http.get("/api/ps").json()["models"] == []

            # Loaded across both workers: ps shows the devices and their layers.
            assert http.post("/api/generate", json={"model": MODEL}).status_code == 200
            entry = _ps_entry(http, MODEL)
            endpoints = [d["endpoint"] for d in entry["devices"]]
            assert endpoints == [None, survivor.endpoint, victim.endpoint]
            assert sum(d["layers"] for d in entry["devices"]) == 5
            line = ps_rows([entry]).splitlines()[-1]
            assert line.startswith(f"{MODEL} spans CPU (local): layers 0-1"), line
            assert f"({victim.endpoint}): layer 4 + output" in line, line

            # Killed mid-stream: the stream ends with an error naming that worker.
            end = _stream_killing(daemon, MODEL, victim)
            assert end.status == 200 and not end.finished
            assert end.error is not None, end.events[-3:]
            assert f"RPC worker {victim.endpoint}" in end.error, end.error
            assert not end.after_end

            # The next request is served: the model reloads without the dead worker.
            answer = http.post(
                "/api/chat",
                json={
                    "model": MODEL,
                    "messages": [{"role": "user", "content": "hi"}],
                    "stream": False,
                    "options": {"num_predict": 5},
                },
                timeout=TIMEOUT,
            )
            assert answer.status_code == 200, answer.text
            assert answer.json()["eval_count"] == 5
            entry = _ps_entry(http, MODEL)
            assert [d["endpoint"] for d in entry["devices"]] == [None, survivor.endpoint]
            assert entry["rpc_dropped"] == [victim.endpoint]
            assert "going without lost worker" in ps_rows([entry])
    finally:
        closed.close()
        survivor.stop()
        victim.kill()


def test_worker_cli_names_a_taken_port(workers: list[Worker]) -> None:
    taken = workers[0].port
    result = subprocess.run(
        [sys.executable, "-m", "localllm", "worker", "--port", str(taken)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"Error: cannot listen on 127.0.0.1:{taken}: Address already in use"
    )


def test_doctor_says_the_build_has_rpc() -> None:
    ok, line = doctor_line()
    assert ok, line
    assert line.startswith("RPC backend: built in (protocol "), line
