"""The CPU budget across runners: the daemon shares the cores among the models working now.

Each runner's governor (:mod:`localllm.daemon.devices.governor`) keeps its own thread count at what
the machine
gives it, but two runners that each start with every core make the contention they would then
measure: their OpenMP teams spin at barriers waiting for threads the other runner's team
holds (two models decoding at once on 2 cores ran at 0.40 of one alone). So the daemon, which
knows which runners are working, gives each a share of the cores while several work at once
and all of them back to the one left alone. Work is any request a runner holds (generation,
prefill, embeddings), from the moment the scheduler hands it over until it ends.

Shares are whole threads: the cores divided evenly, the first runners to start working taking
the remainder, never fewer than one. With ``pin`` the shares also get disjoint CPUs (a
runner's threads then never wait for a CPU the other runner's team is spinning on); a runner
alone gets every CPU back. When there are more working runners than cores, each gets one
thread and no CPUs of its own.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["CpuBudget", "Share", "shares"]

log = logging.getLogger("localllm.cpubudget")


class _Threaded(Protocol):
    async def set_threads(
        self, threads: int, reason: str, cpus: list[int] | None = None
    ) -> Any: ...


@dataclass(frozen=True)
class Share:
    """One working runner's part of the cores."""

    threads: int
    reason: str
    cpus: tuple[int, ...] | None
    """The CPUs its threads may run on (None: every CPU the daemon may use)."""


def shares(names: Sequence[str], cores: int, cpus: Sequence[int], pin: bool) -> list[Share]:
    """The shares of ``cores`` threads (and of ``cpus`` with ``pin``) for the runners called
    ``names``, in the order they started working."""
    count = len(names)
    if count == 0:
        return []
    if count == 1:
        return [Share(threads=cores, reason="working alone", cpus=None)]
    base, extra = divmod(cores, count)
    threads = [max(1, base + (1 if i < extra else 0)) for i in range(count)]
    result = []
    offset = 0
    whole = base >= 1 and pin and len(cpus) >= cores
    per_thread = len(cpus) // cores if whole else 0
    for i, name in enumerate(names):
        others = [other for other in names if other != name]
        shown = ", ".join(others[:2]) + (f" and {len(others) - 2} more" if len(others) > 2 else "")
        reason = f"sharing {cores} cores with {shown}"
        own: tuple[int, ...] | None = None
        if whole:
            width = threads[i] * per_thread
            own = tuple(cpus[offset : offset + width])
            offset += width
        result.append(Share(threads=threads[i], reason=reason, cpus=own))
    return result


class CpuBudget:
    """Keeps each working runner told its share; the scheduler calls :meth:`working`
    whenever a model starts or stops working."""

    def __init__(self, cores: int, cpus: Sequence[int], *, pin: bool = True) -> None:
        self.cores = max(1, cores)
        """Threads shared out: the daemon's thread count (physical cores by default)."""
        self.cpus = list(cpus)
        self.pin = pin
        self._order: list[str] = []
        self._sent: dict[str, Share] = {}
        self._told: dict[str, tuple[weakref.ref[Any], Share]] = {}
        """The share each runner was last told (it keeps it while idle), by model name."""
        self._tasks: set[asyncio.Task[None]] = set()

    def working(self, runners: dict[str, _Threaded]) -> None:
        """The runners working now, by model name; tells those whose share changed."""
        self._order = [name for name in self._order if name in runners]
        self._order += [name for name in runners if name not in self._order]
        for name in list(self._sent):
            if name not in runners:
                del self._sent[name]
        for name, told in list(self._told.items()):
            if told[0]() is None:
                del self._told[name]  # that runner is gone
        for name, share in zip(
            self._order, shares(self._order, self.cores, self.cpus, self.pin), strict=True
        ):
            self._sent[name] = share
            # Idle, a runner keeps the share it was last told: one that works again with the
            # same share is not told again (a message and its answer at the start of every
            # request of a model working alone, beside the request's own hand-over and
            # prefill, on the cores that the prefill needs).
            runner = runners[name]
            told = self._told.get(name)
            if told is not None and told[0]() is runner and told[1] == share:
                continue
            self._told[name] = (weakref.ref(runner), share)
            task = asyncio.create_task(self._tell(name, runner, share))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def share(self, name: str) -> Share | None:
        """The share last given to a working runner."""
        return self._sent.get(name)

    @staticmethod
    async def _tell(name: str, runner: _Threaded, share: Share) -> None:
        cpus = list(share.cpus) if share.cpus is not None else None
        try:
            await runner.set_threads(share.threads, share.reason, cpus)
        except Exception as exc:  # a runner that died is noticed by its requests
            log.debug("could not give %s its share of the cores: %s", name, exc)
        else:
            log.info("%s: %d threads (%s)", name, share.threads, share.reason)

    async def close(self) -> None:
        """Wait for the messages still on their way."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
