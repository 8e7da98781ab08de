"""The spare runner (:mod:`localllm.daemon.runner.spare`): a runner process started ahead, its
imports done, becomes the runner of the next load whose environment is its own.

Real processes throughout: daemons with the tiny GGUF, and spare pools driving real runners of
SmolLM2 in this process. A spare is known by its command line (``--spare-fd``), which it keeps
once it serves a model: the runner of a load that used it says so.
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_daemon_support import Daemon, running_daemon, start_daemon, wait_for_stats
from tiny_gguf import write_tiny_gguf

from localllm.daemon.memory.system import host_memory
from localllm.daemon.runner import GenerationRequest, RunnerConfig, RunnerProcess, SamplingOptions
from localllm.daemon.runner.client import DoesNotFitError, RunnerClient, RunnerStartError
from localllm.daemon.runner.spare import SparePool

MODELS = [f"tiny:load{i}" for i in range(6)]
# A load and its first request must come well within this (the tiny model loads in a blink).
TIMEOUT = 120.0


def _cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as file:
        return [part.decode() for part in file.read().split(b"\0") if part]


def _from_spare(pid: int) -> bool:
    return "--spare-fd" in _cmdline(pid)


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as listing:
            found += [int(child) for child in listing.read().split()]
    return found


def _wait_gone(pid: int, timeout: float = 60.0) -> bool:
    """Whether process ``pid`` (not a child of this one) ended within ``timeout``: a pidfd
    becomes readable when its process exits."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        readable, _, _ = select.select([fd], [], [], timeout)
        return bool(readable)
    finally:
        os.close(fd)


def _ready_spare(daemon: Daemon, other_than: int | None = None) -> int:
    """The pid of the daemon's spare once it is ready (another than ``other_than``)."""
    snapshot = wait_for_stats(
        daemon,
        lambda s: (
            (spare := s.get("spare_runner")) is not None
            and spare["ready"]
            and spare["pid"] != other_than
        ),
        timeout=TIMEOUT,
    )
    return int(snapshot["spare_runner"]["pid"])


def _load(http: httpx.Client, model: str) -> tuple[int, str]:
    """Load ``model`` with one greedy request: (its runner's pid, the answer)."""
    response = http.post(
        "/api/generate",
        json={
            "model": model,
            "prompt": "the spare runner",
            "raw": True,
            "stream": False,
            "options": {"temperature": 0, "num_predict": 8},
        },
    )
    assert response.status_code == 200, response.text
    ps = http.get("/api/ps").json()["models"]
    (entry,) = [m for m in ps if m["name"] == model]
    return int(entry["runner_pid"]), response.json()["response"]


def _models(daemon: Daemon, paths: list[Path]) -> None:
    with daemon.http() as http:
        for name, path in zip(MODELS, paths, strict=True):
            response = http.post("/api/create", json={"model": name, "from": str(path)})
            assert response.status_code == 200, response.text


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Tiny GGUFs of different weights: models of one blob would share one runner."""
    folder = tmp_path_factory.mktemp("spare")
    return [write_tiny_gguf(folder / f"tiny{i}.gguf", seed=i) for i in range(len(MODELS))]


def _first_load(daemon: Daemon, tiny: list[Path]) -> int:
    """Create the models and load the last one: a daemon starts its first spare after its
    first load, none before (checked here). The first load's runner pid."""
    with daemon.http() as http:
        assert http.get("/api/stats").json()["spare_runner"] is None
    _models(daemon, tiny)
    with daemon.http() as http:
        pid, _ = _load(http, MODELS[-1])
        assert not _from_spare(pid)
    return pid


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, tiny: list[Path]) -> Iterator[Daemon]:
    home = tmp_path_factory.mktemp("spare") / "home"
    settings: dict[str, Any] = {"context_length": 256, "max_loaded_models": 1}
    with running_daemon(home, num_threads=1, spare_runner="on", **settings) as d:
        _first_load(d, tiny)
        yield d


def test_a_load_runs_on_the_spare_and_the_next_load_on_a_new_one(daemon: Daemon) -> None:
    first_spare = _ready_spare(daemon)
    with daemon.http() as http:
        pid, _ = _load(http, MODELS[0])
        assert pid == first_spare
        assert _from_spare(pid)
        second_spare = _ready_spare(daemon, other_than=first_spare)
        assert second_spare != pid and pid in _children(daemon.process.pid)
        pid2, _ = _load(http, MODELS[1])
    assert pid2 == second_spare
    assert f"runner pid {pid2} is the spare started ahead" in daemon.log()


