"""Speed figures that can be trusted: the probe's working sets are sized by the cache the OS
reports (read from a fake sysfs tree here), each figure is timed until its rounds agree, a
figure beyond what the machine can do is not kept, and the daemon's own children are not other
programs' load (a real child burning CPU, started as the daemon starts its quantizer)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from speed_support import make_calibration

from localllm.daemon.devices.cpuspec import last_level_cache, parse_size, peak_ops
from localllm.daemon.devices.procfs import allowed_cpus, read_cpu, read_cpu_tree, tree_seconds
from localllm.daemon.speed import probe as speedprobe
from localllm.daemon.speed.measure import working_set
from localllm.daemon.speed.model import Calibration, TypeRate
from localllm.daemon.speed.trust import (
    BANDWIDTH_MARGIN,
    MAX_ROUNDS,
    ROUNDS,
    implausible,
    settle,
)
from localllm.settings import Settings

# -- the cache sizes, from the OS -----------------------------------------------------------


def _cache(root: Path, cpu: int, index: int, level: int, size: str, kind: str, shared: str) -> None:
    folder = root / f"cpu{cpu}" / "cache" / f"index{index}"
    folder.mkdir(parents=True)
    (folder / "level").write_text(f"{level}\n")
    (folder / "size").write_text(f"{size}\n")
    (folder / "type").write_text(f"{kind}\n")
    (folder / "shared_cpu_list").write_text(f"{shared}\n")


def _sysfs(root: Path, l3: dict[int, str]) -> Path:
    """Four CPUs with their own L1 and L2, and an L3 per CPU as ``l3`` says who shares it."""
    for cpu in range(4):
        _cache(root, cpu, 0, 1, "48K", "Data", str(cpu))
        _cache(root, cpu, 1, 1, "32K", "Instruction", str(cpu))
        _cache(root, cpu, 2, 2, "2048K", "Unified", str(cpu))
        _cache(root, cpu, 3, 3, "32768K", "Unified", l3[cpu])
    return root


def test_the_last_level_cache_is_read_from_the_os(tmp_path: Path) -> None:
    one = _sysfs(tmp_path / "one", {0: "0-3", 1: "0-3", 2: "0-3", 3: "0-3"})
    cache = last_level_cache({0, 1, 2, 3}, root=one)
    assert cache is not None and cache.source == "sysfs"
    # one L3 shared by the four CPUs: counted once, not four times
    assert (cache.level, cache.size, cache.instances) == (3, 32 << 20, 1)
    two = _sysfs(tmp_path / "two", {0: "0-1", 1: "0-1", 2: "2-3", 3: "2-3"})
    both = last_level_cache({0, 1, 2, 3}, root=two)
    assert both is not None and both.instances == 2 and both.total == 64 << 20
    half = last_level_cache({0, 1}, root=two)  # the CPUs this process may use reach one
    assert half is not None and half.total == 32 << 20
    # No L3: the L2s are the last level, one per CPU.
    l2 = tmp_path / "l2"
    for cpu in range(2):
        _cache(l2, cpu, 0, 1, "32K", "Data", str(cpu))
        _cache(l2, cpu, 2, 2, "1M", "Unified", str(cpu))
    cache = last_level_cache({0, 1}, root=l2)
    assert cache is not None and (cache.level, cache.size, cache.instances) == (2, 1 << 20, 2)


def test_no_cache_reported_is_not_a_made_up_size(tmp_path: Path) -> None:
    cache = last_level_cache({0}, root=tmp_path)  # an empty tree: sysconf, or nothing
    assert cache is None or cache.source == "sysconf"
    assert parse_size("32768K") == 32 << 20 and parse_size("1M") == 1 << 20
    assert parse_size("512") == 512 and parse_size("") is None and parse_size("lots") is None


def test_the_probe_spans_several_times_this_machines_cache() -> None:
    target, cache = working_set()
    reported = last_level_cache()
    if reported is None:
        assert cache is None and target >= 4 * (64 << 20)
    else:
        assert cache is not None and cache["size"] * cache["instances"] == reported.total
        assert target >= min(4 * reported.total, 1 << 30) and target >= 48 << 20


def test_the_cores_arithmetic_comes_from_their_clock_and_flags(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\ncpu MHz\t\t: 2000.000\nflags\t\t: fpu sse2 avx avx2 fma\n\n"
        "processor\t: 1\ncpu MHz\t\t: 2500.000\nflags\t\t: fpu sse2 avx avx2 fma\n"
    )
    assert peak_ops(2, root=tmp_path, cpuinfo=info) == pytest.approx(2 * 2.5e9 * 128)
    # cpufreq's rated maximum (boost) wins over the clock cpuinfo saw
    (tmp_path / "cpu0" / "cpufreq").mkdir(parents=True)
    (tmp_path / "cpu0" / "cpufreq" / "cpuinfo_max_freq").write_text("3500000\n")
    assert peak_ops(1, root=tmp_path, cpuinfo=info) == pytest.approx(3.5e9 * 128)
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx512f avx512_vnni\n")
    assert peak_ops(1, root=tmp_path, cpuinfo=info) == pytest.approx(3.5e9 * 256)
    info.write_text("processor\t: 0\n")  # no flags: no bound, rather than a guessed one
    assert peak_ops(1, root=tmp_path, cpuinfo=info) is None
    assert peak_ops(1, root=tmp_path, cpuinfo=tmp_path / "missing") is None


# -- rounds until they agree ----------------------------------------------------------------


def _rounds(values: list[float]) -> tuple[list[float], Callable[[], float]]:
    taken: list[float] = []
    source = iter(values)

    def measure() -> float:
        taken.append(next(source))
        return taken[-1]

    return taken, measure


def test_a_figure_is_timed_until_its_best_rounds_agree() -> None:
    # a busy moment slows the second round: one more is run, and the best three agree
    taken, measure = _rounds([1.00, 1.60, 1.03, 1.02, 9.0])
    result = settle(measure)
    assert taken == [1.00, 1.60, 1.03, 1.02]
    assert result.stable and result.value == 1.00 and result.rounds == 4
    assert result.spread == pytest.approx(0.03)
    # quiet from the start: three rounds are enough
    taken, measure = _rounds([2.0, 2.05, 2.01, 9.0])
    assert settle(measure).rounds == ROUNDS and len(taken) == ROUNDS


def test_a_figure_that_never_agrees_is_called_unstable() -> None:
    taken, measure = _rounds([1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5])
    result = settle(measure)
    assert not result.stable and result.rounds == MAX_ROUNDS and len(taken) == MAX_ROUNDS
    assert result.value == 1.0 and result.spread == pytest.approx(1.0)


# -- what cannot be true is not kept --------------------------------------------------------


def test_a_decode_faster_than_memory_is_not_kept() -> None:
    """The issue's fourth probe: Q4_K decoding at 126.9 GB/s on memory that gives 32.3."""
    figures = make_calibration(
        Q4_K=TypeRate(decode=126.9e9, prefill=100e9), Q8_0=TypeRate(decode=30e9, prefill=90e9)
    )
    figures.bandwidth = 32.3e9
    problems = implausible(figures, peak=1e12)
    assert len(problems) == 1
    assert "Q4_K decode 126.9 GB/s" in problems[0] and "32.3 GB/s" in problems[0]
    assert "cache" in problems[0]
    figures.types["Q4_K"] = TypeRate(decode=31e9, prefill=100e9)  # within the readings' noise
    assert implausible(figures, peak=1e12) == []
    figures.types["Q4_K"] = TypeRate(decode=32.3e9 * (BANDWIDTH_MARGIN + 0.05), prefill=100e9)
    assert len(implausible(figures, peak=1e12)) == 1


