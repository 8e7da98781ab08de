"""Whether the speed probe's figures can be trusted: they agree when measured again, and they
stay within what the machine can do.

* **Agreement** (:func:`settle`, in the probe's child): each figure is timed in rounds after a
  warm-up; it is kept when the best :data:`ROUNDS` rounds agree within :data:`SPREAD` (a busy
  moment only ever makes a round slower, so the best rounds are the machine's), and more
  rounds are run, up to :data:`MAX_ROUNDS`, while they do not. A figure that never agrees is
  reported as unstable.
* **Bounds** (:func:`implausible`, in the daemon): no weight type decodes faster than memory
  gives (a faster figure measured a cache, not memory), and no batch multiplies faster than
  the cores' arithmetic allows (:func:`~localllm.daemon.devices.cpuspec.peak_ops`).

Figures that fail either are not kept: the probe says why and is tried again at the next quiet
moment (:mod:`localllm.daemon.speed.watch`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .model import Calibration

__all__ = [
    "BANDWIDTH_MARGIN",
    "MAX_ROUNDS",
    "PEAK_MARGIN",
    "ROUNDS",
    "SPREAD",
    "Settled",
    "implausible",
    "settle",
]

ROUNDS = 3
"""Rounds whose figures must agree."""
MAX_ROUNDS = 8
"""Rounds at most before a figure is called unstable."""
SPREAD = 0.08
"""How far the agreeing rounds may be apart: (slowest - fastest) / fastest. Tighter than the
±10 % that fresh probes must agree within, since each probe keeps its fastest."""
BANDWIDTH_MARGIN = 1.2
"""How far a weight type's decode may be above the memory bandwidth the probe measured with
numpy: the two readings' own noise, not a cache."""
PEAK_MARGIN = 2.0
"""How far a batch may be above the cores' nominal arithmetic (boost clocks above the one
the system reports)."""


@dataclass(frozen=True)
class Settled:
    """One figure timed in rounds."""

    value: float
    """The fastest round (seconds)."""
    spread: float
    """(slowest - fastest) / fastest of the best :data:`ROUNDS` rounds."""
    rounds: int
    """Rounds run."""
    stable: bool
    """Whether the best rounds agreed within the spread allowed."""


def settle(
    measure: Callable[[], float],
    *,
    rounds: int = ROUNDS,
    max_rounds: int = MAX_ROUNDS,
    spread: float = SPREAD,
) -> Settled:
    """Seconds of ``measure`` (one round, warmed up by the caller) run ``rounds`` times, then
    once more at a time until the best ``rounds`` agree within ``spread`` or ``max_rounds``
    have run."""
    seconds = [measure() for _ in range(rounds)]
    while True:
        best = sorted(seconds)[:rounds]
        apart = (best[-1] - best[0]) / best[0] if best[0] > 0 else float("inf")
        if apart <= spread or len(seconds) >= max_rounds:
            return Settled(best[0], apart, len(seconds), apart <= spread)
        seconds.append(measure())


def implausible(figures: Calibration, peak: float | None) -> list[str]:
    """What in ``figures`` cannot be true on this machine, one sentence each (empty: nothing):
    a decode rate above the memory bandwidth, a prefill rate above ``peak`` operations per
    second (the cores' arithmetic; None: not known, not bounded)."""
    problems = []
    memory = figures.bandwidth
    for name, rate in figures.types.items():
        if memory > 0 and rate.decode > memory * BANDWIDTH_MARGIN:
            problems.append(
                f"{name} decode {rate.decode / 1e9:.1f} GB/s is above what memory gives "
                f"({memory / 1e9:.1f} GB/s): it measured a cache, not memory"
            )
        if peak is not None and rate.prefill > peak * PEAK_MARGIN:
            problems.append(
                f"{name} prefill {rate.prefill / 1e9:.0f} GFLOP/s is above what "
                f"{figures.threads} cores can compute ({peak / 1e9:.0f} GFLOP/s)"
            )
    return problems
