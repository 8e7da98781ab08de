"""What the kernel says about the CPUs: the CPUs this process may run on, their busy time from
``/proc/stat``, the cores other processes use now, and pinning a process's threads.

The governor, the speed probe's quiet-moment watch, the scheduler and ``doctor`` read the machine
through these functions; each returns None (or a fallback) where the system has no such file.
Two views of "this process": :func:`read_cpu` counts the calling process alone (a runner's
governor: the daemon's quantizing child beside it is load it must share the cores with), and
:func:`read_cpu_tree` counts it with every process it started (the daemon's quiet-moment watch:
its own create, pull and quantize children are not other programs).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import NamedTuple

__all__ = [
    "CpuReading",
    "allowed_cpus",
    "busy_seconds",
    "others_now",
    "pin_process",
    "read_cpu",
    "read_cpu_tree",
    "tree_seconds",
]


class CpuReading(NamedTuple):
    """CPU time counters at one moment, in seconds: ``at`` on the monotonic clock, ``busy``
    spent busy on the CPUs this process may use by everything (steal included), ``own`` used
    by this process."""

    at: float
    busy: float
    own: float


def allowed_cpus() -> frozenset[int]:
    """The CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return frozenset(os.sched_getaffinity(0))
    return frozenset(range(os.cpu_count() or 1))


_TICK = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)


def busy_seconds(lines: Iterable[str], cpus: frozenset[int]) -> float | None:
    """CPU time spent busy on ``cpus`` according to ``/proc/stat``'s per-CPU lines: user,
    nice, system, irq, softirq and steal (guest time is inside user); None when no line
    names one of them."""
    total = 0
    seen = False
    for line in lines:
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        name, _, rest = line.partition(" ")
        try:
            index = int(name[3:])
        except ValueError:
            continue
        if index not in cpus:
            continue
        values = [int(v) for v in rest.split()]
        if len(values) < 4:
            continue
        seen = True
        # user nice system idle iowait irq softirq steal ...
        total += values[0] + values[1] + values[2] + sum(values[5:8])
    return total * _TICK if seen else None


_STAT = "/proc/stat"
# /proc/stat kept open: a reading is one pread at offset 0 (the kernel writes the file anew for
# each read from its start). A runner reads it before a prompt's first step, where opening it
# and reading it as text took 120-140 us on a cold cache against about 30 us.
_stat_fd: int | None = None


def _stat_lines() -> list[str]:
    """The per-CPU lines of ``/proc/stat`` (those before ``intr``), read now."""
    global _stat_fd
    if _stat_fd is None:
        _stat_fd = os.open(_STAT, os.O_RDONLY)
    size = 8192
    while True:
        try:
            data = os.pread(_stat_fd, size, 0)
        except OSError:
            os.close(_stat_fd)  # whatever went wrong, the next reading opens it again
            _stat_fd = None
            raise
        if len(data) < size or b"\nintr " in data:
            return data.split(b"\nintr ", 1)[0].decode("ascii", "replace").splitlines()
        size *= 2


def read_cpu(cpus: frozenset[int], path: str = _STAT) -> CpuReading | None:
    """The counters now, or None where ``/proc/stat`` cannot be read (not Linux)."""
    try:
        if path == _STAT:
            busy = busy_seconds(_stat_lines(), cpus)
        else:
            with open(path) as stat:
                busy = busy_seconds(stat, cpus)
    except OSError:
        return None
    if busy is None:
        return None
    return CpuReading(at=time.monotonic(), busy=busy, own=time.process_time())


_LOADAVG = "/proc/loadavg"
_loadavg_fd: int | None = None


def runnable_now() -> int | None:
    """Threads runnable on the whole machine at this moment, the caller included (the fourth
    field of ``/proc/loadavg``, ``runnable/total``); None where it cannot be read."""
    global _loadavg_fd
    try:
        if _loadavg_fd is None:
            _loadavg_fd = os.open(_LOADAVG, os.O_RDONLY)
        fields = os.pread(_loadavg_fd, 256, 0).split()
        return int(fields[3].split(b"/")[0])
    except (OSError, IndexError, ValueError):
        return None


