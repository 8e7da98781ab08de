"""This machine's speed measured at the daemon's first quiet moment: never while other programs
are busy, never in a request's way (work that comes in stops the probe, which is tried again
later), and ``show`` predicting on a fresh data root and cache without ``localllm doctor``."""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from speed_support import make_calibration, seed_calibration
from test_cli_support import cli_home

from localllm.daemon.devices.procfs import (
    CpuReading,
    allowed_cpus,
    read_cpu,
    read_cpu_tree,
    tree_seconds,
)
from localllm.daemon.speed import probe as speedprobe
from localllm.daemon.speed.model import Calibration, TypeRate
from localllm.daemon.speed.watch import ProbeState, SpeedWatch
from localllm.settings import Settings


class Machine:
    """Made-up CPU readings: other processes use ``others`` cores from now on, the daemon's
    own process tree (its create, pull, quantize children) ``own``."""

    def __init__(self) -> None:
        self.others = 0.0
        self.own = 0.0
        self._busy = 0.0
        self._own = 0.0
        self._at = time.monotonic()

    def read(self) -> CpuReading:
        now = time.monotonic()
        self._busy += (self.others + self.own) * (now - self._at)
        self._own += self.own * (now - self._at)
        self._at = now
        return CpuReading(at=now, busy=self._busy, own=self._own)


def _watch(
    tmp_path: Path, machine: Machine, working: list[bool], calibrate: Any, first_pause: float = 30
) -> tuple[SpeedWatch, list[Calibration]]:
    settings = Settings.from_env({"LOCALLLM_HOME": str(tmp_path)})
    measured: list[Calibration] = []
    watch = SpeedWatch(
        settings,
        2,
        lambda: working[0],
        cached=lambda: measured[-1] if measured else None,
        calibrate=calibrate,
        reader=machine.read,
        cpus=2,
        quiet_span=0.2,
        interval=0.05,
        first_pause=first_pause,
    )
    return watch, measured


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_the_probe_waits_for_quiet_and_gives_way_to_work(tmp_path: Path) -> None:
    machine, working = Machine(), [False]
    machine.others = 1.5  # a build runs
    calls: list[str] = []
    started, interrupted = threading.Event(), threading.Event()

    def calibrate(settings: Settings, **kwargs: Any) -> Calibration:
        calls.append("start")
        started.set()
        if len(calls) == 1:
            # work comes in while the first attempt runs: it must see that and stop
            while not kwargs["cancelled"]():
                time.sleep(0.01)
            interrupted.set()
            raise speedprobe.ProbeInterrupted("gave way")
        assert kwargs["max_others"] == pytest.approx(0.4)  # 0.2 of 2 cores
        figures = make_calibration(Q4_0=TypeRate(1e9, 1e9))
        measured.append(figures)
        return figures

    watch, measured = _watch(tmp_path, machine, working, calibrate)
    task = asyncio.create_task(watch.run())
    try:
        # Busy: nothing starts, and the reason says what it waits for.
        deadline = time.monotonic() + 10
        while "other programs use 1.5 of 2 cores" not in watch.why():
            assert time.monotonic() < deadline, watch.why()
            await asyncio.sleep(0.02)
        assert watch.state is ProbeState.WAITING and not calls and watch.measuring
        assert watch.wait(5) is None  # busy: show does not wait for it
        machine.others = 0.1
        await asyncio.to_thread(started.wait, 10)
        assert watch.state is ProbeState.MEASURING and "measuring" in watch.why()
        working[0] = True  # a request arrives
        await asyncio.to_thread(interrupted.wait, 10)
        deadline = time.monotonic() + 10
        while watch.state is not ProbeState.WAITING:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        assert "models are working" in watch.why() and len(calls) == 1
        working[0] = False  # the request is over: the next quiet moment measures
        figures = await asyncio.to_thread(watch.wait, 10)
        assert figures is not None and figures is measured[-1] and len(calls) == 2
        await asyncio.wait_for(task, 10)
        assert watch.state is ProbeState.MEASURED and watch.why() == ""
    finally:
        task.cancel()


