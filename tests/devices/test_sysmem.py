"""Host memory as a process sees it, from fake ``/proc`` and ``/sys`` trees: MemAvailable
alone, a cgroup v2 limit, a v1 limit, a parent's limit tighter than the child's, a
container's mount that shows its own group as the root, reclaimable cache, a process's RSS."""

from __future__ import annotations

import os
from pathlib import Path

from localllm.daemon.memory.system import host_memory, process_memory

MIB = 1 << 20
MEMINFO = "MemTotal:       24000000 kB\nMemFree:         1000000 kB\nMemAvailable:   20000000 kB\n"


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


V2_MOUNT = "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"


def cgroup_v2(root: Path, group: str, files: dict[str, str]) -> Path:
    """A process in cgroup v2 group ``group``, the hierarchy mounted at /sys/fs/cgroup;
    ``files`` are named from that mount."""
    return tree(
        root,
        {
            "proc/meminfo": MEMINFO,
            "proc/self/cgroup": f"0::/{group}\n",
            "proc/self/mountinfo": V2_MOUNT,
            **{f"sys/fs/cgroup/{name}": text for name, text in files.items()},
        },
    )


def test_without_a_cgroup_limit_it_is_mem_available(tmp_path: Path) -> None:
    root = cgroup_v2(
        tmp_path,
        "user.slice",
        {"user.slice/memory.max": "max\n", "user.slice/memory.current": "123\n"},
    )
    memory = host_memory(root)
    assert memory.available == memory.mem_available == 20000000 * 1024
    assert memory.total == 24000000 * 1024
    assert memory.cgroup_limit is None


def test_a_cgroup_v2_limit_binds_with_its_cache_counted_free(tmp_path: Path) -> None:
    group = "system.slice/localllm.service"
    root = cgroup_v2(
        tmp_path,
        group,
        {
            f"{group}/memory.max": f"{900 * MIB}\n",
            f"{group}/memory.current": f"{300 * MIB}\n",
            f"{group}/memory.stat": f"anon {200 * MIB}\ninactive_file {100 * MIB}\n",
            "system.slice/memory.max": "max\n",
            "system.slice/memory.current": f"{5000 * MIB}\n",
        },
    )
    memory = host_memory(root)
    assert memory.cgroup_limit == 900 * MIB
    assert memory.cgroup_room == 700 * MIB  # 900 - (300 in use - 100 reclaimable)
    assert memory.available == 700 * MIB and memory.total == 900 * MIB
    assert memory.cgroup == "v2:/system.slice/localllm.service"
    assert "cgroup v2:/system.slice/localllm.service limit 900 room 700" in memory.describe()


def test_a_parents_tighter_limit_binds_the_child_v1(tmp_path: Path) -> None:
    memory_mount = "sys/fs/cgroup/memory"
    root = tree(
        tmp_path,
        {
            "proc/meminfo": MEMINFO,
            "proc/self/cgroup": "5:cpu:/\n4:memory:/jobs/run1\n0::/\n",
            "proc/self/mountinfo": (
                "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"
                "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
            ),
            f"{memory_mount}/jobs/run1/memory.limit_in_bytes": "9223372036854771712\n",
            f"{memory_mount}/jobs/run1/memory.usage_in_bytes": f"{50 * MIB}\n",
            f"{memory_mount}/jobs/memory.limit_in_bytes": f"{2048 * MIB}\n",
            f"{memory_mount}/jobs/memory.usage_in_bytes": f"{1500 * MIB}\n",
            f"{memory_mount}/jobs/memory.stat": f"cache 1\ntotal_inactive_file {52 * MIB}\n",
            f"{memory_mount}/memory.limit_in_bytes": "9223372036854771712\n",
            f"{memory_mount}/memory.usage_in_bytes": f"{9000 * MIB}\n",
        },
    )
    memory = host_memory(root)
    assert memory.cgroup == "v1:/jobs"
    assert memory.cgroup_room == 600 * MIB  # 2048 - (1500 - 52)
    assert memory.available == 600 * MIB


def test_a_containers_mount_root_is_its_own_group(tmp_path: Path) -> None:
    # Inside a container /proc/self/cgroup names the host's path, while the mount shows that
    # group as its root: the files are at the mount point itself.
    root = tree(
        tmp_path,
        {
            "proc/meminfo": MEMINFO,
            "proc/self/cgroup": "0::/kubepods/pod1/abc\n",
            "proc/self/mountinfo": (
                "30 23 0:26 /kubepods/pod1/abc /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n"
            ),
            "sys/fs/cgroup/memory.max": f"{512 * MIB}\n",
            "sys/fs/cgroup/memory.current": f"{12 * MIB}\n",
        },
    )
    memory = host_memory(root)
    assert memory.cgroup_room == 500 * MIB and memory.cgroup == "v2:/"


def test_a_group_over_its_limit_has_no_room(tmp_path: Path) -> None:
    root = cgroup_v2(
        tmp_path, "a", {"a/memory.max": f"{100 * MIB}\n", "a/memory.current": f"{130 * MIB}\n"}
    )
    assert host_memory(root).available == 0


def test_missing_files_leave_mem_available(tmp_path: Path) -> None:
    root = tree(tmp_path, {"proc/meminfo": MEMINFO})
    assert host_memory(root).available == 20000000 * 1024
    assert host_memory(tmp_path / "nothing").available == 0


def test_process_memory_reads_rss_and_its_mapped_files(tmp_path: Path) -> None:
    root = tree(
        tmp_path,
        {
            "proc/42/status": "Name:\tpython\nVmRSS:\t  204800 kB\nRssAnon:\t 102400 kB\n"
            "RssFile:\t  102400 kB\n"
        },
    )
    held = process_memory(42, root)
    assert held is not None and held.rss == 200 * MIB and held.rss_file == 100 * MIB
    assert process_memory(43, root) is None
    mine = process_memory(os.getpid())
    assert mine is not None and mine.rss > mine.rss_file > 0


def test_this_machine_reports_something_sane() -> None:
    memory = host_memory()
    assert 0 < memory.available <= memory.total
    assert memory.available <= memory.mem_available
