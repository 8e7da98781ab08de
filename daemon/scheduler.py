"""The scheduler: which runner serves a request, when models load and unload, who waits.

* A model loads on first use (its runner process starts); concurrent first requests for the
  same model share one load (a per-model lock). A model made of the same GGUF blob as a
  loaded one, wanting the same load options, joins that model's runner instead: the base is
  loaded once and counted once, each model running with its own LoRA adapters
  (:mod:`localllm.daemon.lora.sharing`).
* Each loaded model takes one request per runner slot, and one more per slot that waits in
  the runner's own queue, prompt already prepared: a slot that frees is refilled at the
  runner's next step, not after a round trip through the daemon (a burst of 32 requests on 8
  slots ran 1-4 % faster so). A request that finds every slot taken waits, in the runner or
  in the daemon's queue; when ``max_queue`` requests already wait in both, it gets
  :class:`~.errors.QueueFullError` (503 + Retry-After) at once.
* ``keep_alive`` (per request, else the setting) decides when an idle model unloads: 0 at once
  after the request, negative never, otherwise that many seconds after its last request.
* At most ``max_loaded_models`` runners; loading another unloads the least recently used idle
  one, or waits until one is idle.
* A request whose load options (context, batch, GPU layers, threads) differ from the loaded
  runner's waits for that runner to go idle and reloads it, as Ollama does.
* A runner that died is noticed on the next request and started again; the requests it was
  serving fail with their own error (the runner client raises ``RunnerDiedError``). When RPC
  workers took it down, that load may go on without them (``RunnerConfig.rpc_lost``).
* Every load follows the CPU probe's decision (:mod:`localllm.daemon.devices.cpu`, once per
  thread count, in a thread): weight repacking on or off, or a one-line refusal when llama.cpp
  cannot run on this CPU at all. A runner with repacking on that dies by a native fault the
  probe missed (SIGILL, SIGSEGV) turns repacking off for later loads, and a load that died so
  is tried once without.
* Memory (:mod:`localllm.daemon.memory.plan`): runners plan their load against free memory
  before allocating anything, one load at a time, each told what the loaded models may still
  grow into (their plan less what they hold now). A load that does not fit unloads idle
  models, least recently used first, and tries again; while models that would make room are
  busy, it waits for them; when nothing could make room, it is refused
  (:class:`~.errors.InsufficientMemoryError`) with the plan's sentence: what is needed, what
  is free, what to change. Models kept loaded forever (a negative ``keep_alive``: pinned)
  are never unloaded to make room.
* ``keep_alive`` not given by a request comes from the model's ``PARAMETER keep_alive``, else
  the setting.

The scheduler knows runners only through the :class:`Runner` protocol and gets them from a
``runner_factory``; the daemon's factory starts runner processes
(:class:`~.runner.client.ProcessRunner`, on the spare runner started ahead when it can:
:mod:`.runner.spare`), the unit tests pass in-process fakes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localllm._exceptions import SettingsError
from localllm.settings import Settings, parse_duration
from localllm.store.models import LocalModel

from .devices import cpu
from .devices.cpubudget import CpuBudget
from .devices.gpuhealth import GpuHealth
from .devices.procfs import allowed_cpus
from .errors import InsufficientMemoryError, QueueFullError
from .history import RequestHistory
from .lora.sharing import RunnerShare, runner_for, runner_queue, working_runners
from .memory.plan import HOST, MemoryPlan, NoFitReport, refusal
from .runner.client import (
    DoesNotFitError,
    ProcessRunner,
    RunnerStartError,
    plan_only,
)
from .runner.handle import Runner, RunnerFactory
from .runner.protocol import (
    GenerationResult,
    RunnerConfig,
    Stats,
)
from .runner.spare import SparePool

__all__ = ["Lease", "LoadedModel", "RequestRecord", "Runner", "RunnerFactory", "Scheduler"]


CpuDecider = Callable[[Settings, int], cpu.CpuPaths]
"""Decides llama.cpp's CPU paths for a thread count (blocking: it may run the probe)."""

log = logging.getLogger("localllm.daemon")

_RECENT = 64
RUNNER_QUEUE_PER_SLOT = 1
"""Requests per runner slot that wait in the runner's queue rather than in the daemon's."""


@dataclass
class RequestRecord:
    """Timings of one finished request, kept for the dashboard."""

    finished_at: float
    """Wall-clock time (seconds since the epoch)."""
    ttft_ms: float
    """Time to first token as the runner measured it."""
    prompt_tokens: int
    """Prompt length."""
    cached_tokens: int
    """Prompt tokens reused from the KV cache."""
    prompt_tokens_per_s: float
    """Prefill speed (evaluated tokens only)."""
    completion_tokens: int
    """Tokens generated."""
    decode_tokens_per_s: float
    """Decode speed."""
    done_reason: str
    """stop, length, cancel or error."""
    draft_tokens: int = 0
    """Speculative draft tokens verified."""
    draft_accepted: int = 0
    """Of those, accepted."""


