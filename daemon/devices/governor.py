"""The CPU governor: how many threads each llama.cpp decode of a runner gets, decided between
steps from what the machine gives now.

Why it exists: llama.cpp's CPU backend (built with OpenMP, as pip builds it) computes a graph
with a team of threads that meet at a barrier after every operation, hundreds of times per
token, and OpenMP's threads spin while they wait there. When another program takes a core
from one of the team, the others spin until the scheduler runs it again. On 2 cores beside one
busy process, decoding SmolLM2-135M with 2 threads fell from ~110 to ~1 token/s, while one
thread kept ~70: a thread too many costs a hundred times more than one too few. A nice 19
process did the same harm (the scheduler still gives it slices), so niced time counts as busy.

The count is the smallest of three things:

1. **The most this runner may use**: its thread count (the cores it may run on, or what the
   settings or the request asked for) and the share the daemon gives it while other runners
   work at the same time (:meth:`Governor.set_budget`).
2. **What the machine gives now**: the cores other processes need, from the CPU time they
   (and the hypervisor's steal) took on the CPUs this process may run on (``/proc/stat`` less
   this process's own CPU time), read every quarter second while the engine works and every
   second while it waits for work (so that a request arriving after a quiet minute starts on
   the last second, not on the minute's average). Beside threads that spin, others get less
   than they want (a busy process beside two spinning threads on 2 cores gets 0.67 of a core):
   what they need is solved from what they got (:func:`demand`). The count is the cores left
   plus an allowance, by kind of step (``_ALLOWANCE``: decode 0.45, prefill 0.85 of a core,
   measured), rounded down. It goes down on the latest reading alone, and up only once half a
   second of readings allows it, with a margin, so that a moment of quiet does not bring back
   a count the next burst punishes. A batch (a prompt's step, decided once) that the latest
   interval holds down still gets every thread when no other thread is runnable at that
   moment (``/proc/loadavg``): the interval only says the others were busy some time in it,
   and a request sent right after another program's answer comes after its burst. A
   request's first batch gets them too when the others' load has ended once in the last two
   seconds (it comes and goes, as another server's answers do): what is still runnable then
   is most often that burst's end (an OpenMP worker spinning ~10 ms before it sleeps).
3. **What runs fastest**: where the first two leave room, an online tuner compares the time
   per token at the current count against one fewer (or one more, when it had chosen fewer
   than allowed) in short trials whose steps alternate between the two counts, and keeps the
   faster. On a many-core machine decode is bound by memory bandwidth and all cores are often
   slower than fewer; on this 2-core machine the trials keep 2 and back off (a trial every
   64, 128 ... 4,096 steps, ended after one step when the other count is clearly slower), so
   they cost nothing measurable. Steps several times slower than the best seen at the same
   count start a trial at once: contention the CPU readings cannot see (another container,
   no ``/proc/stat``) is found that way.

Decode steps (only generating tokens) and batch steps (with prompt tokens) are governed apart:
prefill is compute-bound and gains from threads that decode may not.

Everything here runs on the engine thread and does no I/O but reading ``/proc/stat`` at most
every ``_SAMPLE_S``; the readers and the clock are injectable for tests.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from ..runner.protocol import ThreadStats
from .procfs import CpuReading, allowed_cpus, read_cpu, runnable_now

__all__ = [
    "Governor",
    "Kind",
    "ThreadChange",
    "demand",
    "openmp_build",
]

Kind = Literal["decode", "batch"]
KINDS: tuple[Kind, ...] = ("decode", "batch")

_SAMPLE_S = 0.25
"""How often the CPU readings are taken while the engine works."""
_IDLE_SAMPLE_S = 1.0
"""How often the readings go on while the engine has been idle a while: a request arriving
after a quiet minute is decided on the last second, not on what the minute averaged (a busy
process that ended during it would otherwise hold a thread back for its first half second)."""
_IDLE_FAST_S = 10.0
"""For this long after the last step, readings go on at the working pace."""
_ALLOWANCE: dict[str, float] = {"decode": 0.45, "batch": 0.85}
"""Of a core, by kind of step: how much other processes may need of the cores a count takes
and still leave that count faster than one fewer. Measured on 2 cores (SmolLM2-135M, a load
busy a share of every 10 ms): two threads decoded faster than one beside loads of 0.2-0.4
(1.16-1.18x) and slower from 0.5 (0.86x; 0.03x beside a full busy process); prefill with two
threads stayed faster up to 0.7 (1.29x) and fell behind only beside a full one (0.54x)."""
_RAISE_MARGIN = 0.15
"""Going up needs this much more room than staying, so that a count does not flap."""
_RAISE_SPAN = 0.5
"""Seconds of readings that must allow more threads before the count goes up..."""
_QUICK_S = 0.1
"""...unless the latest reading, over at least this long, shows the others' time has stopped
growing: then the count goes up at once, as a trial (a request that follows another
program's burst, a build or a test run that just ended, must not run on one thread)."""
_QUICK_HOLD_S = 1.0
"""A quick raise undone within this long was a trial lost (a load that pauses and comes
back)..."""
_QUICK_BACKOFF_S = (2.0, 16.0)
"""...after which quick raises wait this long, doubling up to the second figure while they
keep losing; a quick raise that holds resets it."""
_HELD_IDLE_S = 0.1
"""How often the readings go on while the engine waits and other processes hold a count
down: the end of their burst is seen within this, before the next request comes."""
_ALONE_LOOKS = 6
_ALONE_GAP_S = 0.001
"""Before a batch that others' latest readings hold down: how many looks at the machine's
runnable threads, this far apart, may find it alone (see :meth:`Governor._alone_now`). With
llama-server and a second daemon answering in turn before each of the daemon's requests
(2 threads each), the first look found 3-5 runnable threads every time (the servers' spinning
OpenMP workers, the hand-over's own threads) and the count was down to this thread alone
within 1-5 ms in 13 of 14 rounds: at most ~5 ms spent, where the batch on one thread
instead of two costs tens."""
_RHYTHM_S = 2.0
_RHYTHM_BUSY = 0.5
_RHYTHM_QUIET = 0.25
_RHYTHM_GAP_S = 0.05
"""A load that comes and goes: within the last :data:`_RHYTHM_S` seconds, an interval where
others needed at least :data:`_RHYTHM_BUSY` of a core was followed by one where they needed
less than :data:`_RHYTHM_QUIET` (their load ended once already). A request's first batch,
after the engine idled at least :data:`_RHYTHM_GAP_S`, that such a load holds down gets every
thread even when the looks still see something runnable: what runs then is most often the
end of the burst (another server's OpenMP workers spin ~10 ms after its answer, longer than
the looks wait), which costs a two-thread batch a few ms, where one thread costs it tens. A
load that runs on (one busy process, a build) never shows the quiet interval after a busy one
and keeps the looks' verdict; one that came back costs one batch (a quarter second's worth of
prompt at one thread) on two threads beside it."""
_HELD_BATCH_S = 0.25
"""While other processes hold the batch count down, a batch holds about this many seconds of
prompt tokens (by the pace measured at that count), so that the count is decided again soon
after they stop, rather than a whole 512-token batch running on one thread..."""
_HELD_BATCH_TOKENS = (32, 64)
"""...never fewer tokens than the first figure; the second when no pace is known yet."""
_TRIAL_PAIRS = 4
"""Steps at each count in a tuner trial."""
_FIRST_TRIAL = 64
"""Steps before the first trial of each direction; doubled after each trial that loses."""
_LAST_TRIAL = 4096
"""The longest wait between trials of one direction."""
_MARGIN = 0.04
"""How much faster per token the other count must be, over a whole trial, to be kept."""
_ABANDON = 1.3
"""A trial ends at once when the other count's step is this much slower than the current: a
count that much slower cannot win (it must be faster by ``_MARGIN``), and on 2 idle cores one
thread decodes ~1.4x slower than two, so a trial there costs one slow step, not four."""
_SLOW = 3.0
"""A step this many times slower than the best seen at its count and size is suspect..."""
_SLOW_STEPS = 2
"""...and this many in a row start a trial of one thread fewer at once."""
_BEST_DRIFT = 1.002
"""The best time seen rises this much per step, so that it follows a context that grows."""


@dataclass(frozen=True)
class ThreadChange:
    """One change of a kind's thread count, for ``ps``, ``/metrics`` and the dashboard."""

    kind: Kind
    before: int
    after: int
    why: str
    """``CPU busy: other processes use 1.0 of 2 cores``, ``sharing the cores with ...``,
    ``CPU free again``, ``faster: 8.1 against 9.0 ms per token``."""
    at: float
    """Wall-clock time (seconds since the epoch)."""

    def describe(self) -> str:
        """``2 → 1: CPU busy (other processes use 1.0 of 2 cores)``."""
        return f"{self.before} → {self.after}: {self.why}"


def demand(used: float, ours: float, cpus: int) -> float:
    """How many cores other processes would use if they got all they wanted, from what they
    used (``used``) while this runner had ``ours`` threads runnable on average.

    While the runnable threads of everyone fit the CPUs, the others got what they wanted. Once
    they do not, the scheduler shares the CPUs among the runnable threads (and OpenMP's spin
    keeps ours runnable): the others get about ``demand x cpus / (ours + demand)``, which is
    solved for the demand. A busy process beside two spinning threads on 2 cores uses 0.67 of
    a core and needs 1.0.
    """
    if ours + used <= cpus - 0.05 or used >= cpus - 0.1:
        return min(used, float(cpus))
    return min(used * ours / (cpus - used), float(cpus))


def openmp_build(system_info: str) -> bool | None:
    """Whether llama.cpp was built with OpenMP, from its system info (``OPENMP = 1``); None
    when the info does not say."""
    for part in system_info.split("|"):
        name, _, value = part.partition("=")
        if name.strip().upper() == "OPENMP":
            return value.strip() == "1"
    return None


# -- the tuner --------------------------------------------------------------------------------


@dataclass
class _Trial:
    """Steps alternating between the current count and another one."""

    base: int
    other: int
    other_next: bool = True
    base_seconds: float = 0.0
    base_tokens: int = 0
    other_seconds: float = 0.0
    other_tokens: int = 0
    base_steps: int = 0
    other_steps: int = 0
    tokens: int = 0
    """The first step's batch size: steps far from it end the trial (not comparable)."""

    def count(self) -> int:
        return self.other if self.other_next else self.base


@dataclass
class _Tuner:
    """One kind's preferred count and its trials."""

    preferred: int
    trial: _Trial | None = None
    wait: dict[int, int] = field(default_factory=lambda: {-1: _FIRST_TRIAL, 1: _FIRST_TRIAL})
    """Steps between trials, by direction (doubled after each trial that loses)."""
    due: dict[int, int] = field(default_factory=lambda: {-1: _FIRST_TRIAL, 1: _FIRST_TRIAL})
    """Steps left before the next trial, by direction."""
    best: dict[tuple[int, int], float] = field(default_factory=dict)
    """Least seconds per token seen, by (threads, batch size class)."""
    slow: int = 0
    """Suspect steps in a row."""
    latest: float = 0.0
    """Seconds per token of the latest step outside trials (what a trial first compares)."""


def _size_class(tokens: int) -> int:
    return max(tokens, 1).bit_length()


# -- the governor -----------------------------------------------------------------------------


class Governor:
    """Decides each step's thread count; see the module docstring.

    ``fixed`` keeps ``max_threads`` whatever happens (a thread count the user asked for, or
    the governor turned off), but the budget and readings are still reported.
    """

    def __init__(
        self,
        max_threads: int,
        *,
        fixed: bool = False,
        fixed_reason: str = "",
        cpus: frozenset[int] | None = None,
        reader: Callable[[], CpuReading | None] | None = None,
        runnable: Callable[[], int | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.max_threads = max(1, max_threads)
        self.fixed = fixed
        self._fixed_reason = fixed_reason or "fixed"
        cpu_set = cpus if cpus is not None else allowed_cpus()
        self.cpus = max(1, len(cpu_set))
        """CPUs this process may run on (what the readings span)."""
        self._reader = reader if reader is not None else (lambda: read_cpu(cpu_set))
        if runnable is None:
            runnable = runnable_now if reader is None else (lambda: None)
        self._runnable = runnable
        """Threads runnable on the machine right now, this one included (None: unknown)."""
        self._clock = clock
        self._wall = wall_clock
        # One tuple, so that a reader on another thread never pairs a share with another
        # share's reason.
        self._budget: tuple[int, str] = (self.max_threads, "working alone")
        self._readings: list[CpuReading] = []
        self._next_sample = 0.0
        self._last_sample = 0.0
        self._last_step = 0.0
        self._step_end = 0.0
        """When the latest step ended (its observation)."""
        self.others: float | None = None
        self._cpu_cap: dict[Kind, int] = dict.fromkeys(KINDS, self.max_threads)
        self._cap_why = ""
        self._thread_seconds = 0.0
        """Threads x seconds of the decodes since the last reading (how many threads were
        runnable meanwhile, on average)."""
        self._window_threads: list[float] = []
        """That, for each interval between the readings kept."""
        self._quick_raised: dict[Kind, float | None] = dict.fromkeys(KINDS)
        """When each kind's cap last went up on a quick reading (None: it held, or none)."""
        self._quick_backoff = _QUICK_BACKOFF_S[0]
        self._quick_after = 0.0
        """No quick raise before this (on the injectable clock)."""
        self._rhythm: list[tuple[float, float]] = []
        """(end, what others needed) of the latest intervals, :data:`_RHYTHM_S` of them."""
        self._batch_pace: dict[int, float] = {}
        """Seconds per prompt token of the latest batch step at each count."""
        self._binding: dict[Kind, str] = dict.fromkeys(KINDS, "max")
        self._tuners = {kind: _Tuner(preferred=self.max_threads) for kind in KINDS}
        self._current: dict[Kind, int] = dict.fromkeys(KINDS, self.max_threads)
        self._why: dict[Kind, str] = dict.fromkeys(KINDS, "all cores")
        self.last_change: ThreadChange | None = None
        self.changes = 0
        self.on_change: Callable[[ThreadChange], None] | None = None
        """Called on the engine thread when a count changes (logging)."""

    # -- inputs ------------------------------------------------------------------------------

    def set_budget(self, threads: int, reason: str) -> None:
        """The daemon's share of the cores for this runner (at least 1); safe to call from any
        thread (it applies from the next step)."""
        self._budget = (max(1, threads), reason)

    @property
    def budget(self) -> int:
        """The daemon's share of the cores for this runner."""
        return self._budget[0]

    @property
    def budget_reason(self) -> str:
        """Why the daemon gave that share."""
        return self._budget[1]

    def observe(self, kind: Kind, threads: int, tokens: int, seconds: float) -> None:
        """One decode of ``tokens`` tokens took ``seconds`` with ``threads`` threads."""
        self._step_end = self._clock()
        if self.fixed or tokens <= 0 or seconds <= 0:
            return
        self._thread_seconds += threads * seconds
        tuner = self._tuners[kind]
        per_token = seconds / tokens
        if kind == "batch":
            self._batch_pace[threads] = per_token
        key = (threads, _size_class(tokens))
        best = tuner.best.get(key)
        if best is None or per_token < best:
            tuner.best[key] = per_token
        else:
            tuner.best[key] = best * _BEST_DRIFT
        trial = tuner.trial
        if trial is not None:
            self._trial_step(kind, tuner, trial, threads, tokens, seconds)
            return
        tuner.latest = per_token
        if best is not None and per_token > best * _SLOW and threads > 1:
            tuner.slow += 1
            if tuner.slow >= _SLOW_STEPS:
                tuner.slow = 0
                tuner.due[-1] = 0
        else:
            tuner.slow = 0
        # Only a trial that could run comes closer: none below one thread, none above the cap.
        if threads > 1:
            tuner.due[-1] -= 1
        if threads < self.cap(kind):
            tuner.due[1] -= 1

    # -- the decision ------------------------------------------------------------------------

    def threads(self, kind: Kind) -> int:
        """The thread count for the next decode of ``kind``."""
        if self.fixed:
            return self.max_threads
        now = self._clock()
        after_idle = now - self._step_end >= _RHYTHM_GAP_S
        self._last_step = now
        # A batch is long and decided once: it gets a fresh reading (see batch_tokens); while
        # others hold the count down, so does every step a tenth of a second on, so that the
        # end of their burst is seen at once.
        # (With one thread at most there is nothing to decide: no fresh reading before a batch,
        # which is a prompt's first step, where reading /proc/stat delayed the first token.)
        fresh = self.max_threads > 1 and (kind == "batch" or self._cpu_cap[kind] < self.max_threads)
        if now >= self._next_sample or (fresh and now - self._last_sample >= _QUICK_S):
            self._sample(now)
        cap = self.cap(kind)
        # The readings say others were busy in the last interval, but none is runnable now:
        # their burst is over (a request sent right after another program's, or another
        # server's, answer). A batch is decided once, so it gets every thread. So does a
        # request's first batch beside a load that comes and goes (see _RHYTHM_S), without
        # the looks' wait: what still runs is most likely its burst's end.
        if (
            kind == "batch"
            and cap < min(self.max_threads, self.budget)
            and ((after_idle and self._comes_and_goes()) or self._alone_now())
        ):
            cap = min(self.max_threads, self.budget)
        tuner = self._tuners[kind]
        count = min(tuner.preferred, cap)
        trial = tuner.trial
        if trial is not None:
            if trial.base == count and trial.other <= cap:
                return trial.count()
            tuner.trial = None  # the cap moved under it: no verdict
        if (other := self._due_trial(tuner, count, cap)) is not None:
            tuner.trial = _Trial(base=count, other=other)
            return other
        self._set(kind, count)
        return count

    def _alone_now(self) -> bool:
        """Whether no thread but the caller is runnable on the machine at this moment, read
        up to :data:`_ALONE_LOOKS` times a millisecond apart: the threads that just finished
        (another server's spinning OpenMP workers, the daemon's and the runner's threads that
        handed the request over) are often still running at the first look."""
        for look in range(_ALONE_LOOKS):
            if look:
                time.sleep(_ALONE_GAP_S)
            runnable = self._runnable()
            if runnable is None:
                return False
            if runnable <= 1:
                return True
        return False

    def _comes_and_goes(self) -> bool:
        """Whether the others' load ended at least once in the last :data:`_RHYTHM_S`: a busy
        interval followed by a quiet one (the latest, which holds the count down, aside)."""
        busy_seen = False
        for _, others in self._rhythm[:-1]:
            if others >= _RHYTHM_BUSY:
                busy_seen = True
            elif busy_seen and others < _RHYTHM_QUIET:
                return True
        return False

    def batch_tokens(self) -> int | None:
        """The most prompt tokens the next batch should hold (None: as many as fit), from a
        fresh reading: while other processes hold the batch count below what this runner
        may use, about :data:`_HELD_BATCH_S` of them, so that the end of their burst lifts
        the count within a batch or two."""
        if self.fixed or self.max_threads == 1:
            return None  # a batch cannot be held below one thread
        now = self._clock()
        if now - self._last_sample >= _QUICK_S:
            self._sample(now)
        held = self._cpu_cap["batch"]
        if held >= min(self.max_threads, self.budget):
            return None
        pace = self._batch_pace.get(held)
        if pace is None and self._batch_pace:
            # Not measured at this count yet: another count's pace, as if threads scaled.
            count, seconds = max(self._batch_pace.items())
            pace = seconds * count / held
        least, unknown = _HELD_BATCH_TOKENS
        return max(least, int(_HELD_BATCH_S / pace)) if pace else unknown

    def idle_wait(self) -> float | None:
        """While the engine waits for work: seconds until the next reading is due (None:
        none is needed), so that a request arriving later starts on current readings."""
        if self.fixed:
            return None
        now = self._clock()
        if min(self._cpu_cap.values()) < self.max_threads:
            pace = _HELD_IDLE_S  # others hold a count down: see the end of it at once
        elif now - self._last_step < _IDLE_FAST_S:
            pace = _SAMPLE_S
        else:
            pace = _IDLE_SAMPLE_S
        return max(0.0, self._last_sample + pace - now)

    def tick(self) -> None:
        """Take a reading while idle, when one is due (see :meth:`idle_wait`)."""
        if self.fixed:
            return
        wait = self.idle_wait()
        if wait is not None and wait <= 0.001:  # a timer may wake a hair early
            self._sample(self._clock())

    def cap(self, kind: Kind) -> int:
        """The most threads a step of ``kind`` may use now: the runner's own count, the
        daemon's budget and what other processes leave."""
        return max(1, min(self.max_threads, self.budget, self._cpu_cap[kind]))

    def _due_trial(self, tuner: _Tuner, count: int, cap: int) -> int | None:
        if tuner.due[-1] <= 0 and count > 1:
            return count - 1
        if tuner.due[1] <= 0 and count < cap:
            # One more than the tuner chose (the caps allow more, so the tuner holds it).
            return count + 1
        return None

    def _trial_step(
        self, kind: Kind, tuner: _Tuner, trial: _Trial, threads: int, tokens: int, seconds: float
    ) -> None:
        if threads not in (trial.base, trial.other):
            tuner.trial = None
            return
        if trial.tokens == 0:
            trial.tokens = tokens
        elif not trial.tokens / 2 <= tokens <= trial.tokens * 2:
            tuner.trial = None  # a batch of another size: not comparable; try again later
            for direction in (-1, 1):
                tuner.due[direction] = min(tuner.due[direction], _FIRST_TRIAL)
            return
        if threads == trial.other:
            trial.other_seconds += seconds
            trial.other_tokens += tokens
            trial.other_steps += 1
            # Against the current count's steps in this trial, or the step just before it.
            reference = (
                trial.base_seconds / trial.base_tokens if trial.base_tokens else tuner.latest
            )
            if reference > 0 and seconds / tokens > reference * _ABANDON:
                self._end_trial(kind, tuner, trial, won=False)
                return
        else:
            trial.base_seconds += seconds
            trial.base_tokens += tokens
            trial.base_steps += 1
        trial.other_next = not trial.other_next
        if trial.base_steps >= _TRIAL_PAIRS and trial.other_steps >= _TRIAL_PAIRS:
            base = trial.base_seconds / trial.base_tokens
            other = trial.other_seconds / trial.other_tokens
            self._end_trial(
                kind, tuner, trial, won=other < base * (1 - _MARGIN), times=(other, base)
            )

    def _end_trial(
        self,
        kind: Kind,
        tuner: _Tuner,
        trial: _Trial,
        won: bool,
        times: tuple[float, float] | None = None,
    ) -> None:
        tuner.trial = None
        direction = 1 if trial.other > trial.base else -1
        if won:
            tuner.preferred = trial.other
            tuner.wait = {-1: _FIRST_TRIAL, 1: _FIRST_TRIAL}
            tuner.due = dict(tuner.wait)
            other, base = times if times is not None else (0.0, 0.0)
            self._set(
                kind,
                trial.other,
                f"faster: {other * 1000:.1f} against {base * 1000:.1f} ms per token",
            )
            return
        tuner.wait[direction] = min(tuner.wait[direction] * 2, _LAST_TRIAL)
        tuner.due[direction] = tuner.wait[direction]

    def _sample(self, now: float) -> None:
        self._next_sample = now + _SAMPLE_S
        self._last_sample = now
        reading = self._reader()
        if reading is None:
            self.others = None
            self._cpu_cap = dict.fromkeys(KINDS, self.max_threads)
            return
        readings, threads = self._readings, self._window_threads
        if readings and reading.at - readings[-1].at > 4 * _SAMPLE_S:
            # The engine was idle: the span since says what happened meanwhile, on average;
            # only the last reading of it is kept.
            del readings[:-1]
            threads.clear()
        if readings:
            threads.append(self._thread_seconds)
        self._thread_seconds = 0.0
        readings.append(reading)
        if len(readings) < 2:
            return
        # The window: the newest reading at least _RAISE_SPAN old and those after it (the
        # readings come every quarter second while working, every tenth while held down).
        first = next(
            (
                i
                for i in range(len(readings) - 2, -1, -1)
                if reading.at - readings[i].at >= _RAISE_SPAN
            ),
            0,
        )
        del readings[:first]
        del threads[:first]
        # Down on the latest interval alone (a busy process costs most at once), up on the
        # whole window, or at once on a latest interval that shows the others stopped.
        latest = self._others(readings[-2], readings[-1], threads[-1])
        window = self._others(readings[0], readings[-1], sum(threads))
        if latest is None or window is None:
            return
        self.others = window
        rhythm = self._rhythm
        rhythm.append((reading.at, latest))
        while reading.at - rhythm[0][0] > _RHYTHM_S:
            del rhythm[0]
        span = readings[-1].at - readings[0].at
        latest_span = readings[-1].at - readings[-2].at
        for kind in KINDS:
            self._cap_kind(kind, latest, window, span, latest_span, now)

    def _others(self, first: CpuReading, last: CpuReading, thread_seconds: float) -> float | None:
        span = last.at - first.at
        if span <= 0:
            return None
        used = max(0.0, ((last.busy - first.busy) - (last.own - first.own)) / span)
        return demand(used, thread_seconds / span, self.cpus)

    def _cap_kind(
        self,
        kind: Kind,
        latest: float,
        window: float,
        span: float,
        latest_span: float,
        now: float,
    ) -> None:
        cap = max(1, min(self.max_threads, math.floor(self.cpus - latest + _ALLOWANCE[kind])))
        raised = self._quick_raised[kind]
        if cap < self._cpu_cap[kind]:
            self._cpu_cap[kind] = cap
            self._cap_why = f"CPU busy: other processes need {latest:.1f} of {self.cpus} cores"
            # The readings explain the slow steps: no trial is owed for them.
            tuner = self._tuners[kind]
            tuner.slow = 0
            tuner.due[-1] = max(tuner.due[-1], tuner.wait[-1])
            if raised is not None and now - raised < _QUICK_HOLD_S:
                # The quick raise lost: the load pauses and comes back. Wait before the next.
                self._quick_after = now + self._quick_backoff
                self._quick_backoff = min(self._quick_backoff * 2, _QUICK_BACKOFF_S[1])
            self._quick_raised[kind] = None
            return
        if raised is not None and now - raised >= _QUICK_HOLD_S:
            self._quick_raised[kind] = None
            self._quick_backoff = _QUICK_BACKOFF_S[0]  # it held
        room = self.cpus - window + _ALLOWANCE[kind] - _RAISE_MARGIN
        raise_to = max(1, min(self.max_threads, math.floor(room)))
        if raise_to > self._cpu_cap[kind] and span >= _RAISE_SPAN:
            self._cpu_cap[kind] = raise_to
            return
        quick = self.cpus - latest + _ALLOWANCE[kind] - _RAISE_MARGIN
        quick_to = max(1, min(self.max_threads, math.floor(quick)))
        if quick_to > self._cpu_cap[kind] and latest_span >= _QUICK_S and now >= self._quick_after:
            self._cpu_cap[kind] = quick_to
            self._quick_raised[kind] = now

    def _set(self, kind: Kind, count: int, why: str | None = None) -> None:
        before = self._current[kind]
        binding = "tuner" if why is not None else self._binding_limit(kind, count)
        if count == before:
            self._binding[kind] = binding
            if binding == "cpu" and self.others is not None:
                self._why[kind] = (  # the latest reading
                    f"CPU busy: other processes need {self.others:.1f} of {self.cpus} cores"
                )
            return
        if why is None:
            why = self._limit_reason(binding, self._binding[kind])
        self._binding[kind] = binding
        self._current[kind] = count
        self._why[kind] = why
        change = ThreadChange(kind=kind, before=before, after=count, why=why, at=self._wall())
        self.last_change = change
        self.changes += 1
        if self.on_change is not None:
            self.on_change(change)

    def _binding_limit(self, kind: Kind, count: int) -> str:
        """What holds the count where it is: ``max``, ``budget``, ``cpu`` or ``tuner``."""
        if count >= self.max_threads:
            return "max"
        if count == self._cpu_cap[kind] and self._cpu_cap[kind] <= self.budget:
            return "cpu"
        if count == self.budget:
            return "budget"
        return "tuner"

    def _limit_reason(self, binding: str, before: str) -> str:
        if binding == "cpu":
            return self._cap_why
        if binding == "budget":
            return self.budget_reason
        if binding == "tuner":
            return "fewer threads ran faster"
        # Back to all of them: say what let go.
        if before == "budget":
            return self.budget_reason
        if before == "cpu":
            return "CPU free again"
        return "all cores"

    # -- reports -----------------------------------------------------------------------------

    def explain(self, kind: Kind, count: int) -> str:
        """Why a step of ``kind`` ran with ``count`` threads (the current reason, or a
        tuner's trial)."""
        if self.fixed or count == self._current[kind]:
            return self._fixed_reason if self.fixed else self._why[kind]
        return f"a tuning trial of {count} threads"

    def state(self) -> ThreadStats:
        """A snapshot for stats."""
        last = self.last_change
        fixed = self.fixed
        return ThreadStats(
            decode=self.max_threads if fixed else self._current["decode"],
            batch=self.max_threads if fixed else self._current["batch"],
            max=self.max_threads,
            budget=self.budget,
            budget_reason=self.budget_reason,
            others=None if self.others is None else round(self.others, 2),
            mode="fixed" if fixed else "auto",
            reason=self._fixed_reason if fixed else self._why["decode"],
            limit="fixed" if fixed else self._binding["decode"],  # type: ignore[arg-type]
            last_change=None if last is None else last.describe(),
            last_change_at=None if last is None else last.at,
            changes=self.changes,
        )
