"""Host memory as a process sees it: the smaller of what the kernel could give and what its
memory cgroup still allows.

``MemAvailable`` (``/proc/meminfo``) is the kernel's estimate of memory a new workload can
get without swapping. A container or a systemd slice can allow far less: its memory cgroup's
limit minus what the group already uses. Both cgroup versions are read (v2's ``memory.max``
and ``memory.current``; v1's ``memory.limit_in_bytes`` and ``memory.usage_in_bytes``), for
every group on the path from the process's own up to the root, since a parent's limit binds
its children too. Clean page cache a group could drop (``inactive_file``) counts as free, as
the kernel reclaims it before it kills anything (the working set, as Kubernetes computes it).

Everything is read under a ``root`` folder so that tests can build a fake ``/proc`` and
``/sys``; nothing here needs privileges. Hand-written: psutil reports ``MemAvailable`` but no
cgroup limit, and no small library trusted for both cgroup versions was found.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HostMemory", "ProcessMemory", "host_memory", "memory_cgroup", "process_memory"]

# cgroup v1 writes "no limit" as a page-aligned LONG_MAX; anything this large is no limit.
_UNLIMITED = 1 << 60


@dataclass(frozen=True)
class HostMemory:
    """RAM this process may still use."""

    available: int
    """Bytes a new allocation can get: min(MemAvailable, the tightest cgroup's room)."""
    total: int
    """Bytes of RAM this process can ever have: MemTotal, or the tightest cgroup limit."""
    mem_available: int
    """The kernel's MemAvailable alone."""
    cgroup_limit: int | None = None
    """The tightest memory cgroup limit on the way to the root (None: no limit)."""
    cgroup_room: int | None = None
    """That group's limit minus its working set (None: no limit)."""
    cgroup: str | None = None
    """Which group binds, as ``v1:/path`` or ``v2:/path``."""

    def describe(self) -> str:
        """One line for logs: where the number comes from."""
        mib = 1 << 20
        text = f"{self.available // mib} MiB available (MemAvailable {self.mem_available // mib}"
        if self.cgroup_room is not None and self.cgroup_limit is not None:
            text += (
                f", cgroup {self.cgroup} limit {self.cgroup_limit // mib} "
                f"room {self.cgroup_room // mib}"
            )
        return text + " MiB)"


@dataclass(frozen=True)
class ProcessMemory:
    """What one process holds in RAM."""

    rss: int
    """Resident bytes (anonymous, file-backed and shared)."""
    rss_file: int
    """Resident bytes that are mapped file pages (a model's mmapped weights)."""


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    text = text.strip()
    if text == "max":
        return _UNLIMITED
    try:
        return int(text)
    except ValueError:
        return None


def _meminfo(root: Path) -> dict[str, int]:
    values: dict[str, int] = {}
    for line in (_read(root / "proc/meminfo") or "").splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            scale = 1024 if len(parts) > 1 and parts[1].lower() == "kb" else 1
            values[name.strip()] = int(parts[0]) * scale
    return values


def _stat_value(text: str | None, *names: str) -> int:
    """The first of ``names`` found in a ``memory.stat`` file (0 when none is)."""
    found: dict[str, int] = {}
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            found[key] = int(value)
    return next((found[n] for n in names if n in found), 0)


_Mount = tuple[Path, str]
"""Where a cgroup hierarchy is mounted, and which of its groups the mount shows as its root."""


def _mounts(root: Path) -> tuple[_Mount | None, _Mount | None]:
    """The cgroup v2 hierarchy's mount and the v1 memory controller's."""
    v2: _Mount | None = None
    v1: _Mount | None = None
    for line in (_read(root / "proc/self/mountinfo") or "").splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or not tail:
            continue
        mount = (root / fields[4].lstrip("/"), fields[3])
        if tail[0] == "cgroup2" and v2 is None:
            v2 = mount
        elif tail[0] == "cgroup" and len(tail) >= 3 and "memory" in tail[2].split(","):
            v1 = mount
    return v2, v1


def _groups(root: Path) -> tuple[str | None, str | None]:
    """This process's cgroup v2 path and v1 memory-controller path."""
    v2: str | None = None
    v1: str | None = None
    for line in (_read(root / "proc/self/cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    return v2, v1


def _ancestors(mount: _Mount, group: str) -> list[tuple[str, Path]]:
    """The group's folder and its parents' up to the mount point, innermost first. In a
    container the mount's root is often the container's own group: paths are made relative
    to it."""
    point, mount_root = mount
    shown = [p for p in mount_root.split("/") if p]
    parts = [p for p in group.split("/") if p]
    if parts[: len(shown)] == shown:
        parts = parts[len(shown) :]
    return [
        ("/" + "/".join(parts[:depth]), point.joinpath(*parts[:depth]))
        for depth in range(len(parts), -1, -1)
    ]


# Each cgroup version's files: limit, usage, and the ``memory.stat`` keys of clean page cache
# (v1 sums a group's descendants under ``total_*``; its own figure is the fallback).
_FILES = {
    "v2": ("memory.max", "memory.current", ("inactive_file",)),
    "v1": (
        "memory.limit_in_bytes",
        "memory.usage_in_bytes",
        ("total_inactive_file", "inactive_file"),
    ),
}


def _cgroup_room(root: Path) -> tuple[int, int, str] | None:
    """(room, limit, group) of the tightest memory cgroup over this process, or None."""
    mounts = dict(zip(("v2", "v1"), _mounts(root), strict=True))
    groups = dict(zip(("v2", "v1"), _groups(root), strict=True))
    candidates: list[tuple[int, int, str]] = []
    for version, (limit_file, usage_file, cache_keys) in _FILES.items():
        mount, group = mounts[version], groups[version]
        if mount is None or group is None:
            continue
        for name, folder in _ancestors(mount, group):
            limit = _int(_read(folder / limit_file))
            usage = _int(_read(folder / usage_file))
            if limit is None or usage is None or limit >= _UNLIMITED:
                continue
            cache = _stat_value(_read(folder / "memory.stat"), *cache_keys)
            candidates.append((limit - max(usage - cache, 0), limit, f"{version}:{name}"))
    if not candidates:
        return None
    room, limit, name = min(candidates)
    return max(room, 0), limit, name


def memory_cgroup(root: Path = Path("/")) -> tuple[str, Path] | None:
    """This process's own memory cgroup: ``("v2", folder)`` or ``("v1", folder)`` (the v2
    hierarchy first when it has the memory controller), None when neither is mounted."""
    mount_v2, mount_v1 = _mounts(root)
    group_v2, group_v1 = _groups(root)
    if mount_v2 is not None and group_v2 is not None:
        folder = _ancestors(mount_v2, group_v2)[0][1]
        if (folder / "memory.max").exists() or (
            "memory" in (_read(mount_v2[0] / "cgroup.controllers") or "").split()
        ):
            return "v2", folder
    if mount_v1 is not None and group_v1 is not None:
        return "v1", _ancestors(mount_v1, group_v1)[0][1]
    return None


def host_memory(root: Path = Path("/")) -> HostMemory:
    """RAM this process may still use (see the module docstring)."""
    info = _meminfo(root)
    total = info.get("MemTotal", 0)
    available = info.get("MemAvailable", info.get("MemFree", 0))
    bound = _cgroup_room(root)
    if bound is None:
        return HostMemory(available=available, total=total, mem_available=available)
    room, limit, name = bound
    return HostMemory(
        available=min(available, room),
        total=min(total, limit) if total else limit,
        mem_available=available,
        cgroup_limit=limit,
        cgroup_room=room,
        cgroup=name,
    )


def process_memory(pid: int, root: Path = Path("/")) -> ProcessMemory | None:
    """Resident memory of process ``pid`` (None when it is gone or unreadable)."""
    text = _read(root / f"proc/{pid}/status")
    if text is None:
        return None
    values: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            with contextlib.suppress(ValueError):
                values[name] = int(parts[0]) * 1024
    if "VmRSS" not in values:
        return None
    return ProcessMemory(rss=values["VmRSS"], rss_file=values.get("RssFile", 0))
