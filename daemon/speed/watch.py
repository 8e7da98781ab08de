"""The speed probe at the daemon's first quiet moment, so that predictions need no ``doctor``.

Predicted speeds (``show``, ``ps``, the TUI, ``show hf.co/...``) need this machine's figures
(:mod:`localllm.daemon.speed.probe`: 10-40 seconds of llama.cpp in a child process, cached per
build,
CPU and thread count). Until they exist, :class:`SpeedWatch` waits for a quiet moment and
measures them:

* **quiet** means no model loading, no request served or waiting (:attr:`.Scheduler.working`)
  and the machine using less than :data:`QUIET_SHARE` of the cores
  (``LOCALLLM_SPEED_PROBE_QUIET``; at 1, whatever other programs use), for :data:`QUIET_SPAN`
  seconds in a row (read from ``/proc/stat`` as the CPU governor reads it). The daemon's own
  work (its create, pull, hashing and quantizing children: its whole process tree,
  :func:`~localllm.daemon.devices.procfs.read_cpu_tree`) is not "other programs": the reason
  names it as the daemon's, and ``show`` waits for it to end instead of giving up at once;
  but the probe does not measure beside it either (it would measure the quantizer);
* **never in a request's way**: while the probe runs, work that comes in kills it at once
  (the child stops within a tenth of a second) and it is tried again at the next quiet
  moment; figures measured while other programs took more than :data:`QUIET_SHARE` of the
  cores are thrown away likewise (:func:`~localllm.daemon.speed.probe.calibrate`'s ``max_others``);
* figures that did not agree from round to round, or broke a sanity bound (a decode rate above
  the memory's, :class:`~localllm.daemon.speed.probe.ProbeUnsettled`), are not kept: the
  reason says "measured, not kept" and why, and the probe runs again at a later quiet moment
  (after a pause that doubles each time, up to :data:`UNSETTLED_PAUSE_S`); on a machine
  declared never quiet (``LOCALLLM_SPEED_PROBE_QUIET=1``) they are kept as measured;
* a probe that fails (llama.cpp crashed, say) is not retried: ``localllm doctor`` says why.

``show`` (``POST /api/plan``) waits for the figures up to :data:`SHOW_WAIT_S` while they are
being measured or the machine is quiet; otherwise it, ``/api/speed`` and ``ps`` say what the
probe is waiting for (:meth:`SpeedWatch.why`).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import threading
import time
from collections.abc import Callable

from localllm.settings import Settings

from ..devices.procfs import CpuReading, allowed_cpus, read_cpu_tree
from .model import Calibration

__all__ = [
    "QUIET_SHARE",
    "QUIET_SPAN",
    "SHOW_WAIT_S",
    "UNSETTLED_PAUSE_S",
    "ProbeState",
    "SpeedWatch",
]

log = logging.getLogger("localllm.speedwatch")

QUIET_SHARE = Settings.speed_probe_quiet
"""Of all cores: what other processes may use for the machine to count as quiet (on 2 cores,
0.4 of a core: an editor, a browser tab; not a build or a test run). The default of
``LOCALLLM_SPEED_PROBE_QUIET``, which a machine that is never quiet raises."""
QUIET_SPAN = 2.0
"""Seconds of quiet before the probe starts."""
_READ_S = 0.5
"""How often the readings are taken while waiting for quiet."""
SHOW_WAIT_S = 20.0
"""How long ``show`` waits for figures being measured (the client's own timeout is 30 s)."""
UNSETTLED_PAUSE_S = 600.0
"""The longest pause between probes whose figures did not agree."""


class ProbeState(enum.Enum):
    """Where the figures stand."""

    MEASURED = "measured"
    WAITING = "waiting"
    """For a quiet moment."""
    MEASURING = "measuring"
    FAILED = "failed"
    OFF = "off"
    """``LOCALLLM_SPEED_PROBE=off`` and nothing measured."""


Calibrate = Callable[..., Calibration]
""":func:`~localllm.daemon.speed.probe.calibrate`'s signature (injectable for tests)."""


class SpeedWatch:
    """Measures this machine's speed once, at the first quiet moment (see the module
    docstring). :meth:`run` is the daemon's background task; the rest is safe to call from
    any thread."""

    def __init__(
        self,
        settings: Settings,
        threads: int,
        working: Callable[[], bool],
        *,
        cached: Callable[[], Calibration | None],
        calibrate: Calibrate | None = None,
        reader: Callable[[], CpuReading | None] | None = None,
        cpus: int | None = None,
        quiet_span: float = QUIET_SPAN,
        interval: float = _READ_S,
        first_pause: float = 30.0,
    ) -> None:
        cpu_set = allowed_cpus()
        self._settings = settings
        self._threads = threads
        self._working = working
        self._cached = cached
        self._calibrate = calibrate
        self._reader = reader if reader is not None else (lambda: read_cpu_tree(cpu_set))
        self._cpus = cpus or len(cpu_set)
        self._quiet_span = quiet_span
        self._interval = interval
        self._state = ProbeState.WAITING if settings.speed_probe else ProbeState.OFF
        self._others: float | None = None
        """Cores other programs used in the last reading (the daemon's process tree not)."""
        self._own = 0.0
        """Cores the daemon's own process tree used in the last reading."""
        self._error = ""
        self._started = 0.0
        self._attempts = 0
        self._stopping = False
        self._not_kept = ""
        """Why the last probe's figures were not kept ("" when none was refused)."""
        self._unsettled = 0
        self._not_before = 0.0
        """No probe before this moment (monotonic): a pause after unsettled figures."""
        self._first_pause = first_pause
        self._settled = threading.Event()
        """Set once figures exist, or will not come (failed, off)."""

    # -- what the routes ask ---------------------------------------------------------------

    @property
    def state(self) -> ProbeState:
        """Where the figures stand now."""
        if self._cached() is not None:
            return ProbeState.MEASURED
        return self._state

    def wait(self, timeout: float) -> Calibration | None:
        """The figures, waiting up to ``timeout`` seconds while they are being measured or
        the machine is quiet enough to measure them; None at once while it is busy (blocking;
        not on the event loop)."""
        deadline = time.monotonic() + timeout
        while True:
            figures = self._cached()
            if figures is not None or self._state in (ProbeState.FAILED, ProbeState.OFF):
                return figures
            busy = self._working() or (
                self._others is not None and self._others > self._quiet_cores
            )
            left = deadline - time.monotonic()
            # (the daemon's own work is not a reason to give up: it is ours, and ends; a
            # pause after figures that were not kept is: nothing comes before it ends)
            pausing = time.monotonic() < self._not_before
            if (self._state is ProbeState.WAITING and (busy or pausing)) or left <= 0:
                return None  # the answer says what it waits for instead
            self._settled.wait(min(left, self._interval))

    def why(self) -> str:
        """Why there is no prediction (for ``show``, ``ps``, the TUI); "" once measured."""
        state = self.state
        if state is ProbeState.MEASURED:
            return ""
        if state is ProbeState.OFF:
            return (
                "this machine's speed is not measured yet (LOCALLLM_SPEED_PROBE=off): "
                "run `localllm doctor`"
            )
        if state is ProbeState.FAILED:
            return f"the speed probe failed ({self._error}): `localllm doctor` tries again"
        if state is ProbeState.MEASURING:
            ago = time.monotonic() - self._started
            return f"measuring this machine's speed now (started {ago:.0f} s ago, 10-40 s)"
        waiting = "this machine's speed is measured at the daemon's first quiet moment"
        if self._not_kept:
            waiting = (
                f"this machine's speed was {self._not_kept}; it is measured again at the "
                "next quiet moment"
            )
        if self._working():
            return f"{waiting}: models are working now"
        if self._others is not None and self._others > self._quiet_cores:
            return f"{waiting}: other programs use {self._others:.1f} of {self._cpus} cores now"
        if self._others is None:
            return f"{waiting}: reading the machine's load"
        if self._others + self._own > self._quiet_cores:
            return (
                f"{waiting}: the daemon's own work (a create, pull or quantize) uses "
                f"{self._own:.1f} of {self._cpus} cores now"
            )
        return f"{waiting}: about to start"

    @property
    def measuring(self) -> bool:
        """True while the figures may come soon (waiting for quiet or measuring)."""
        return self.state in (ProbeState.WAITING, ProbeState.MEASURING)

    # -- the background task --------------------------------------------------------------

    @property
    def _quiet_cores(self) -> float:
        share = self._settings.speed_probe_quiet
        # All of the cores means any load: a reading a hair above the core count (two reads
        # of /proc/stat a moment apart) must not hold the probe back.
        return math.inf if share >= 1.0 else share * self._cpus

    async def run(self) -> None:
        """Wait for a quiet moment and measure, until figures exist, the probe fails or the
        daemon stops (cancel the task: a probe running is killed)."""
        try:
            await self._run()
        finally:
            self._stopping = True
            self._settled.set()

    async def _run(self) -> None:
        if self._state is ProbeState.OFF or self._cached() is not None:
            return
        quiet_since: float | None = None
        last: CpuReading | None = None
        while self._cached() is None:
            reading = self._reader()
            now = time.monotonic()
            if reading is not None and last is not None and reading.at > last.at:
                span = reading.at - last.at
                own = max(0.0, reading.own - last.own)
                self._others = max(0.0, (reading.busy - last.busy) - own) / span
                self._own = own / span
            elif reading is None:
                self._others = 0.0  # no /proc/stat: quiet is judged by the daemon's work
            last = reading
            quiet = (
                not self._working()
                and self._others is not None
                and self._others + self._own <= self._quiet_cores
            )
            quiet = quiet and now >= self._not_before
            quiet_since = (quiet_since or now) if quiet else None
            if quiet_since is not None and now - quiet_since >= self._quiet_span:
                if await self._measure():
                    return
                quiet_since, last = None, None
            await asyncio.sleep(self._interval)

    async def _measure(self) -> bool:
        """One attempt; True when it settled (figures, or a failure not worth retrying)."""
        from .probe import ProbeFailed, ProbeInterrupted, ProbeUnsettled, calibrate

        self._state = ProbeState.MEASURING
        self._started = time.monotonic()
        self._attempts += 1
        log.info("measuring this machine's speed (attempt %d)", self._attempts)
        run = self._calibrate or calibrate

        def cancelled() -> bool:
            return self._stopping or self._working()

        try:
            figures = await asyncio.to_thread(
                run,
                self._settings,
                threads=self._threads,
                cancelled=cancelled,
                max_others=self._quiet_cores,
                # a machine declared never quiet keeps what it can measure (and says so)
                keep_unsettled=math.isinf(self._quiet_cores),
            )
        except ProbeInterrupted as exc:
            log.info("speed probe stopped: %s; tried again at a quieter moment", exc)
            self._state = ProbeState.WAITING
            if isinstance(exc, ProbeUnsettled):
                # Measured, but the figures did not agree: a machine that stays so unsteady
                # is not probed at every quiet moment (a probe costs seconds of CPU), but
                # after a pause that doubles each time, up to UNSETTLED_PAUSE_S.
                self._not_kept = str(exc)
                self._unsettled += 1
                pause = min(UNSETTLED_PAUSE_S, self._first_pause * 2 ** (self._unsettled - 1))
                self._not_before = time.monotonic() + pause
            return False
        except (ProbeFailed, OSError) as exc:
            log.warning("the speed probe failed: %s", exc)
            self._state, self._error = ProbeState.FAILED, str(exc)
            self._settled.set()
            return True
        self._state = ProbeState.MEASURED
        self._settled.set()
        log.info("measured this machine's speed in %.1f s: %s", figures.seconds, figures.describe())
        return True
