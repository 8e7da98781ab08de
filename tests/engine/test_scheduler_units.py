"""The scheduler's rules with in-process fake runners: fast, no llama.cpp, no processes.

Each test drives :class:`~localllm.daemon.scheduler.Scheduler` through its public methods with
a ``runner_factory`` that hands out :class:`FakeRunner` objects, and checks which runners were
started and closed.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import pytest

from localllm.daemon.devices.cpubudget import CpuBudget
from localllm.daemon.errors import QueueFullError
from localllm.daemon.runner.client import RunnerError, RunnerStartError
from localllm.daemon.runner.protocol import AdapterFile, AdapterStats, RunnerConfig, Stats
from localllm.daemon.scheduler import Scheduler
from localllm.settings import Settings
from localllm.store.adapters import ModelAdapter
from localllm.store.names import ModelName, parse_name

T = TypeVar("T")

# Every wait in these tests is on a condition; this bounds it so a broken rule fails, not hangs.
DEADLINE_S = 10.0


@dataclass
class FakeModel:
    """The part of a LocalModel the scheduler reads."""

    name: ModelName
    parameters: dict[str, Any] = field(default_factory=dict)
    adapters: list[Any] = field(default_factory=list)


class FakeRunner:
    """A runner that serves nothing and records its life."""

    def __init__(self, model: FakeModel, config: RunnerConfig, number: int) -> None:
        self.model = model
        self.config = config
        self.health: dict[str, Any] = {"n_ctx_per_slot": config.n_ctx_per_slot}
        self.number = number
        self.dead = False
        self.closed = asyncio.Event()
        self.shares: list[tuple[int, str, list[int] | None]] = []
        """The shares of the cores the daemon gave it, in order."""
        self.shared = asyncio.Event()
        self.adapters: dict[str, AdapterStats] = {}
        """The LoRA adapters loaded on it."""

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

    async def set_threads(self, threads: int, reason: str, cpus: list[int] | None = None) -> None:
        self.shares.append((threads, reason, cpus))
        self.shared.set()

    async def close(self) -> None:
        self.closed.set()

    async def load_adapters(self, files: list[AdapterFile]) -> list[AdapterStats]:
        if any(f.path.endswith("bad.gguf") for f in files):
            raise RunnerError("llama.cpp could not load adapter bad.gguf", "bad_request")
        self.adapters.update({f.digest: AdapterStats(f.digest, size=1000) for f in files})
        return list(self.adapters.values())


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


def model(name: str, **parameters: Any) -> Any:
    return FakeModel(parse_name(name), parameters)


def config(**changes: Any) -> RunnerConfig:
    """A runner config; without a ``model_path``, each model is a GGUF of its own (see
    :class:`_Scheduler`)."""
    return replace(RunnerConfig(model_path="", n_slots=1), **changes)


class _Scheduler(Scheduler):
    """The scheduler, with each fake model a GGUF blob of its own unless the config names one
    (models of one blob share a runner)."""

    async def acquire(
        self, model: Any, config: RunnerConfig, keep_alive: float | None = None
    ) -> Any:
        if not config.model_path:
            config = replace(config, model_path=f"/nonexistent/{model.name.short}.gguf")
        return await super().acquire(model, config, keep_alive)


F = TypeVar("F", bound="Factory")


def run_with(
    test: Callable[[Scheduler, F], Coroutine[Any, Any, T]], factory: F, settings: Settings
) -> T:
    """Run ``test`` with a scheduler of ``factory``'s runners, closing it afterwards."""

    async def main() -> T:
        scheduler = _Scheduler(settings, runner_factory=factory)
        try:
            async with asyncio.timeout(DEADLINE_S):
                return await test(scheduler, factory)
        finally:
            await scheduler.close()

    return asyncio.run(main())


def run(test: Callable[[Scheduler, Factory], Coroutine[Any, Any, T]], **settings: Any) -> T:
    """Run ``test`` with a scheduler of fakes, closing it afterwards."""
    base = Settings(num_parallel=1, keep_alive=300.0, max_loaded_models=3, max_queue=8)
    return run_with(test, Factory(), base.replace(**settings))


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


def lora_digest(file: str) -> str:
    return "sha256:" + hashlib.sha256(file.encode()).hexdigest()