def _children(pid: int, proc: str) -> list[int]:
    """The live children of ``pid``: from each thread's ``children`` file (Linux 3.5+), else
    by scanning every process's parent."""
    tasks = f"{proc}/{pid}/task"
    found: list[int] = []
    if os.path.exists(f"{tasks}/{pid}/children"):
        try:
            threads = os.listdir(tasks)
        except OSError:  # it ended
            return found
        for task in threads:
            try:
                with open(f"{tasks}/{task}/children") as listing:
                    found.extend(int(child) for child in listing.read().split())
            except (OSError, ValueError):  # a thread that just ended
                continue
        return found
    try:
        entries = [entry for entry in os.listdir(proc) if entry.isdigit()]
    except OSError:
        return found
    for entry in entries:
        fields = _stat_fields(int(entry), proc)
        if fields is not None and fields[1] == str(pid):
            found.append(int(entry))
    return found


def _stat_fields(pid: int, proc: str) -> list[str] | None:
    """``/proc/<pid>/stat``'s fields from the state on (the name, in parentheses, may hold
    spaces and parentheses itself: split after its last one); None when it is gone."""
    try:
        with open(f"{proc}/{pid}/stat") as stat:
            text = stat.read()
    except OSError:
        return None
    _, _, rest = text.rpartition(")")
    fields = rest.split()
    return fields if len(fields) > 14 else None


def tree_seconds(pid: int | None = None, proc: str = "/proc") -> float:
    """CPU seconds spent by process ``pid`` (default: this one) and everything it started:
    its own time and its reaped children's (``utime stime cutime cstime``), and the same of
    each live descendant (a child's own reaped children are in its ``cutime``). A child that
    ends moves from the live ones into its parent's ``cutime`` once reaped, so the sum only
    grows."""
    root = os.getpid() if pid is None else pid
    total = 0.0
    if root == os.getpid():
        times = os.times()
        # the calling process: its thread clock, finer than the kernel's ticks
        total += time.process_time() + times.children_user + times.children_system
    else:
        fields = _stat_fields(root, proc)
        if fields is not None:
            total += sum(int(value) for value in fields[11:15]) * _TICK
    seen = {root}
    pending = _children(root, proc)
    while pending:
        child = pending.pop()
        if child in seen:
            continue
        seen.add(child)
        fields = _stat_fields(child, proc)
        if fields is None:  # it ended meanwhile: its parent's cutime holds it once reaped
            continue
        # utime stime cutime cstime: fields 14-17 of stat, 11-14 from the state on
        total += sum(int(value) for value in fields[11:15]) * _TICK
        pending.extend(_children(child, proc))
    return total


def read_cpu_tree(cpus: frozenset[int], path: str = "/proc/stat") -> CpuReading | None:
    """As :func:`read_cpu`, with ``own`` the CPU time of this process and every process it
    started (:func:`tree_seconds`): what the rest of the machine used is ``busy - own``."""
    reading = read_cpu(cpus, path)
    if reading is None:
        return None
    return reading._replace(own=tree_seconds())


def pin_process(cpus: Iterable[int]) -> bool:
    """Let every thread of this process (OpenMP's workers included) run only on ``cpus``;
    threads started later inherit it from the thread that starts them. False where the
    system has no per-thread affinity or refuses it."""
    wanted = set(cpus)
    if not wanted or not hasattr(os, "sched_setaffinity"):
        return False
    try:
        tasks = [int(task) for task in os.listdir("/proc/self/task")]
    except OSError:
        tasks = [0]
    pinned = False
    for task in tasks:
        try:
            os.sched_setaffinity(task, wanted)
            pinned = True
        except OSError:  # a thread that just ended, or CPUs this process may not use
            continue
    return pinned


def others_now(cpus: frozenset[int] | None = None, seconds: float = 0.25) -> float | None:
    """Cores other processes use over ``seconds`` (this one sleeps meanwhile); None where it
    cannot be read."""
    cpu_set = cpus if cpus is not None else allowed_cpus()
    first = read_cpu(cpu_set)
    time.sleep(seconds)
    last = read_cpu(cpu_set)
    if first is None or last is None or last.at <= first.at:
        return None
    used = (last.busy - first.busy) - (last.own - first.own)
    return max(0.0, used / (last.at - first.at))