@dataclass(eq=False)
class LoadedModel:
    """A running runner for one model."""

    key: str
    """The model's full name."""
    model: LocalModel
    """The model it serves."""
    config: RunnerConfig
    """How it was loaded."""
    runner: Runner
    """The runner serving it."""
    load_seconds: float
    """How long loading took."""
    keep_alive: float
    """Seconds to stay loaded once idle (the most recent request's choice)."""
    slots: asyncio.Semaphore = field(init=False)
    """Permits to hand a request to the runner: its slots and its queue."""
    handed: int = 0
    """Requests handed to the runner: in its slots or its queue."""
    pending: int = 0
    """Requests waiting in the daemon for a permit (or reserved during a load)."""
    last_used: float = field(default_factory=time.time)
    """When the last request ended (or the model loaded)."""
    loaded_at: float = field(default_factory=time.time)
    """When loading finished."""
    closing: bool = False
    """Set once the model is being unloaded; no request may start on it."""
    recent: deque[RequestRecord] = field(default_factory=lambda: deque(maxlen=_RECENT))
    """The latest finished requests."""
    expiry: asyncio.TimerHandle | None = None
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    share: RunnerShare = field(default=None)  # type: ignore[assignment]
    """The runner and the other models it serves (a new one unless given)."""

    def __post_init__(self) -> None:
        if self.share is None:
            permits = self.config.n_slots * (1 + RUNNER_QUEUE_PER_SLOT)
            self.share = RunnerShare(self.runner, permits)
        self.share.members.append(self)
        self.slots = self.share.slots
        self.idle.set()

    @property
    def active(self) -> int:
        """Requests in a slot, as far as the daemon can tell (the runner admits from its
        queue as soon as a slot frees)."""
        return min(self.handed, self.config.n_slots)

    @property
    def queued_in_runner(self) -> int:
        """Requests handed to the runner that wait in its queue for a slot (of the runner's
        queue, at most this model's requests)."""
        return max(0, min(self.handed, self.share.handed - self.config.n_slots))

    @property
    def waiting(self) -> int:
        """Requests waiting for a slot: in the daemon and in the runner's queue."""
        return self.pending + self.queued_in_runner

    @property
    def name(self) -> str:
        """The model's name as people write it."""
        return self.model.name.short

    @property
    def health(self) -> dict[str, Any]:
        """What the runner said about itself once loaded."""
        return self.runner.health

    def alive(self) -> bool:
        """True while the runner runs and is not being unloaded."""
        return not self.closing and self.runner.alive()

    def busy(self) -> bool:
        """True while requests use or wait for it."""
        return self.handed + self.pending > 0

    def update_idle(self) -> None:
        """Keep the ``idle`` event in step with the counters."""
        if self.busy():
            self.idle.clear()
        else:
            self.idle.set()

    @property
    def expires_at(self) -> float | None:
        """When it will unload (epoch seconds), or None for never."""
        if self.keep_alive < 0:
            return None
        base = time.time() if self.busy() else self.last_used
        return base + self.keep_alive

    @property
    def context_length(self) -> int:
        """Context per slot."""
        return int(self.health.get("n_ctx_per_slot", self.config.n_ctx_per_slot))

    @property
    def pid(self) -> int | None:
        """The runner's process id."""
        return self.runner.pid

    @property
    def plan(self) -> MemoryPlan | None:
        """The memory plan the runner loaded by (None for a runner that did not plan)."""
        data = self.health.get("memory_plan")
        if not isinstance(data, dict):
            return None
        try:
            return MemoryPlan.from_dict(data)
        except (KeyError, TypeError, ValueError):
            return None

    def memory_size(self) -> tuple[int, int]:
        """(bytes in all, bytes in GPU memory), as ``/api/ps`` reports them: what the load
        allocated (llama.cpp's own figures, :mod:`localllm.daemon.devices.allocations`) with the
        plan's share
        for what is loaded beside the model (projector, draft); without those figures the
        memory plan's, or for a runner without one an estimate from the GGUF (all on the GPU
        when every layer is offloaded, else in proportion). A model on another model's runner
        reports only what its LoRA adapters add (the runner is counted once)."""
        if self.share.owner is not self:
            return self.share.adapter_bytes(self.model), 0
        plan = self.plan
        allocated: dict[str, int] = self.health.get("allocated") or {}
        if allocated:
            besides = [(u.device, u.other) for u in plan.uses] if plan is not None else []
            size = sum(allocated.values()) + sum(b for _, b in besides)
            vram = sum(b for device, b in [*allocated.items(), *besides] if device != HOST)
            return size, vram
        if plan is not None:
            return plan.size, plan.size_vram
        from localllm.gguf_info import estimate_memory

        model = self.model
        try:
            cells = self.config.n_ctx_per_slot * self.config.n_slots
            size = estimate_memory(model.info, cells, self.config.kv_cache_type)["total"]
            if (layer := model.projector_layer) is not None:
                size += layer.size
            blocks = (model.info.block_count or 0) + 1
        except Exception:
            size, blocks = model.entry.size, 1
        offload = self.health.get("gpu_offload", True)
        gpu_layers = int(self.health.get("gpu_layers", 0) or 0) if offload else 0
        vram = size if gpu_layers >= blocks else size * max(gpu_layers, 0) // blocks
        return size, vram

    @property
    def pinned(self) -> bool:
        """Kept loaded forever (a negative keep_alive): never unloaded to make room."""
        return self.keep_alive < 0