def lora_model(name: str, *adapters: str) -> Any:
    """A fake model with LoRA adapters (``bad.gguf`` is one the fake runner refuses)."""
    found = [ModelAdapter(lora_digest(a), Path(f"/{a}"), 1000, 1.0) for a in adapters]
    return FakeModel(parse_name(name), adapters=found)


def test_models_of_one_base_share_one_runner_counted_once() -> None:
    base = config(model_path="/base.gguf")

    async def scenario(scheduler: Scheduler, factory: Factory) -> None:
        factory.gate = asyncio.Event()
        # First requests of two models of one base at once: one load, the other joins it.
        first = [
            asyncio.ensure_future(scheduler.acquire(lora_model(n, f"{n}.gguf"), base))
            for n in ("a", "b")
        ]
        await asyncio.sleep(0)
        factory.gate.set()
        for lease in await asyncio.gather(*first):
            lease.release()
        (await scheduler.acquire(model("plain"), base)).release()
        (await scheduler.acquire(model("other"), config())).release()  # a GGUF of its own
        (shared, other) = factory.started
        assert set(shared.adapters) == {lora_digest("a.gguf"), lora_digest("b.gguf")}
        names = {m.name: m for m in scheduler.loaded()}
        assert {m.runner for m in names.values()} == {shared, other}
        assert names["b:latest"].memory_size() == (1000, 0)  # what its adapter adds
        # max_loaded_models counts runners: a third one unloads the least recently used.
        (await scheduler.acquire(model("third"), config())).release()
        assert await closed(shared) and not other.closed.is_set()
        assert {m.name for m in scheduler.loaded()} == {"other:latest", "third:latest"}

    run(scenario, max_loaded_models=2)


def test_a_model_leaving_a_shared_runner_leaves_it_to_the_others() -> None:
    base = config(model_path="/base.gguf")

    async def scenario(scheduler: Scheduler, factory: Factory) -> None:
        for name in ("a", "b"):
            (await scheduler.acquire(lora_model(name, f"{name}.gguf"), base)).release()
        with pytest.raises(RunnerError, match=r"bad\.gguf"):
            await scheduler.acquire(lora_model("c", "bad.gguf"), base)
        (runner,) = factory.started
        assert {m.name for m in scheduler.loaded()} == {"a:latest", "b:latest"}
        assert await scheduler.unload(parse_name("a").full)
        assert not runner.closed.is_set() and [m.name for m in scheduler.loaded()] == ["b:latest"]
        assert await scheduler.unload(parse_name("b").full)
        assert await closed(runner)

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


def test_a_busy_runner_holds_one_more_request_per_slot_and_the_daemon_the_rest() -> None:
    # The runner's queue refills a freed slot at its next step; beyond one request per slot
    # the rest wait here. Both count as waiting, and max_queue bounds them together.
    async def scenario(scheduler: Scheduler, factory: Factory) -> None:
        running = await scheduler.acquire(model("a"), config(n_slots=2))
        second = await scheduler.acquire(model("a"), config(n_slots=2))
        (loaded,) = scheduler.loaded()
        assert (loaded.active, loaded.waiting, scheduler.queued) == (2, 0, 0)
        in_runner = [await scheduler.acquire(model("a"), config(n_slots=2)) for _ in range(2)]
        assert (loaded.active, loaded.queued_in_runner, loaded.waiting) == (2, 2, 2)
        assert scheduler.queued == 2
        here = asyncio.ensure_future(scheduler.acquire(model("a"), config(n_slots=2)))
        while scheduler.queued < 3:
            await asyncio.sleep(0)
        assert not here.done() and loaded.waiting == 3
        with pytest.raises(QueueFullError):
            await scheduler.acquire(model("a"), config(n_slots=2))
        running.release()
        last = await here  # a slot freed: the runner's queue moved up, the daemon's too
        assert (loaded.active, loaded.queued_in_runner, scheduler.queued) == (2, 2, 2)
        for lease in (second, *in_runner, last):
            lease.release()
        assert (loaded.handed, loaded.waiting, scheduler.queued) == (0, 0, 0)
        assert not loaded.busy()

    run(scenario, max_queue=3)


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


# -- memory: runners that plan against a fake machine -------------------------------------------

MIB = 1 << 20