def test_a_batch_faster_than_the_cores_can_compute_is_not_kept() -> None:
    figures = make_calibration(Q8_0=TypeRate(decode=10e9, prefill=5e12))
    problems = implausible(figures, peak=1e12)
    assert len(problems) == 1 and "Q8_0 prefill 5000 GFLOP/s" in problems[0]
    assert implausible(figures, peak=None) == []  # the arithmetic unknown: no bound
    assert implausible(make_calibration(Q8_0=TypeRate(10e9, 1.5e12)), peak=1e12) == []


@pytest.mark.parametrize(
    ("figures", "said"),
    [
        (
            make_calibration(Q4_K=TypeRate(decode=127e9, prefill=50e9)),
            "cannot be true: Q4_K decode 127.0 GB/s",
        ),
        (
            dict(unstable=["Q4_K decode (its best rounds 27% apart after 6)"]),
            "did not agree when measured again: Q4_K decode (its best rounds 27%",
        ),
    ],
)
def test_figures_that_cannot_be_trusted_are_not_cached(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    figures: Calibration | dict[str, list[str]],
    said: str,
) -> None:
    settings = Settings.from_env({"LOCALLLM_HOME": str(tmp_path), "LOCALLLM_CPU_REPACK": "on"})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def from_probe(report: object, key: str, seconds: float) -> Calibration:
        if isinstance(figures, Calibration):
            made = figures
        else:
            made = make_calibration(Q4_K=TypeRate(10e9, 50e9))
            made.unstable = figures["unstable"]
        made.key = key
        return made

    monkeypatch.setattr(speedprobe, "_run_child", lambda *args, **kwargs: {})
    monkeypatch.setattr(Calibration, "from_probe", staticmethod(from_probe))
    with pytest.raises(speedprobe.ProbeUnstable) as raised:
        speedprobe.calibrate(settings, threads=1)
    assert said in str(raised.value)
    assert isinstance(raised.value, speedprobe.ProbeInterrupted)  # tried again later
    assert speedprobe.cached_calibration(settings, 1) is None