def _any_idle(models: list[LoadedModel]) -> bool:
    return any(not m.share.busy() for m in models)


def _would_make_room(report: NoFitReport, models: list[LoadedModel]) -> bool:
    """Whether unloading ``models`` frees what ``report`` says is missing on every device."""
    freed: dict[str, int] = {}
    for model in models:
        plan = model.plan
        for use in plan.uses if plan is not None else []:
            freed[use.device] = freed.get(use.device, 0) + use.total
        if plan is not None:
            freed[HOST] = freed.get(HOST, 0) + plan.prefix_cache
    return all(freed.get(device, 0) >= missing for device, missing in report.short().items())


class Lease:
    """A slot on a loaded model, held for one request. Release it exactly once (idempotent)."""

    def __init__(self, scheduler: Scheduler, loaded: LoadedModel, load_seconds: float) -> None:
        self._scheduler = scheduler
        self.loaded = loaded
        """The model serving the request."""
        self.load_seconds = load_seconds
        """Time this request spent loading the model (0 when it was loaded already)."""
        self.keep_alive: float | None = None
        """The request's keep_alive, applied on release."""
        self._released = False

    @property
    def runner(self) -> Runner:
        """The runner serving the request."""
        return self.loaded.runner

    def record(self, result: GenerationResult) -> None:
        """Remember a finished request's timings for the dashboard and metrics."""
        t = result.timings
        if self._scheduler.on_request_done is not None:
            self._scheduler.on_request_done(self.loaded, result)
        self._scheduler.history.record(
            self.loaded.name, t.ttft_ms, t.decode_tokens_per_s, t.completion_tokens
        )
        self.loaded.recent.append(
            RequestRecord(
                finished_at=time.time(),
                ttft_ms=t.ttft_ms,
                prompt_tokens=t.prompt_tokens,
                cached_tokens=t.cached_tokens,
                prompt_tokens_per_s=t.prompt_tokens_per_s,
                completion_tokens=t.completion_tokens,
                decode_tokens_per_s=t.decode_tokens_per_s,
                done_reason=result.done_reason,
                draft_tokens=t.draft_tokens,
                draft_accepted=t.draft_accepted,
            )
        )

    def release(self) -> None:
        """Give the slot back and apply keep_alive."""
        if self._released:
            return
        self._released = True
        self._scheduler._release(self.loaded, self.keep_alive)

    async def __aenter__(self) -> Lease:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.release()