class MemoryFactory(Factory):
    """Fake runners on a machine of ``capacity`` bytes of RAM: each model needs ``sizes[name]``;
    a start is refused (as a runner's memory plan refuses) when what the scheduler reserved for
    the loaded models leaves too little."""

    def __init__(self, capacity: int, sizes: dict[str, int]) -> None:
        super().__init__()
        self.capacity = capacity
        self.sizes = sizes
        self.refused: list[str] = []

    async def __call__(self, model: Any, config: RunnerConfig) -> Any:
        from localllm.daemon.memory.plan import Device, DeviceUse, MemoryPlan, NoFitReport, Trial
        from localllm.daemon.runner.client import DoesNotFitError

        assert config.memory_plan
        need = self.sizes[model.name.model]
        room = self.capacity - config.memory_reserved.get("CPU", 0)
        devices = [Device("CPU", "cpu", self.capacity, self.capacity)]
        use = DeviceUse("CPU", weights=need, layers=1)
        if need > room:
            self.refused.append(model.name.model)
            report = NoFitReport(Trial(4096, 1, 0), [use], devices, {"CPU": room})
            raise DoesNotFitError(report.to_dict())
        runner = await super().__call__(model, config)
        memory = MemoryPlan(1, 4096, 0, 1, 4096, [use], devices, {"CPU": room})
        runner.health["memory_plan"] = memory.to_dict()
        return runner


def run_memory(
    test: Callable[[Scheduler, MemoryFactory], Coroutine[Any, Any, T]],
    capacity: int,
    sizes: dict[str, int],
) -> T:
    settings = Settings(num_parallel=1, keep_alive=300.0, max_loaded_models=8, max_queue=8)
    return run_with(test, MemoryFactory(capacity, sizes), settings)


def planned() -> RunnerConfig:
    return config(memory_plan=True)


def test_a_load_that_does_not_fit_unloads_the_least_recently_used_idle_model() -> None:
    async def scenario(scheduler: Scheduler, factory: MemoryFactory) -> None:
        for name in ("a", "b"):
            (await scheduler.acquire(model(name), planned())).release()
        a, b = factory.started
        lease = await scheduler.acquire(model("c"), planned())
        assert factory.refused == ["c"]  # refused once, then loaded after a went
        assert await closed(a) and b.alive()
        assert {m.name for m in scheduler.loaded()} == {"b:latest", "c:latest"}
        lease.release()

    run_memory(scenario, 10 * MIB, {"a": 4 * MIB, "b": 4 * MIB, "c": 4 * MIB})


def test_a_load_waits_for_a_busy_model_that_would_make_room() -> None:
    async def scenario(scheduler: Scheduler, factory: MemoryFactory) -> None:
        busy = await scheduler.acquire(model("a"), planned())
        loading = asyncio.ensure_future(scheduler.acquire(model("c"), planned()))
        while not factory.refused:
            await asyncio.sleep(0)
        for _ in range(50):  # let the load run as far as it can: it must block, not refuse
            await asyncio.sleep(0)
        assert not loading.done() and factory.started[0].alive()
        busy.release()
        lease = await loading
        assert await closed(factory.started[0])
        assert lease.loaded.name == "c:latest"
        lease.release()

    run_memory(scenario, 6 * MIB, {"a": 4 * MIB, "c": 4 * MIB})


def test_a_pinned_model_is_never_unloaded_to_make_room() -> None:
    from localllm.daemon.errors import InsufficientMemoryError

    async def scenario(scheduler: Scheduler, factory: MemoryFactory) -> None:
        (await scheduler.acquire(model("a"), planned(), keep_alive=-1)).release()
        with pytest.raises(InsufficientMemoryError) as refused:
            await scheduler.acquire(model("c"), planned())
        assert refused.value.status == 507
        message = refused.value.message
        assert message.startswith("c:latest needs 4 MiB") and "2 MiB are free" in message
        assert "negative keep_alive: a:latest" in message
        assert factory.started[0].alive() and len(factory.started) == 1

    run_memory(scenario, 6 * MIB, {"a": 4 * MIB, "c": 4 * MIB})


def test_a_model_larger_than_the_machine_is_refused_at_once() -> None:
    from localllm.daemon.errors import InsufficientMemoryError

    async def scenario(scheduler: Scheduler, factory: MemoryFactory) -> None:
        (await scheduler.acquire(model("a"), planned())).release()
        busy = await scheduler.acquire(model("a"), planned())
        with pytest.raises(InsufficientMemoryError):
            await scheduler.acquire(model("huge"), planned())
        # a was busy and would not have made room: it stays, and nothing waited for it
        assert factory.started[0].alive() and factory.refused == ["huge"]
        busy.release()

    run_memory(scenario, 6 * MIB, {"a": 2 * MIB, "huge": 64 * MIB})


