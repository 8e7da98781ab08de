"""What this CPU is made of, as the operating system tells it: the size of its last-level cache,
its clock and the widest arithmetic its instruction set has.

The speed probe sizes its working sets by the cache (a model that fits in it measures the cache,
not memory) and bounds its prefill figures by the arithmetic (no batch multiplies faster than
the cores can). Nothing here is assumed: a size or a clock the system does not report is None,
and the caller says so.

Sources, in order: Linux's ``/sys/devices/system/cpu/cpu<N>/cache/index<M>/{level,size,type,
shared_cpu_list}`` and ``/proc/cpuinfo``; ``os.sysconf`` (glibc's ``SC_LEVEL3_CACHE_SIZE`` and
the like) where Python was built with those names.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LastLevelCache", "last_level_cache", "parse_size", "peak_ops"]

_SYSFS = Path("/sys/devices/system/cpu")
_SYSCONF_LEVELS = (
    (4, "SC_LEVEL4_CACHE_SIZE"),
    (3, "SC_LEVEL3_CACHE_SIZE"),
    (2, "SC_LEVEL2_CACHE_SIZE"),
)
# Integer multiply-add operations (two each) a core's widest path does per cycle, by the flag
# that names it: generous on purpose, it is a bound on what cannot be, not a prediction.
# AMX and SME tiles; 512-bit integer dot products (or two 256-bit ports); 256-bit; 128-bit.
_OPS_PER_CYCLE = (
    ("amx_int8", 2048),
    ("sme", 2048),
    ("avx512_vnni", 256),
    ("avx512vnni", 256),
    ("avx512f", 256),
    ("i8mm", 256),
    ("avx_vnni", 128),
    ("avx2", 128),
    ("asimddp", 128),
    ("sve", 128),
    ("asimd", 64),
    ("sse2", 64),
)


@dataclass(frozen=True)
class LastLevelCache:
    """The largest cache level the CPUs this process may use share."""

    level: int
    """3 on most machines (2 where there is no L3)."""
    size: int
    """Bytes of one instance of it."""
    instances: int
    """How many separate instances the allowed CPUs reach (several CCXs, sockets)."""
    source: str
    """``sysfs`` or ``sysconf``."""

    @property
    def total(self) -> int:
        """Bytes of all instances together: what a probe's threads could keep cached."""
        return self.size * self.instances


def parse_size(text: str) -> int | None:
    """Bytes of a sysfs cache size (``32768K``, ``1M``, ``512``); None when unreadable."""
    text = text.strip().upper().removesuffix("B")
    factor = 1
    for suffix, scale in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if text.endswith(suffix):
            text, factor = text[:-1], scale
            break
    try:
        value = int(text)
    except ValueError:
        return None
    return value * factor if value > 0 else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _from_sysfs(root: Path, cpus: Iterable[int]) -> LastLevelCache | None:
    # level -> {(shared cpus or cpu, index) -> size}: an instance shared by several CPUs is
    # listed under each of them, and counted once.
    found: dict[int, dict[str, int]] = {}
    for cpu in sorted(cpus):
        for index in sorted((root / f"cpu{cpu}" / "cache").glob("index*")):
            kind = _read(index / "type")
            level_text = _read(index / "level")
            size_text = _read(index / "size")
            if kind not in ("Unified", "Data") or level_text is None or size_text is None:
                continue
            size = parse_size(size_text)
            try:
                level = int(level_text)
            except ValueError:
                continue
            if size is None:
                continue
            shared = _read(index / "shared_cpu_list") or f"cpu{cpu}"
            found.setdefault(level, {})[f"{shared}|{index.name}"] = size
    if not found:
        return None
    level = max(found)
    sizes = list(found[level].values())
    return LastLevelCache(level=level, size=max(sizes), instances=len(sizes), source="sysfs")


def _from_sysconf() -> LastLevelCache | None:
    names = getattr(os, "sysconf_names", {})
    for level, name in _SYSCONF_LEVELS:
        if name not in names:
            continue
        try:
            size = os.sysconf(name)
        except (OSError, ValueError):
            continue
        if size > 0:
            return LastLevelCache(level=level, size=size, instances=1, source="sysconf")
    return None


def last_level_cache(
    cpus: Iterable[int] | None = None, root: Path = _SYSFS
) -> LastLevelCache | None:
    """The last-level cache the CPUs ``cpus`` (default: those this process may use) reach, as
    the system reports it; None where it does not."""
    if cpus is None:
        from .procfs import allowed_cpus

        cpus = allowed_cpus()
    return _from_sysfs(root, cpus) or _from_sysconf()


def _cpuinfo(path: Path) -> tuple[float | None, set[str]]:
    """The highest clock (Hz) and the instruction-set flags ``/proc/cpuinfo`` lists."""
    text = _read(path)
    if text is None:
        return None, set()
    clock = None
    flags: set[str] = set()
    for line in text.splitlines():
        name, _, value = line.partition(":")
        name = name.strip().lower()
        if name == "cpu mhz":
            try:
                clock = max(clock or 0.0, float(value) * 1e6)
            except ValueError:
                continue
        elif name in ("flags", "features"):
            flags.update(value.split())
    return clock, flags


def peak_ops(
    threads: int, root: Path = _SYSFS, cpuinfo: Path = Path("/proc/cpuinfo")
) -> float | None:
    """Operations per second ``threads`` cores can do at most (two per multiply-add, on the
    widest path the CPU's flags name, at its highest clock): None where the clock or the flags
    are not reported."""
    clock, flags = _cpuinfo(cpuinfo)
    # The highest rated clock where cpufreq reports it (turbo included), else what cpuinfo says.
    top = _read(root / "cpu0" / "cpufreq" / "cpuinfo_max_freq")
    if top is not None and top.isdigit():
        clock = max(clock or 0.0, int(top) * 1e3)
    ops = next((count for flag, count in _OPS_PER_CYCLE if flag in flags), None)
    if not clock or ops is None:
        return None
    return threads * clock * ops