def test_a_probe_stopped_at_its_first_unstable_figure_keeps_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child stops at the first figure whose rounds never agree (measuring on would be
    time lost on a busy machine): the daemon says which, and caches nothing."""
    settings = Settings.from_env({"LOCALLLM_HOME": str(tmp_path), "LOCALLLM_CPU_REPACK": "on"})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    asked: list[bool] = []

    def child(*args: object, keep_going: bool = False, **kwargs: object) -> dict[str, object]:
        asked.append(keep_going)
        return {
            "unstable": ["tiny-26 batch (its best rounds 29% apart after 8)"],
            "stopped": True,
            "others": 1.2,
        }

    monkeypatch.setattr(speedprobe, "_run_child", child)
    with pytest.raises(speedprobe.ProbeUnstable, match=r"tiny-26 batch \(its best rounds 29%"):
        speedprobe.calibrate(settings, threads=1)
    assert asked == [False]  # the daemon's probe stops early
    assert speedprobe.cached_calibration(settings, 1) is None


def test_rounds_and_cache_come_back_from_the_probes_report() -> None:
    report = {
        "threads": 2,
        "repack": True,
        "batch": 128,
        "bandwidth": 20e9,
        "cache": {"level": 3, "size": 32 << 20, "instances": 1, "source": "sysfs"},
        "working_set": 128 << 20,
        "tiny": {
            "layers": [2, 26],
            "layer_bytes": 174080,
            "layer_params": 163840,
            "decode_s": [1e-4, 1e-3],
            "batch_s": [1e-3, 1e-2],
        },
        "types": {},
        "stability": {"tiny-2 decode": {"spread": 0.01, "rounds": 3}},
        "devices": {
            "Vulkan0": {
                "tiny": {
                    "layers": [2, 26],
                    "layer_bytes": 174080,
                    "layer_params": 163840,
                    "decode_s": [1e-4, 1e-3],
                    "batch_s": [1e-3, 1e-2],
                },
                "types": {},
                "stability": {"tiny-2 decode": {"spread": 0.05, "rounds": 4}},
            }
        },
        "unstable": ["Vulkan0 tiny-26 batch (its best rounds 9% apart after 6)"],
    }
    figures = Calibration.from_probe(report, "key", 1.0)
    assert figures.cache_bytes == 32 << 20 and figures.working_set == 128 << 20
    assert figures.spread == 0.05 and figures.unstable == report["unstable"]
    assert "32 MiB last-level cache" in figures.describe()
    from localllm.cli.doctor import _speed_lines

    said = "\n".join(_speed_lines(figures.to_dict()))
    assert "models of 128 MiB against a 32 MiB last-level cache" in said
    assert "within 5% of each other" in said


# -- the daemon's own work is not other programs' -------------------------------------------

_BURN = """
import sys, time
began = time.process_time()
while time.process_time() - began < 0.3:
    pass
print(time.process_time(), flush=True)
sys.stdin.read()  # until the test lets it end
"""


def test_the_daemons_own_children_are_not_other_programs() -> None:
    """A child burning CPU, started as the daemon starts its quantizer: the watch's reading
    (the whole process tree) counts its time as the daemon's own, live and once reaped; the
    governor's (this process alone) does not, so threads are still shared with it."""
    cpus = allowed_cpus()
    tree_first, plain_first = read_cpu_tree(cpus), read_cpu(cpus)
    assert tree_first is not None and plain_first is not None
    child = subprocess.Popen(
        [sys.executable, "-c", _BURN],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        burnt = float(child.stdout.readline())  # its CPU seconds, once it has burnt them
        assert burnt >= 0.3
        live, plain = read_cpu_tree(cpus), read_cpu(cpus)
        assert live is not None and plain is not None
        own_tree = live.own - tree_first.own
        own_plain = plain.own - plain_first.own
        # (ticks of 10 ms: the kernel counts a process's time in them)
        assert own_tree - own_plain >= burnt - 0.05
        # what the rest of the machine used leaves the child out of it
        others_tree = (live.busy - tree_first.busy) - own_tree
        others_plain = (plain.busy - plain_first.busy) - own_plain
        assert others_plain - others_tree >= burnt - 0.1
        child.stdin.close()
        child.wait(30)
        reaped = tree_seconds()
        # an ended child's time moves into this process's children's time: never lost
        assert reaped - tree_first.own >= own_tree - 0.02
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