@pytest.mark.anyio
async def test_figures_that_did_not_agree_are_not_kept_and_measured_again(tmp_path: Path) -> None:
    """A probe whose figures disagreed from round to round is not kept: the reason says so
    (show does not wait for it), and the probe runs again after a pause."""
    machine, calls = Machine(), []
    pause = threading.Event()

    def calibrate(settings: Settings, **kwargs: Any) -> Calibration:
        calls.append("start")
        if len(calls) == 1:
            unsteady = make_calibration(Q4_0=TypeRate(1e9, 1e9))
            unsteady.unsettled, unsteady.rounds = {"Q4_0.decode": 0.3}, 8
            raise speedprobe.ProbeUnsettled(unsteady)
        pause.wait(10)  # the test has looked at the pause
        figures = make_calibration(Q4_0=TypeRate(1e9, 1e9))
        measured.append(figures)
        return figures

    watch, measured = _watch(tmp_path, machine, [False], calibrate, first_pause=0.5)
    task = asyncio.create_task(watch.run())
    try:
        deadline = time.monotonic() + 10
        while "measured, not kept" not in watch.why():
            assert time.monotonic() < deadline, watch.why()
            await asyncio.sleep(0.02)
        why = watch.why()
        assert "did not agree within 10 % in 8 rounds (Q4_0.decode 30%)" in why, why
        assert "measured again" in why and watch.state is ProbeState.WAITING
        if len(calls) == 1:  # still pausing: show says why instead of waiting
            assert watch.wait(5) is None or len(calls) == 2
        pause.set()
        figures = await asyncio.to_thread(watch.wait, 10)
        while figures is None:
            assert time.monotonic() < deadline, watch.why()
            figures = await asyncio.to_thread(watch.wait, 1)
        assert figures is measured[-1] and len(calls) == 2
        await asyncio.wait_for(task, 10)
    finally:
        pause.set()
        task.cancel()


@pytest.mark.anyio
async def test_a_failed_or_switched_off_probe_says_what_to_do(tmp_path: Path) -> None:
    machine = Machine()

    def failing(settings: Settings, **kwargs: Any) -> Calibration:
        raise speedprobe.ProbeFailed("the speed probe exited with signal SIGILL")

    watch, _ = _watch(tmp_path, machine, [False], failing)
    await asyncio.wait_for(watch.run(), 10)
    assert watch.state is ProbeState.FAILED and not watch.measuring
    assert "SIGILL" in watch.why() and "localllm doctor" in watch.why()
    assert watch.wait(5) is None

    off = Settings.from_env({"LOCALLLM_HOME": str(tmp_path), "LOCALLLM_SPEED_PROBE": "off"})
    quiet = SpeedWatch(off, 2, lambda: False, cached=lambda: None, calibrate=failing)
    await asyncio.wait_for(quiet.run(), 10)
    assert quiet.state is ProbeState.OFF and "LOCALLLM_SPEED_PROBE=off" in quiet.why()


@pytest.mark.anyio
async def test_the_daemons_own_work_is_waited_for_not_blamed_on_others(tmp_path: Path) -> None:
    """Right after ``create``: the daemon's own quantizing child used the cores. The reason
    names it as the daemon's, ``show`` waits for it instead of giving up, and the probe runs
    once it is over (not beside it: it would measure the quantizer)."""
    machine, calls = Machine(), []
    machine.own = 1.5

    def calibrate(settings: Settings, **kwargs: Any) -> Calibration:
        calls.append(machine.own)
        measured.append(make_calibration(Q4_0=TypeRate(1e9, 1e9)))
        return measured[-1]

    watch, measured = _watch(tmp_path, machine, [False], calibrate)
    task = asyncio.create_task(watch.run())
    try:
        deadline = time.monotonic() + 10
        while "own work" not in watch.why():
            assert time.monotonic() < deadline, watch.why()
            await asyncio.sleep(0.02)
        assert "the daemon's own work (a create, pull or quantize) uses 1.5 of 2" in watch.why()
        assert "other programs" not in watch.why() and not calls
        # show asks while the daemon's own work is still the last reading: it waits (when
        # that work was counted as others', it answered None at once)
        shown = asyncio.create_task(asyncio.to_thread(watch.wait, 10))
        machine.own = 0.0  # the create is over
        figures = await asyncio.wait_for(shown, 15)
        assert figures is not None and calls == [0.0]
        await asyncio.wait_for(task, 10)
    finally:
        task.cancel()


def test_the_probe_child_is_stopped_when_work_comes_in() -> None:
    began = time.monotonic()
    with pytest.raises(speedprobe.ProbeInterrupted):
        speedprobe._run_child(
            1, True, ["Q4_0"], timeout=120, cancelled=lambda: time.monotonic() - began > 0.3
        )
    assert time.monotonic() - began < 5  # killed, not waited for