def test_a_killed_spare_is_not_used_and_the_load_starts_a_fresh_runner(daemon: Daemon) -> None:
    spare = _ready_spare(daemon)
    os.kill(spare, signal.SIGKILL)
    # The daemon notices (its end of the spare's socket reads end of file).
    wait_for_stats(
        daemon,
        lambda s: s["spare_runner"] is None or s["spare_runner"] == {"pid": spare, "ready": False},
        timeout=TIMEOUT,
    )
    with daemon.http() as http:
        pid, answer = _load(http, MODELS[2])
    assert pid != spare
    assert not _from_spare(pid)
    assert answer
    # And a new spare replaces the dead one.
    assert _ready_spare(daemon, other_than=spare) != pid


def test_the_setting_off_means_no_spare_process(tmp_path: Path, tiny: list[Path]) -> None:
    with running_daemon(tmp_path / "home", num_threads=1, spare_runner="off") as daemon:
        _models(daemon, tiny)
        with daemon.http() as http:
            pid, _ = _load(http, MODELS[0])
            assert http.get("/api/stats").json()["spare_runner"] is None
        children = _children(daemon.process.pid)
        assert children == [pid]
        assert not _from_spare(pid)
    assert "spare runner" not in daemon.log()


def test_the_spare_ends_with_the_daemon(tmp_path: Path, tiny: list[Path]) -> None:
    with running_daemon(tmp_path / "home", num_threads=1, spare_runner="on") as daemon:
        _first_load(daemon, tiny)
        spare = _ready_spare(daemon)
        assert spare in _children(daemon.process.pid)
    # The daemon stopped (cleanly, checked by running_daemon) and reaped its spare.
    assert not os.path.exists(f"/proc/{spare}")


def test_a_spare_exits_once_its_daemon_died_without_stopping_it(
    tmp_path: Path, tiny: list[Path]
) -> None:
    daemon = start_daemon(tmp_path / "home", num_threads=1, spare_runner="on")
    try:
        _first_load(daemon, tiny)
        spare = _ready_spare(daemon)
        assert os.getsid(spare) == spare  # a session (and process group) of its own
    finally:
        daemon.kill()
    assert _wait_gone(spare), "the spare outlived its daemon"


# -- the pool in this process, with SmolLM2 ---------------------------------------------------


async def _answer(client: RunnerClient) -> tuple[str, int]:
    request = GenerationRequest(
        id="",
        prompt="Write a haiku about a spare tyre.",
        options=SamplingOptions(temperature=0.0, num_predict=24),
    )
    result = None
    async for item in client.generate(request):
        result = item
    assert result is not None and hasattr(result, "text")
    return result.text, result.timings.completion_tokens  # type: ignore[union-attr]


async def _spare_ready(pool: SparePool) -> int:
    """Start the pool's spare and wait until it is ready (its ``spare`` line read)."""
    pool.refill()
    assert await pool.wait_ready()
    assert pool.pid is not None and _from_spare(pool.pid)
    return pool.pid


def _run(coroutine: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, TIMEOUT))


def test_a_runner_on_the_spare_answers_as_a_fresh_one(tmp_path: Path, smollm2_gguf: Path) -> None:
    config = RunnerConfig(model_path=str(smollm2_gguf), n_slots=1, n_ctx_per_slot=512, n_threads=2)

    async def both() -> list[tuple[int | None, bool, tuple[str, int]]]:
        pool = SparePool(tmp_path / "logs")
        answers = []
        try:
            spare = await _spare_ready(pool)
            for name, spares in (("spare", pool), ("fresh", None)):
                process = RunnerProcess(config, tmp_path / f"{name}.sock", tmp_path / f"{name}.log")
                client = await process.start(spares=spares)
                try:
                    answers.append((process.pid, process.pid == spare, await _answer(client)))
                finally:
                    await client.close()
                    await process.stop()
                assert not process.alive()
        finally:
            await pool.close()
        return answers

    (spare_pid, on_spare, on_spare_answer), (fresh_pid, on_fresh, fresh_answer) = _run(both())
    assert on_spare and not on_fresh and spare_pid != fresh_pid
    assert on_spare_answer == fresh_answer
    assert on_spare_answer[1] > 0
    # The runner's own log got its output (llama.cpp's and the runner's), as a fresh one's.
    log = (tmp_path / "spare.log").read_text(errors="replace")
    assert "serving" in log and "llama_model_loader" in log
    assert "serving" not in (tmp_path / "logs" / "runner-spare.log").read_text(errors="replace")


