"""The GPU's failures per model, and the CPU fallback they lead to.

A runner whose GPU fails (a fatal decode status, a lost device, an out-of-memory abort: see
:mod:`localllm.daemon.devices.faults`) ends the requests it held with the GPU's error, and the
model loads
again on the GPU for the next request: most failures pass (a driver reset, another program
that held the memory). When the GPU fails the same model again within :data:`WINDOW_S`, or a
load itself dies of it, the device is taken to be unusable: the model loads on the CPU, with
every GPU hidden from its runner, until the daemon restarts. ``/api/ps`` and ``localllm ps``
say so (``gpu_fallback``), and the daemon's log says when and why.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

from ..runner.protocol import RunnerConfig

__all__ = ["FAILURES_BEFORE_CPU", "WINDOW_S", "GpuHealth"]

FAILURES_BEFORE_CPU = 2
"""GPU failures of one model, within :data:`WINDOW_S`, after which it runs on the CPU."""
WINDOW_S = 600.0
"""How long a GPU failure counts against the device."""

log = logging.getLogger("localllm.gpuhealth")


class GpuHealth:
    """Counts each model's GPU failures and decides when it falls back to the CPU."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._failures: dict[str, list[float]] = {}
        self._fallbacks: dict[str, str] = {}
        self._counted: set[int] = set()

    def failed(
        self, key: str, why: str | None, loading: bool = False, runner: int | None = None
    ) -> None:
        """The GPU failed ``key``'s runner (``why``: the GPU's own words; None: it did not
        fail, nothing to note); ``loading`` when it failed the load itself. ``runner`` (its
        process id) counts each runner's failure once, however often it is looked at."""
        if why is None or runner in self._counted:
            return
        if runner is not None:
            self._counted.add(runner)
        now = self._clock()
        recent = [t for t in self._failures.get(key, []) if now - t < WINDOW_S] + [now]
        self._failures[key] = recent
        log.warning("%s: the GPU failed%s: %s", key, " while loading" if loading else "", why)
        if key in self._fallbacks or (len(recent) < FAILURES_BEFORE_CPU and not loading):
            return
        times = f"{len(recent)} times in {WINDOW_S / 60:.0f} minutes" if len(recent) > 1 else ""
        self._fallbacks[key] = (
            f"the GPU failed {'while loading' if loading else times} (last: {why}): "
            "runs on the CPU until the daemon restarts"
        )
        log.warning("%s %s", key, self._fallbacks[key])

    def fallback(self, key: str) -> str | None:
        """Why ``key`` runs on the CPU instead of its GPU; None while the GPU serves it."""
        return self._fallbacks.get(key)

    def follow(self, key: str, config: RunnerConfig) -> RunnerConfig:
        """``config`` as ``key`` is loaded now: on the CPU alone after its GPU gave up."""
        if key not in self._fallbacks or config.cpu_only:
            return config
        return dataclasses.replace(config, n_gpu_layers=0, cpu_only=True)