@pytest.mark.slow
def test_show_predicts_on_a_fresh_machine_without_doctor(tmp_path: Path) -> None:
    """A fresh data root and cache dir: the daemon measures this machine's speed at its first
    quiet moment, and ``show`` predicts (waiting for the probe while it runs).

    Quiet is what ``LOCALLLM_SPEED_PROBE_QUIET`` says, here any load of other programs (as on a
    machine that is never quiet): the suite's other workers and whatever else runs on this
    machine then neither hold the probe back nor have to stop for it. Waiting for quiet is the
    watch's own tests' (above), and the models pane's (below).
    """
    cache = tmp_path / "cache"
    env = {"XDG_CACHE_HOME": str(cache), "LOCALLLM_SPEED_PROBE": "on"}
    # The probe's rounds end at their minimum (a test hook): on the suite's busy machine they
    # would go on to the probe's budget, and what is tested here is that the watch probes.
    env["LOCALLLM_TEST_PROBE_BUDGET"] = "0"
    with cli_home(tmp_path / "home", LOCALLLM_SPEED_PROBE_QUIET="1", **env) as cli:
        cli.ok("list")  # starts the daemon
        deadline = time.monotonic() + 240
        with cli.client() as client:
            while True:
                # /api/speed makes no plan: it answers at once whatever the probe does
                speed = client.speed("smollm2:135m")
                if (speed.get("predicted") or {}).get("decode"):
                    break
                # Not yet: it says why (a quiet moment awaited, or the probe running).
                assert speed["measuring"], speed
                assert "quiet moment" in speed["why"] or "measuring" in speed["why"], speed
                assert "other programs use" not in speed["why"], speed  # any load is quiet
                assert time.monotonic() < deadline, speed
                time.sleep(1)
        out = cli.ok("show", "smollm2:135m")
        assert re.search(r"decode\s+predicted \d+ tokens/s", out), out
        assert re.search(r"prefill\s+predicted \d+ tokens/s", out), out
        assert list((cache / "localllm" / "speed-probe").glob("*.json"))


@pytest.mark.slow
@pytest.mark.anyio
async def test_the_models_pane_says_what_the_probe_waits_for_then_predicts(
    tmp_path: Path,
) -> None:
    """On a busy machine the probe waits and the TUI's model pane says so; once this machine's
    figures exist (here written as `doctor` would), the pane shows the prediction by itself."""
    from test_daemon_support import busy_processes, running_daemon
    from test_tui_support import make_app, wait_for
    from textual.widgets import DataTable, Markdown

    from localllm.tui.screens.models import ModelsScreen

    cache = tmp_path / "cache"
    # Enough spinners to be over the quiet share (LOCALLLM_SPEED_PROBE_QUIET's 0.2 of the
    # cores), no more: one on a 2-core machine, where a spinner per core took both cores
    # from the rest of the suite for the whole test.
    spinners = int(Settings().speed_probe_quiet * len(allowed_cpus())) + 1
    busy = contextlib.ExitStack()
    with pytest.MonkeyPatch.context() as patch, busy:
        busy.enter_context(busy_processes(spinners))
        patch.setenv("XDG_CACHE_HOME", str(cache))
        with running_daemon(tmp_path / "home", num_threads=1, speed_probe="on") as daemon:
            app = make_app(daemon, tmp_path / "tui")
            async with app.run_test(size=(100, 30)) as pilot:
                await wait_for(pilot, lambda: app.connection == "connected", "the connection")
                await pilot.press("f3")
                screen = await wait_for(
                    pilot, lambda: isinstance(app.screen, ModelsScreen) and app.screen, "models"
                )
                await wait_for(pilot, lambda: screen.models, "the model list")
                table = screen.query_one(DataTable)
                names = [m["name"] for m in screen.models]
                table.move_cursor(row=names.index("smollm2:135m"))
                details = screen.query_one("#details", Markdown)
                # (asked again every few seconds: the first answer may still be reading)
                await wait_for(pilot, lambda: "other programs use" in details.source, "the reason")
                assert "quiet moment" in details.source
                busy.close()  # the spinners have done their part (a core each, until now)
                seed_calibration(cache, threads=1)
                await wait_for(
                    pilot, lambda: "predicted" in details.source, "the prediction", timeout=30
                )


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
