"""The scheduler's rules with in-process fake runners: fast, no llama.cpp, no processes.

Each test drives :class:`~localllm.daemon.scheduler.Scheduler` through its public methods with
a ``runner_factory`` that hands out :class:`FakeRunner` objects, and checks which runners were
started and closed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import pytest

from localllm.daemon.errors import QueueFullError
from localllm.daemon.runner.client import RunnerStartError
from localllm.daemon.runner.protocol import RunnerConfig, Stats
from localllm.daemon.scheduler import Scheduler
from localllm.names import ModelName, parse_name
from localllm.settings import Settings

T = TypeVar("T")

# Every wait in these tests is on a condition; this bounds it so a broken rule fails, not hangs.
DEADLINE_S = 10.0


@dataclass
class FakeModel:
    """The part of a LocalModel the scheduler reads."""

    name: ModelName


class FakeRunner:
    """A runner that serves nothing and records its life."""

    def __init__(self, model: FakeModel, config: RunnerConfig, number: int) -> None:
        self.model = model
        self.config = config
        self.health: dict[str, Any] = {"n_ctx_per_slot": config.n_ctx_per_slot}
        self.number = number
        self.dead = False
        self.closed = asyncio.Event()

    @property
    def pid(self) -> int | None:
        return 10_000 + self.number

    def alive(self) -> bool:
        return not self.dead and not self.closed.is_set()

    async def stats(self) -> Stats:
        return Stats(
            slots=[],
            waiting=0,
            kv_cells_used=0,
            kv_cells_total=0,
            decode_tokens_per_s=0.0,
            prefill_tokens_per_s=0.0,
        )

    async def close(self) -> None:
        self.closed.set()


class Factory:
    """Starts fake runners; ``gate`` (when set) holds every load until it opens."""

    def __init__(self) -> None:
        self.started: list[FakeRunner] = []
        self.gate: asyncio.Event | None = None
        self.fail_next: str | None = None

    async def __call__(self, model: Any, config: RunnerConfig) -> Any:
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_next is not None:
            message, self.fail_next = self.fail_next, None
            raise RunnerStartError(message)
        runner = FakeRunner(model, config, len(self.started))
        self.started.append(runner)
        return runner


def model(name: str) -> Any:
    return FakeModel(parse_name(name))


def config(**changes: Any) -> RunnerConfig:
    return replace(RunnerConfig(model_path="/nonexistent.gguf", n_slots=1), **changes)


def run(test: Callable[[Scheduler, Factory], Coroutine[Any, Any, T]], **settings: Any) -> T:
    """Run ``test`` with a scheduler of fakes, closing it afterwards."""

    async def main() -> T:
        factory = Factory()
        base = Settings(num_parallel=1, keep_alive=300.0, max_loaded_models=3, max_queue=8)
        scheduler = Scheduler(base.replace(**settings), runner_factory=factory)
        try:
            async with asyncio.timeout(DEADLINE_S):
                return await test(scheduler, factory)
        finally:
            await scheduler.close()

    return asyncio.run(main())


async def closed(runner: FakeRunner) -> bool:
    await asyncio.wait_for(runner.closed.wait(), DEADLINE_S)
    return True


def test_a_loaded_model_is_shared_and_reused() -> None:
    async def scenario(scheduler: Scheduler, factory: Factory) -> None:
        lease = await scheduler.acquire(model("a"), config())
        lease.release()
        again = await scheduler.acquire(model("a"), config())
        again.release()
        assert len(factory.started) == 1
        assert again.load_seconds == 0.0
        assert [m.name for m in scheduler.loaded()] == ["a:latest"]

    run(scenario)


def test_least_recently_used_idle_model_is_unloaded_to_make_room() -> None:
    async def scenario(scheduler: Scheduler, factory: Factory) -> None:
        for name in ("a", "b"):
            (await scheduler.acquire(model(name), config())).release()
        # Use a again, so b is now the least recently used.
        (await scheduler.acquire(model("a"), config())).release()
        (await scheduler.acquire(model("c"), config())).release()
        a, b, c = factory.started
        assert await closed(b)
        assert not a.closed.is_set() and not c.closed.is_set()
        assert {m.name for m in scheduler.loaded()} == {"a:latest", "c:latest"}

    run(scenario, max_loaded_models=2)


def test_a_busy_model_is_not_unloaded_the_new_load_waits() -> None:
    async def scenario(scheduler: Scheduler, factory: Factory) -> None:
        busy = await scheduler.acquire(model("a"), config())
        loading = asyncio.ensure_future(scheduler.acquire(model("b"), config()))
        await asyncio.sleep(0)  # let the load reach its wait for room
        for _ in range(20):
            await asyncio.sleep(0)
        assert not loading.done(), "b must wait while a is busy and the limit is 1"
        assert not factory.started[0].closed.is_set()
        busy.release()
        (await loading).release()
        assert await closed(factory.started[0])
        assert [m.name for m in scheduler.loaded()] == ["b:latest"]

    run(scenario, max_loaded_models=1)


def test_changed_load_options_reload_the_runner() -> None:
    async def scenario(scheduler: Scheduler, factory: Factory) -> None:
        (await scheduler.acquire(model("a"), config(n_batch=512))).release()
        (await scheduler.acquire(model("a"), config(n_batch=64))).release()
        first, second = factory.started
        assert await closed(first)
        assert second.config.n_batch == 64 and second.alive()

    run(scenario)


def test_keep_alive_zero_unloads_after_the_request() -> None:
    async def scenario(scheduler: Scheduler, factory: Factory) -> None:
        lease = await scheduler.acquire(model("a"), config(), keep_alive=0)
        lease.keep_alive = 0
        lease.release()
        assert await closed(factory.started[0])
        assert scheduler.loaded() == []

    run(scenario)


def test_negative_keep_alive_never_expires() -> None:
    async def scenario(scheduler: Scheduler, factory: Factory) -> None:
        lease = await scheduler.acquire(model("a"), config(), keep_alive=-1)
        lease.keep_alive = -1
        lease.release()
        (loaded,) = scheduler.loaded()
        assert loaded.expires_at is None
        assert loaded.expiry is None

    run(scenario)


def test_full_queue_answers_503_at_once() -> None:
    async def scenario(scheduler: Scheduler, factory: Factory) -> None:
        holder = await scheduler.acquire(model("a"), config())
        waiter = asyncio.ensure_future(scheduler.acquire(model("a"), config()))
        while scheduler.queued < 1:
            await asyncio.sleep(0)
        with pytest.raises(QueueFullError) as refused:
            await scheduler.acquire(model("a"), config())
        assert refused.value.status == 503
        assert refused.value.headers.get("Retry-After")
        holder.release()
        (await waiter).release()
        assert scheduler.queued == 0

    run(scenario, max_queue=1)


def test_a_dead_runner_is_replaced_on_the_next_request() -> None:
    async def scenario(scheduler: Scheduler, factory: Factory) -> None:
        (await scheduler.acquire(model("a"), config())).release()
        factory.started[0].dead = True
        lease = await scheduler.acquire(model("a"), config())
        lease.release()
        assert len(factory.started) == 2
        assert lease.loaded.runner is factory.started[1]
        assert await closed(factory.started[0])

    run(scenario)


def test_a_failed_load_raises_and_the_next_request_loads_again() -> None:
    async def scenario(scheduler: Scheduler, factory: Factory) -> None:
        factory.fail_next = "the runner exited with status 2 while loading the model: bad file"
        with pytest.raises(RunnerStartError, match="bad file"):
            await scheduler.acquire(model("a"), config())
        assert scheduler.loaded() == []
        (await scheduler.acquire(model("a"), config())).release()
        assert len(factory.started) == 1 and factory.started[0].alive()

    run(scenario)


def test_shutdown_during_a_load_stops_the_runner_it_produced() -> None:
    async def scenario(scheduler: Scheduler, factory: Factory) -> None:
        factory.gate = asyncio.Event()
        request = asyncio.ensure_future(scheduler.acquire(model("a"), config()))
        while not scheduler._loading:
            await asyncio.sleep(0)
        closing = asyncio.ensure_future(scheduler.close())
        await asyncio.sleep(0)
        factory.gate.set()
        await closing
        with pytest.raises(RuntimeError, match="shutting down"):
            await request
        (runner,) = factory.started
        assert await closed(runner)
        with pytest.raises(RuntimeError, match="shutting down"):
            await scheduler.acquire(model("b"), config())

    run(scenario)


def test_keep_alive_shorter_than_the_load_still_serves_the_request() -> None:
    # The expiry armed when the load finishes must not unload the model before the request
    # that asked for it takes its slot (it used to, and the request reloaded it for ever).
    async def scenario(scheduler: Scheduler, factory: Factory) -> None:
        lease = await scheduler.acquire(model("a"), config(), keep_alive=1e-9)
        assert lease.loaded.alive()
        lease.keep_alive = 1e-9
        lease.release()
        assert len(factory.started) == 1
        assert await closed(factory.started[0])  # and it does go away afterwards

    run(scenario)


def test_a_request_that_leaves_during_the_load_gives_its_reservation_back() -> None:
    async def scenario(scheduler: Scheduler, factory: Factory) -> None:
        factory.gate = asyncio.Event()
        leaving = asyncio.ensure_future(scheduler.acquire(model("a"), config(), keep_alive=0))
        while not scheduler._loading:
            await asyncio.sleep(0)
        leaving.cancel()
        factory.gate.set()
        with pytest.raises(asyncio.CancelledError):
            await leaving
        while scheduler._loading:
            await asyncio.sleep(0)
        assert len(factory.started) == 1
        # Not held by the request that left: idle, so keep_alive (or the next load) can
        # unload it.
        assert all(not loaded.busy() for loaded in scheduler._models.values())
        while scheduler._models:  # keep_alive 0 unloads it once the load is done
            await asyncio.sleep(0)
        assert await closed(factory.started[0])

    run(scenario)


def test_finished_requests_build_the_daemons_history() -> None:
    from localllm.daemon.runner.protocol import GenerationResult, Timings

    async def scenario(scheduler: Scheduler, factory: Factory) -> None:
        for ttft in (100.0, 300.0):
            lease = await scheduler.acquire(model("a"), config())
            timings = Timings(ttft_ms=ttft, completion_tokens=5, decode_tokens_per_s=50.0)
            lease.record(GenerationResult(id="r", text="", done_reason="stop", timings=timings))
            lease.release()
        series = scheduler.history.series("a:latest")
        assert series["requests"] == 2
        assert series["ttft_ms"] == [100.0, 300.0]
        assert series["decode_tps"] == [50.0, 50.0]

    run(scenario)