def test_the_models_keep_alive_parameter_is_its_default() -> None:
    async def scenario(scheduler: Scheduler, factory: Factory) -> None:
        (await scheduler.acquire(model("a", keep_alive="-1"), config())).release()
        (await scheduler.acquire(model("b", keep_alive="10m"), config())).release()
        (await scheduler.acquire(model("c"), config())).release()
        keep = {m.name: (m.keep_alive, m.pinned) for m in scheduler.loaded()}
        assert keep == {
            "a:latest": (-1.0, True),
            "b:latest": (600.0, False),
            "c:latest": (300.0, False),
        }
        # A request's own keep_alive still wins.
        lease = await scheduler.acquire(model("a", keep_alive="-1"), config(), keep_alive=0)
        lease.keep_alive = 0
        lease.release()
        assert await closed(factory.started[0])

    run(scenario)


async def share_of(runner: FakeRunner, count: int) -> tuple[int, str, list[int] | None]:
    """The runner's ``count``-th share of the cores (1-based), once it has arrived."""
    while len(runner.shares) < count:
        runner.shared.clear()
        await runner.shared.wait()
    return runner.shares[count - 1]


def test_models_working_at_once_share_the_cores_and_one_left_alone_gets_them_back() -> None:
    async def scenario(scheduler: Scheduler, factory: Factory) -> None:
        scheduler.cpu_budget = CpuBudget(2, [0, 1], pin=True)
        first = await scheduler.acquire(model("a"), config())
        a = factory.started[0]
        assert await share_of(a, 1) == (2, "working alone", None)
        second = await scheduler.acquire(model("b"), config())
        b = factory.started[1]
        assert await share_of(a, 2) == (1, "sharing 2 cores with b:latest", [0])
        assert await share_of(b, 1) == (1, "sharing 2 cores with a:latest", [1])
        # A second request on a model already working changes nothing.
        third = await scheduler.acquire(model("a"), config(n_slots=1), keep_alive=None)
        third.release()
        first.release()
        assert await share_of(b, 2) == (2, "working alone", None)
        second.release()
        assert len(a.shares) == 2 and len(b.shares) == 2  # idle models are left as they are
        again = await scheduler.acquire(model("a"), config())
        assert await share_of(a, 3) == (2, "working alone", None)
        again.release()
        # Idle, a runner keeps its last share: working alone again, it is not told again
        # (no message beside every request of a model used alone).
        for name in ("a", "a", "b", "a"):
            (await scheduler.acquire(model(name), config())).release()
        both = [await scheduler.acquire(model(name), config()) for name in ("a", "b")]
        assert await share_of(b, 3) == (1, "sharing 2 cores with a:latest", [1])
        assert await share_of(a, 4) == (1, "sharing 2 cores with b:latest", [0])
        for lease in both:
            lease.release()
        assert len(a.shares) == 4 and len(b.shares) == 3

    run(scenario, num_parallel=2)


def test_quiet_returns_only_once_no_request_arrived_for_the_settle_time() -> None:
    """What the spare runner waits for before it imports beside the runners: a client that
    sends its next request right after the last finds the daemon quiet only for a moment."""

    async def scenario(scheduler: Scheduler, factory: Factory) -> None:
        loop = asyncio.get_running_loop()
        settle = 0.3
        quiet = asyncio.ensure_future(scheduler.quiet(settle=settle))
        returned_at: list[float] = []
        quiet.add_done_callback(lambda _: returned_at.append(loop.time()))
        arrivals: list[float] = []
        began = loop.time()
        while loop.time() - began < 2 * settle:  # a client asking again and again
            arrivals.append(loop.time())
            lease = await scheduler.acquire(model("a"), config())
            lease.release()
            await asyncio.sleep(settle / 10)  # the client's own pause between requests
        await quiet
        returned = returned_at[0]
        # no earlier than `settle` after any request that came before it (on a machine that
        # stalled the client for longer than that, it may return between two requests)
        before = [at for at in arrivals if at <= returned]
        assert before and all(returned - at >= settle for at in before)
        assert len(arrivals) >= 5

    run(scenario)
