"""Where llama.cpp's CPU workers wake up: kept off the engine thread's CPU for a prompt's step.

Why it exists: llama.cpp's CPU backend (built with OpenMP, as pip builds it) computes a graph
with the calling thread (the engine's) and a team of OpenMP workers that sleep once a decode
has been over for a few milliseconds. A request's first step after a quiet moment wakes them,
and the kernel may put a woken worker on the CPU of the thread that woke it, busy with the
engine thread, while another CPU sits idle: where it finds no idle CPU it may take (a VM's
vCPUs often look busy to it, and past a certain load it stops looking), it keeps the wakee
near the waker. The two then take turns on one CPU (the team meets at a barrier after every
operation) until the kernel's balancing moves one, which took 10-25 ms on the 2-core VM this
was measured on: a scheduler trace (``perf record -e sched:sched_switch,sched:sched_wakeup``)
of a one-turn chat's prefill found the other CPU idle for 4-24 ms in 13 of 37 prefills of a
~65 ms step, llama-server's 7 of 27 likewise. It happens most when the daemon's own Python
runs on the other CPU at that moment (its answer to the runner's acceptance does).

:meth:`WorkerSpread.apart` lets the process's other native threads (OpenMP's workers: every
thread that is not a Python thread) run anywhere but the CPU the engine thread is on, for one
decode, and gives them the engine thread's own CPUs back after it. The trace with it: no
prefill with an idle CPU in 36. Decode steps are left alone: between two of them the workers
spin rather than sleep, so they are still where they ran.

Two ``sched_setaffinity`` calls per worker and a look at ``/proc/self/task`` per batch step
(tens of microseconds). Where the system cannot (no per-thread affinity, no ``sched_getcpu``,
one CPU allowed) it does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Callable, Iterator

__all__ = ["WorkerSpread", "native_threads"]

_TASKS = "/proc/self/task"


def native_threads() -> list[int]:
    """The ids of this process's threads that are not Python threads (OpenMP's workers, a
    BLAS library's, a driver's); empty where ``/proc/self/task`` cannot be read."""
    try:
        tasks = [int(name) for name in os.listdir(_TASKS)]
    except (OSError, ValueError):
        return []
    python = {thread.native_id for thread in threading.enumerate()}
    return [task for task in tasks if task not in python]


def _current_cpu_reader() -> Callable[[], int] | None:
    """libc's ``sched_getcpu`` (the CPU the calling thread runs on), or None without one."""
    try:
        # the process's own symbols, libc's among them (``find_library`` would run ldconfig
        # at every model load)
        getcpu = ctypes.CDLL(None).sched_getcpu
    except (OSError, AttributeError, TypeError):  # TypeError: no CDLL(None) on Windows
        return None
    getcpu.restype = ctypes.c_int
    getcpu.argtypes = []
    return getcpu


class WorkerSpread:
    """Keeps the process's native threads off the engine thread's CPU during a step (see the
    module's docstring). ``tasks`` lists the threads to move and ``current_cpu`` reads the
    calling thread's CPU (both injectable for tests); ``moved`` counts the steps it acted on."""

    def __init__(
        self,
        tasks: Callable[[], list[int]] = native_threads,
        current_cpu: Callable[[], int] | None = None,
    ) -> None:
        self._tasks = tasks
        self._current_cpu = current_cpu if current_cpu is not None else _current_cpu_reader()
        self.available = self._current_cpu is not None and hasattr(os, "sched_setaffinity")
        """Whether this system lets it act at all."""
        self.moved = 0

    @contextlib.contextmanager
    def apart(self, threads: int) -> Iterator[None]:
        """For the block (one decode with ``threads`` threads, called on the engine thread):
        the native threads run anywhere the engine thread may but on its current CPU; after
        it, on the engine thread's CPUs again. Nothing is done for one thread or one CPU."""
        moved = self._move() if threads > 1 and self.available else None
        try:
            yield
        finally:
            if moved:
                self._give_back(moved)

    def _move(self) -> list[int] | None:
        assert self._current_cpu is not None
        allowed = os.sched_getaffinity(0)
        cpu = self._current_cpu()
        others = allowed - {cpu}
        if cpu < 0 or cpu not in allowed or not others:
            return None
        moved = []
        for task in self._tasks():
            try:
                os.sched_setaffinity(task, others)
            except OSError:  # it ended meanwhile, or may not run there
                continue
            moved.append(task)
        if moved:
            self.moved += 1
        return moved

    def _give_back(self, moved: list[int]) -> None:
        # The engine thread's CPUs now, not before: the runner may have been given other
        # CPUs meanwhile (its pin_process sets every thread, the engine's included).
        allowed = os.sched_getaffinity(0)
        for task in moved:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(task, allowed)