def test_a_load_with_another_environment_starts_a_fresh_runner(
    tmp_path: Path, tiny_gguf: Path
) -> None:
    # A CPU-only runner (after a GPU failed) hides the GPUs through its environment.
    config = RunnerConfig(model_path=str(tiny_gguf), n_ctx_per_slot=256, cpu_only=True)

    async def load() -> tuple[int, int, bool, bool, str]:
        pool = SparePool(tmp_path / "logs")
        try:
            spare = await _spare_ready(pool)
            process = RunnerProcess(config, tmp_path / "r.sock", tmp_path / "r.log")
            client = await process.start(spares=pool)
            try:
                assert process.pid is not None
                text, _ = await _answer(client)
                kept = pool.ready and pool.pid == spare
                return process.pid, spare, _from_spare(process.pid), kept, text
            finally:
                await client.close()
                await process.stop()
        finally:
            await pool.close()

    pid, spare, from_spare, spare_kept, text = _run(load())
    assert pid != spare and not from_spare
    assert spare_kept  # still there, ready for a load it can serve
    assert text
    assert not os.path.exists(f"/proc/{spare}")  # the pool's close reaped it


def test_a_pool_switched_off_never_starts_a_process(tmp_path: Path) -> None:
    """A pool switched off never starts a process, whatever is asked of it."""

    async def off() -> tuple[object, object]:
        pool = SparePool(tmp_path / "logs", enabled=False)
        pool.refill()
        handed = await pool.hand(["--model", "x"], tmp_path / "x.log", None)
        await pool.close()
        return pool.describe(), handed

    assert _run(off()) == (None, None)
    assert not (tmp_path / "logs").exists()


def test_a_load_that_fails_on_the_spare_is_reported_as_on_a_fresh_runner(
    tmp_path: Path, tiny_gguf: Path
) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 64)
    failing = RunnerConfig(model_path=str(broken), n_slots=1, n_ctx_per_slot=256)
    # Everything free is taken by (pretend) loaded models: the plan refuses before loading.
    reserved = {"CPU": host_memory().available}
    too_big = RunnerConfig(model_path=str(tiny_gguf), memory_plan=True, memory_reserved=reserved)

    async def start(
        config: RunnerConfig, folder: Path, pool: SparePool | None
    ) -> tuple[Exception, int | None]:
        process = RunnerProcess(config, folder / "r.sock", folder / "r.log")
        try:
            client = await process.start(spares=pool)
        except RunnerStartError as exc:
            assert not process.alive()
            return exc, process.pid
        await client.close()
        await process.stop()
        raise AssertionError("the runner started")

    async def failures() -> list[tuple[Exception, Exception]]:
        found = []
        for index, config in enumerate((failing, too_big)):
            pool = SparePool(tmp_path / "logs")
            try:
                spare = await _spare_ready(pool)
                on_spare, pid = await start(config, _folder(tmp_path / f"spare{index}"), pool)
                assert pid == spare
                fresh, pid = await start(config, _folder(tmp_path / f"fresh{index}"), None)
                assert pid != spare
                found.append((on_spare, fresh))
            finally:
                await pool.close()
        return found

    (broken_spare, broken_fresh), (nofit_spare, nofit_fresh) = _run(failures())
    # The same one-line message, from the same log's cause line, but for the folder.
    spare_text = str(broken_spare).replace(str(tmp_path / "spare0"), "F")
    assert spare_text == str(broken_fresh).replace(str(tmp_path / "fresh0"), "F")
    assert "while loading the model" in spare_text and "\n" not in spare_text
    assert isinstance(broken_spare, RunnerStartError) and broken_spare.returncode == 2
    # A refusal by the memory plan (``nofit`` on the ready channel) arrives as it does fresh.
    assert isinstance(nofit_spare, DoesNotFitError) and isinstance(nofit_fresh, DoesNotFitError)
    # Of the same plan: but for the free memory each saw (the machine's, a moment apart).
    assert nofit_spare.report.keys() == nofit_fresh.report.keys()
    for key in nofit_spare.report.keys() - {"devices"}:
        assert nofit_spare.report[key] == nofit_fresh.report[key], key
    assert "does not fit" in (tmp_path / "spare1" / "r.log").read_text()


def _folder(path: Path) -> Path:
    path.mkdir()
    return path