class Scheduler:
    """Loads, shares and unloads runners; see the module docstring for the rules."""

    def __init__(
        self,
        settings: Settings,
        on_load: Callable[[LoadedModel], None] | None = None,
        runner_factory: RunnerFactory | None = None,
        cpu_decider: CpuDecider | None = None,
    ) -> None:
        self.settings = settings
        self._runner_factory = runner_factory or self._start_process
        self._cpu_decider = cpu_decider or (lambda s, threads: cpu.decide(s, threads))
        self._cpu_paths: dict[int, asyncio.Future[cpu.CpuPaths]] = {}
        self.history = RequestHistory()
        """TTFT and decode rate of every model's requests since the daemon started."""
        self._models: dict[str, LoadedModel] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        # One runner starts at a time: each plans against the memory the others left.
        self._load_gate = asyncio.Lock()
        self._loading: dict[str, asyncio.Task[LoadedModel]] = {}
        self._loads: dict[str, RunnerConfig] = {}  # the config each load in _loading is for
        self._changed = asyncio.Condition()
        self._arrivals = 0  # requests (and loads) asked for so far: see quiet()
        self._background: set[asyncio.Task[None]] = set()
        self._on_load = on_load
        self._lost_workers: dict[str, list[str]] = {}
        self.gpu_health = GpuHealth()
        """Each model's GPU failures, and whether it fell back to the CPU."""
        self._waiting_here = 0
        """Requests waiting in the daemon for a permit, over all models."""
        self.on_request_done: Callable[[LoadedModel, GenerationResult], None] | None = None
        """Told of every finished request (the speed book learns from them)."""
        self.cpu_budget = CpuBudget(
            settings.num_threads or cpu.default_threads(),
            sorted(allowed_cpus()),
            pin=settings.cpu_affinity,
        )
        """Shares the cores among the runners working at the same time."""
        self.spares = SparePool(settings.log_dir, settings.spare_runner, self.quiet)
        """The runner process started ahead of need (after the first load, once quiet)."""
        self.closed = False

    # -- queries ------------------------------------------------------------------------

    @property
    def queued(self) -> int:
        """Requests waiting for a slot, over all models: in the daemon and in the runners'
        queues (what ``max_queue`` bounds)."""
        return self._waiting_here + runner_queue(self._models.values())

    @property
    def working(self) -> bool:
        """Whether a model is loading or a request is being served or waits (what the speed
        probe gives way to)."""
        return (
            bool(self._loading)
            or self._waiting_here > 0
            or any(m.busy() for m in self._models.values())
        )

    async def quiet(self, settle: float = 0.0) -> None:
        """Return once nothing loads and no request is served or waits, and none arrived for
        ``settle`` seconds: a client that sends its next request right after the last (a
        ``/tokenize`` then the generation) finds the daemon quiet only for a moment."""
        while True:
            async with self._changed:
                await self._changed.wait_for(lambda: not self.working)
            if settle <= 0:
                return
            arrivals = self._arrivals
            await asyncio.sleep(settle)
            if not self.working and self._arrivals == arrivals:
                return

    def loaded(self) -> list[LoadedModel]:
        """Models loaded now (dead runners left out), most recently used first."""
        models = [m for m in self._models.values() if m.alive()]
        return sorted(models, key=lambda m: m.last_used, reverse=True)

    def get(self, key: str) -> LoadedModel | None:
        """The loaded model called ``key`` (full name), if any."""
        loaded = self._models.get(key)
        return loaded if loaded is not None and loaded.alive() else None

    async def stats(self, loaded: LoadedModel, timeout: float = 2.0) -> Stats | None:
        """The runner's gauges, or None when it does not answer in time."""
        try:
            return await asyncio.wait_for(loaded.runner.stats(), timeout)
        except Exception:
            return None

    # -- acquiring -------------------------------------------------------------------------

    async def acquire(
        self, model: LocalModel, config: RunnerConfig, keep_alive: float | None = None
    ) -> Lease:
        """A slot on ``model`` loaded with ``config``; loads or reloads it when needed.

        Raises QueueFullError when no slot is free and the wait queue is full, RunnerStartError
        when the model cannot be loaded.
        """
        if self.closed:
            raise RuntimeError("the daemon is shutting down")
        self._arrivals += 1
        key = model.name.full
        existing = self._models.get(key)
        if existing is not None and not existing.alive():
            self._note_crash(existing.config, getattr(existing.runner, "returncode", None))
            self._note_gpu_failure(existing)
        config = self.gpu_health.follow(key, await self._follow_cpu_paths(config))
        load_seconds = 0.0
        while True:
            # Returned reserved (counted in ``pending``), so keep_alive cannot unload it in
            # the moment between its load and this request taking a slot.
            loaded, spent = await self._ensure_loaded(key, model, config, keep_alive)
            load_seconds += spent
            self._cancel_expiry(loaded)
            loaded.update_idle()
            try:
                # With every slot taken it waits, in the runner's queue or here.
                full = loaded.share.handed >= loaded.config.n_slots
                if full and self.queued >= self.settings.max_queue:
                    raise QueueFullError()
                if loaded.slots.locked():
                    self._waiting_here += 1
                    try:
                        await loaded.slots.acquire()
                    finally:
                        self._waiting_here -= 1
                else:
                    await loaded.slots.acquire()
            except BaseException:
                loaded.pending -= 1
                loaded.update_idle()
                self._after_idle(loaded)
                raise
            loaded.pending -= 1
            if loaded.alive() and self._models.get(key) is loaded:
                loaded.handed += 1
                loaded.update_idle()
                if loaded.handed == 1:
                    self._share_cores()
                return Lease(self, loaded, load_seconds)
            # The runner died or was replaced while this request waited: try again.
            loaded.slots.release()
            loaded.update_idle()

    def _release(self, loaded: LoadedModel, keep_alive: float | None) -> None:
        loaded.handed -= 1
        if loaded.handed == 0:
            self._share_cores()
        loaded.slots.release()
        loaded.last_used = time.time()
        if keep_alive is not None:
            loaded.keep_alive = keep_alive
        loaded.update_idle()
        self._after_idle(loaded)

    def _share_cores(self) -> None:
        """Tell the working runners their share of the cores (see
        :mod:`localllm.daemon.devices.cpubudget`)."""
        self.cpu_budget.working(working_runners(self._models.values()))

    def _after_idle(self, loaded: LoadedModel) -> None:
        self._spawn(self._notify())
        if loaded.busy() or loaded.closing:
            return
        if not loaded.alive() or loaded.keep_alive == 0:
            self._begin_unload(loaded)
        elif loaded.keep_alive > 0:
            self._cancel_expiry(loaded)
            loop = asyncio.get_running_loop()
            loaded.expiry = loop.call_later(loaded.keep_alive, self._expire, loaded)

    def _expire(self, loaded: LoadedModel) -> None:
        loaded.expiry = None
        if not loaded.busy() and not loaded.closing:
            log.info("unloading %s: keep_alive expired", loaded.name)
            self._begin_unload(loaded)

    @staticmethod
    def _cancel_expiry(loaded: LoadedModel) -> None:
        if loaded.expiry is not None:
            loaded.expiry.cancel()
            loaded.expiry = None

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- llama.cpp's CPU paths ---------------------------------------------------------

    def _threads(self, config: RunnerConfig) -> int:
        return config.n_threads or self.settings.num_threads or cpu.default_threads()

    def probe_cpu(self, threads: int = 0) -> asyncio.Future[cpu.CpuPaths]:
        """Start deciding llama.cpp's CPU paths for ``threads`` (0: the default) unless that
        is decided or under way: once per thread count. Its warning is logged once."""
        threads = threads or self.settings.num_threads or cpu.default_threads()
        task = self._cpu_paths.get(threads)
        if task is None:
            task = asyncio.get_running_loop().create_task(
                asyncio.to_thread(self._cpu_decider, self.settings, threads)
            )
            task.add_done_callback(self._announce_cpu_paths)
            self._cpu_paths[threads] = task
        return task

    async def cpu_paths(self, threads: int = 0) -> cpu.CpuPaths:
        """The CPU probe's decision for ``threads`` (see :meth:`probe_cpu`)."""
        return await asyncio.shield(self.probe_cpu(threads))

    @staticmethod
    def _announce_cpu_paths(task: asyncio.Future[cpu.CpuPaths]) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        paths = task.result()
        if paths.warning:
            log.warning("%s", paths.warning)
        elif paths.error:
            log.error("%s", paths.error)
        else:
            log.info(
                "llama.cpp's CPU paths: repacking %s (%s)",
                "on" if paths.repack else "off",
                paths.reason,
            )

    async def _follow_cpu_paths(self, config: RunnerConfig) -> RunnerConfig:
        paths = await self.cpu_paths(self._threads(config))
        if paths.error:
            raise RunnerStartError(paths.error)
        return dataclasses.replace(config, cpu_repack=paths.repack)

    def _note_crash(self, config: RunnerConfig, returncode: int | None) -> bool:
        """A runner loaded with ``config`` ended with ``returncode``: when it was a native fault
        with repacking on, repacking goes off for later loads. True when it did."""
        threads = self._threads(config)
        task = self._cpu_paths.get(threads)
        if not config.cpu_repack or returncode is None or task is None or not task.done():
            return False
        if task.cancelled() or task.exception() is not None:
            return False
        before = task.result()
        after = cpu.record_crash(before, returncode)
        if after is before:
            return False
        decided: asyncio.Future[cpu.CpuPaths] = asyncio.get_running_loop().create_future()
        decided.set_result(after)
        self._cpu_paths[threads] = decided
        log.warning("%s", after.warning)
        return True

    # -- loading and unloading ---------------------------------------------------------

    def _lock(self, key: str) -> asyncio.Lock:
        return self._locks.setdefault(key, asyncio.Lock())

    async def _ensure_loaded(
        self, key: str, model: LocalModel, config: RunnerConfig, keep_alive: float | None
    ) -> tuple[LoadedModel, float]:
        async with self._lock(key):
            loading = self._loading.get(key)
            if loading is not None:
                # A load started by a request whose client went away: let it finish.
                with contextlib.suppress(Exception):
                    await asyncio.shield(loading)
            existing = self._models.get(key)
            if existing is not None and existing.alive() and existing.config == config:
                existing.pending += 1  # reserved for the caller
                return existing, 0.0
            if existing is not None:
                if existing.alive():
                    log.info("reloading %s with new options", existing.name)
                    await existing.idle.wait()
                else:
                    log.warning("runner for %s is gone; starting it again", existing.name)
                await self._unload(existing)
            started = time.monotonic()
            # A load of the same base with the same options under way: wait, then join it.
            while same := [
                t for k, t in self._loading.items() if self._loads[k] == config and not t.done()
            ]:
                with contextlib.suppress(Exception):
                    await asyncio.shield(same[0])
            host = runner_for(self._models.values(), key, config)
            if host is not None:
                return await self._join(key, model, host, keep_alive), time.monotonic() - started
            config = self._allow_lost_workers(key, config)
            # The load runs as its own task, shielded from the request: a client that
            # disconnects mid-load must not leave a runner process that nobody owns.
            task = asyncio.get_running_loop().create_task(
                self._load(key, model, config, keep_alive)
            )
            self._loading[key], self._loads[key] = task, config
            task.add_done_callback(lambda _: self._loading.pop(key, None))
            try:
                loaded = await asyncio.shield(task)
            except asyncio.CancelledError:
                # The caller left; the load goes on and its reservation is given back then.
                task.add_done_callback(self._unreserve)
                raise
            return loaded, time.monotonic() - started

    async def _join(
        self, key: str, model: LocalModel, host: LoadedModel, keep_alive: float | None
    ) -> LoadedModel:
        """Serve ``model`` from ``host``'s runner: its adapters loaded there, nothing else
        (no memory plan, no room to make: the base is in memory already)."""
        await host.share.load_adapters(model)
        keep = self.default_keep_alive(model) if keep_alive is None else keep_alive
        loaded = LoadedModel(key, model, host.config, host.runner, 0.0, keep, share=host.share)
        log.info("%s shares the runner of %s (pid %s)", loaded.name, host.name, loaded.pid)
        return self._register(loaded)

    def _unreserve(self, task: asyncio.Task[LoadedModel]) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        loaded = task.result()
        loaded.pending -= 1
        loaded.update_idle()
        self._after_idle(loaded)

    async def _load(
        self, key: str, model: LocalModel, config: RunnerConfig, keep_alive: float | None
    ) -> LoadedModel:
        await self._make_room(key)
        started = time.monotonic()
        async with self._load_gate:
            loaded = await self._start_fitting(key, model, config, keep_alive)
        try:
            await loaded.share.load_adapters(model)
        except BaseException:
            await self._stop(loaded)
            raise
        loaded.load_seconds = time.monotonic() - started
        if self.closed:
            await self._stop(loaded)
            raise RuntimeError("the daemon is shutting down")
        log.info("loaded %s in %.2fs (runner pid %s)", loaded.name, loaded.load_seconds, loaded.pid)
        plan = loaded.plan
        if plan is not None:
            log.info(
                "%s: %d slots x %d tokens, %d of %d layers offloaded, %d MiB (%s)",
                loaded.name,
                plan.n_slots,
                plan.n_ctx_per_slot,
                plan.n_gpu_layers,
                plan.n_layer + 1,
                plan.size >> 20,
                plan.processor(),
            )
            for warning in plan.warnings:
                log.warning("%s: %s", loaded.name, warning)
        return self._register(loaded)

    def _register(self, loaded: LoadedModel) -> LoadedModel:
        """A model just loaded (or joined to a runner) into the table, reserved for the
        request that asked for it; its keep_alive applies even if that client went away."""
        self._models[loaded.key] = loaded
        loaded.pending += 1
        loaded.update_idle()
        if self._on_load is not None:
            self._on_load(loaded)
        if loaded.keep_alive > 0:
            loop = asyncio.get_running_loop()
            loaded.expiry = loop.call_later(loaded.keep_alive, self._expire, loaded)
        return loaded

    def _runner_log(self, model: LocalModel) -> Path:
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", model.name.short)
        return self.settings.log_dir / f"runner-{safe}.log"

    async def _start_process(self, model: LocalModel, config: RunnerConfig) -> Runner:
        log.info("loading %s (%s)", model.name.short, config)
        sock = self.settings.runtime_socket(f"runner-{secrets.token_hex(6)}.sock")
        return await ProcessRunner.start(config, sock, self._runner_log(model), spares=self.spares)

    async def plan(self, model: LocalModel, config: RunnerConfig) -> dict[str, Any]:
        """The memory plan of ``model`` under ``config`` on this machine now, without loading
        it: ``{"loaded": True, "plan": ...}`` for the runner serving it so, else what a runner
        would plan (``{"loaded": False, "plan": ...}``) or why it cannot fit
        (``{"loaded": False, "nofit": ..., "refusal": "..."}``)."""
        config = await self._follow_cpu_paths(config)
        loaded = self.get(model.name.full)
        if loaded is not None and loaded.config == config and loaded.plan is not None:
            return {"loaded": True, "plan": loaded.plan.to_dict()}
        # Loaded with other options, the model's own memory is not counted as free: the plan
        # is what a load next to everything loaded now would get.
        reserved, mapped = self.reservations(model.name.full)
        started = dataclasses.replace(
            config, memory_plan=True, memory_reserved=reserved, mapped_ram=mapped
        )
        answer = await plan_only(started, self._runner_log(model))
        if "nofit" in answer:
            report = NoFitReport.from_dict(answer["nofit"])
            return {**answer, "loaded": False, "refusal": refusal(model.name.short, report)}
        return {**answer, "loaded": False}

    async def _start(
        self, key: str, model: LocalModel, config: RunnerConfig, keep_alive: float | None
    ) -> LoadedModel:
        started = config
        if config.memory_plan:
            reserved, mapped = self.reservations(key)
            started = dataclasses.replace(config, memory_reserved=reserved, mapped_ram=mapped)
        runner = await self._runner_factory(model, started)
        return LoadedModel(
            key=key,
            model=model,
            config=config,
            runner=runner,
            load_seconds=0.0,
            keep_alive=self.default_keep_alive(model) if keep_alive is None else keep_alive,
        )

    def default_keep_alive(self, model: LocalModel) -> float:
        """The model's ``PARAMETER keep_alive`` when it has a valid one, else the setting."""
        value = model.parameters.get("keep_alive")
        if value is not None and not isinstance(value, bool):
            try:
                return parse_duration(value)
            except SettingsError:
                log.warning("%s: ignoring its keep_alive parameter %r", model.name.short, value)
        return self.settings.keep_alive

    def reservations(self, key: str) -> tuple[dict[str, int], int]:
        """What loaded models may still grow into (their plan less what they hold), and their
        mapped weights, which MemAvailable counts as free cache."""
        from .memory.system import process_memory

        growth, mapped = 0, 0
        for other in self._models.values():
            plan = other.plan
            if other.key == key or not other.alive() or plan is None or other.pid is None:
                continue
            if other.share.owner is not other:
                continue  # a runner is counted once, under the model that loaded it
            held = process_memory(other.pid)
            growth += max(plan.host_bytes - (held.rss if held else 0), 0)
            mapped += held.rss_file if held else 0
        # GPU buffers are allocated whole at load: the devices' free memory already counts them.
        return ({HOST: growth} if growth else {}), mapped

    async def _start_fitting(
        self, key: str, model: LocalModel, config: RunnerConfig, keep_alive: float | None
    ) -> LoadedModel:
        """Start the runner; when its plan finds no room, unload idle models (least recently
        used first), wait for busy ones that would make room, or refuse."""
        while True:
            try:
                return await self._start(key, model, config, keep_alive)
            except DoesNotFitError as exc:
                report = NoFitReport.from_dict(exc.report)
            except RunnerStartError as exc:
                if exc.gpu_failure is not None and not config.cpu_only:
                    self.gpu_health.failed(key, exc.gpu_failure, loading=True)
                    config = self.gpu_health.follow(key, config)
                    log.warning("loading %s again on the CPU", model.name.short)
                    continue
                if not self._note_crash(config, exc.returncode):
                    raise
                log.warning("loading %s again without weight repacking", model.name.short)
                config = await self._follow_cpu_paths(config)
                continue
            others = [
                m
                for k, m in self._models.items()
                if k != key and m.alive() and m.share.owner is m  # each runner once
            ]
            idle = [m for m in others if not m.share.busy() and not m.share.pinned()]
            if idle:
                victim = min(idle, key=lambda m: max(x.last_used for x in m.share.members))
                log.info("unloading %s to make room for %s", victim.name, model.name.short)
                await self._unload_runner(victim)
                continue
            busy = [m for m in others if m.share.busy() and not m.share.pinned()]
            if busy and _would_make_room(report, busy):
                log.info(
                    "%s waits for %s to finish to make room",
                    model.name.short,
                    ", ".join(m.name for m in busy),
                )
                async with self._changed:
                    await self._changed.wait_for(lambda waiting=busy: _any_idle(waiting))
                continue
            message = refusal(model.name.short, report)
            pinned = [m.name for m in self._models.values() if m.key != key and m.pinned]
            if pinned:
                message += f" (kept loaded with a negative keep_alive: {', '.join(pinned)})"
            log.warning("refusing to load %s: %s", model.name.short, message)
            raise InsufficientMemoryError(message) from None

    async def _make_room(self, key: str) -> None:
        limit = self.settings.max_loaded_models
        async with self._changed:
            while True:
                # Runners count, not models: the models on one runner share its memory.
                others = [m for k, m in self._models.items() if k != key and m.share.owner is m]
                if len(others) < limit:
                    return
                idle = [m for m in others if not m.share.busy()]
                if idle:
                    victim = min(idle, key=lambda m: max(x.last_used for x in m.share.members))
                    log.info("unloading %s to make room (max %d loaded)", victim.name, limit)
                    await self._unload_runner(victim)
                    continue
                await self._changed.wait()

    def _note_lost_workers(self, loaded: LoadedModel) -> None:
        """Remember the RPC workers that took a model's runner down (llama.cpp ends a runner
        whose worker connection fails): its next load may go on without them."""
        lost = getattr(loaded.runner, "lost_workers", None)
        if lost and not loaded.runner.alive():
            self._lost_workers[loaded.key] = list(lost)

    def _note_gpu_failure(self, loaded: LoadedModel) -> None:
        """Count it when the GPU is why ``loaded``'s runner ended
        (:mod:`localllm.daemon.devices.gpuhealth`)."""
        failure = getattr(loaded.runner, "gpu_failure", None)
        if failure is not None and not loaded.runner.alive():
            self.gpu_health.failed(loaded.key, failure(), runner=loaded.pid)

    def _allow_lost_workers(self, key: str, config: RunnerConfig) -> RunnerConfig:
        """``config`` allowed to go on without the workers that took the model's previous
        runner down (a field outside the config's identity: it is still the same load)."""
        lost = [w for w in self._lost_workers.pop(key, ()) if w in config.rpc_workers]
        return dataclasses.replace(config, rpc_lost=lost) if lost else config

    def _detach(self, loaded: LoadedModel) -> None:
        # Out of the table now, so /api/ps stops listing it at once.
        loaded.closing = True
        self._cancel_expiry(loaded)
        self._note_lost_workers(loaded)
        self._note_gpu_failure(loaded)
        if self._models.get(loaded.key) is loaded:
            del self._models[loaded.key]

    def _begin_unload(self, loaded: LoadedModel) -> None:
        self._detach(loaded)
        self._spawn(self._stop(loaded))  # in the background: stopping takes a moment

    async def _unload(self, loaded: LoadedModel) -> None:
        self._detach(loaded)
        # Shielded: once out of the table, nobody else would stop this runner.
        await asyncio.shield(self._stop(loaded))

    async def _unload_runner(self, loaded: LoadedModel) -> None:
        """Unload every model on ``loaded``'s runner (which then stops)."""
        for member in list(loaded.share.members):
            await self._unload(member)

    async def _stop(self, loaded: LoadedModel) -> None:
        share = loaded.share
        if loaded in share.members:
            share.members.remove(loaded)
        if share.live():
            # Other models still use the runner: only this name is gone.
            log.info("unloaded %s (its runner goes on for %s)", loaded.name, share.live()[0].name)
            self._spawn(self._notify())
            return
        with contextlib.suppress(Exception):
            await loaded.runner.close()
        log.info("unloaded %s", loaded.name)
        # Not awaited: _make_room unloads while holding the condition's lock.
        self._spawn(self._notify())

    async def unload(self, key: str) -> bool:
        """Unload ``key`` now if idle, else as soon as its requests finish. True if loaded."""
        loaded = self._models.get(key)
        if loaded is None:
            return False
        loaded.keep_alive = 0
        if not loaded.busy():
            await self._unload(loaded)
        return True

    def set_keep_alive(self, key: str, keep_alive: float) -> None:
        """Change when an idle loaded model unloads (a load request's keep_alive)."""
        loaded = self._models.get(key)
        if loaded is None:
            return
        loaded.keep_alive = keep_alive
        self._after_idle(loaded)

    async def close(self) -> None:
        """Stop every runner (daemon shutdown)."""
        self.closed = True
        await self.spares.close()
        if self._loading:
            # Loads in progress stop their runner themselves once they see `closed`.
            await asyncio.wait(list(self._loading.values()), timeout=30)
        models = list(self._models.values())
        self._models.clear()
        for loaded in models:
            loaded.closing = True
            self._cancel_expiry(loaded)
        await asyncio.gather(*(self._stop(m) for m in models), return_exceptions=True)
        await self.cpu_budget.close()
        for task in list(self._background):
            with contextlib.suppress(BaseException):
                await task
