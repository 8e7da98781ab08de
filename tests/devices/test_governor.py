"""The CPU governor's decisions, from injected CPU readings and step times (no llama.cpp)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from localllm.daemon.devices.cpubudget import shares
from localllm.daemon.devices.governor import Governor, demand
from localllm.daemon.devices.procfs import CpuReading, busy_seconds

SAMPLE_S = 0.25


@dataclass
class Machine:
    """A clock and CPU counters the test moves: other processes want ``others`` cores; the
    runner's threads spin, so the scheduler shares the CPUs among everyone runnable."""

    cpus: int = 2
    now: float = 1000.0
    busy: float = 0.0
    own_total: float = 0.0
    others: float = 0.0
    readable: bool = True

    def clock(self) -> float:
        return self.now

    def read(self) -> CpuReading | None:
        return (
            CpuReading(at=self.now, busy=self.busy, own=self.own_total) if self.readable else None
        )

    def advance(self, seconds: float, threads: int) -> None:
        self.now += seconds
        wanted = threads + self.others
        share = min(1.0, self.cpus / wanted) if wanted else 1.0
        self.busy += (self.others * share + threads * share) * seconds
        self.own_total += threads * share * seconds


def governor(machine: Machine, max_threads: int = 2, **kwargs: object) -> Governor:
    return Governor(
        max_threads,
        cpus=frozenset(range(machine.cpus)),
        reader=machine.read,
        clock=machine.clock,
        wall_clock=machine.clock,
        **kwargs,  # type: ignore[arg-type]
    )


def step(
    gov: Governor,
    machine: Machine,
    seconds_at: dict[int, float],
    kind: str = "decode",
    tokens: int = 1,
) -> int:
    """One step: the count the governor picks, timed as ``seconds_at`` says for it."""
    threads = gov.threads(kind)  # type: ignore[arg-type]
    seconds = seconds_at[threads] * tokens
    machine.advance(seconds, threads)
    gov.observe(kind, threads, tokens, seconds)  # type: ignore[arg-type]
    return threads


# Per-token step time by thread count on an idle 2-core machine (2 threads faster), and beside
# a busy process (2 threads wait at every barrier).
IDLE = {1: 0.014, 2: 0.009}
BUSY = {1: 0.015, 2: 0.5}


def run_for(gov: Governor, machine: Machine, seconds: float, times: dict[int, float]) -> list[int]:
    end = machine.now + seconds
    counts = []
    while machine.now < end:
        counts.append(step(gov, machine, times))
    return counts


def test_an_idle_machine_keeps_every_thread_and_trials_cost_little() -> None:
    machine = Machine()
    gov = governor(machine)
    counts = run_for(gov, machine, 60.0, IDLE)
    assert gov.state().decode == 2
    assert gov.state().limit == "max"
    # The tuner tried one thread now and then and gave up at once each time, less and less often.
    trials = counts.count(1)
    assert 1 <= trials <= 12
    assert gov.changes == 0


def test_a_busy_process_takes_a_thread_away_and_its_end_gives_it_back() -> None:
    machine = Machine()
    gov = governor(machine)
    run_for(gov, machine, 2.0, IDLE)
    machine.others = 1.0  # python -c 'while True: pass' beside the runner
    counts = run_for(gov, machine, 3.0, BUSY)
    state = gov.state()
    assert state.decode == 1
    assert state.limit == "cpu"
    assert state.reason == "CPU busy: other processes need 1.0 of 2 cores"
    # The change says what the reading that made it said (half a second, half of it busy).
    assert state.last_change is not None
    assert state.last_change.startswith("2 → 1: CPU busy: other processes need ")
    # At most one slow step at 2 threads before the next reading (a quarter second) noticed.
    assert counts[:3].count(2) <= 1 and set(counts[3:]) == {1}
    machine.others = 0.0
    counts = run_for(gov, machine, 2.0, IDLE)
    state = gov.state()
    assert state.decode == 2
    assert state.last_change == "1 → 2: CPU free again"
    # Up only once two readings in a row agree: the first quiet quarter second stays at 1.
    assert counts[0] == 1 and counts[-1] == 2


@pytest.mark.parametrize(
    ("others", "decode", "batch"),
    [
        (0.0, 2, 2),  # idle
        (0.2, 2, 2),  # 2 threads still decoded 1.18x faster than 1 (measured)
        (0.3, 2, 2),  # 1.17x
        (0.6, 1, 2),  # decode: 0.86x with 2 threads beside 0.5; prefill still 1.12x
        (0.7, 1, 2),  # prefill 1.29x
        (1.0, 1, 1),  # a busy process: decode 0.03x, prefill 0.54x with 2 threads
        (3.0, 1, 1),  # more than the machine: never below one
    ],
)
def test_the_cores_other_processes_need_decide_each_kinds_count(
    others: float, decode: int, batch: int
) -> None:
    machine = Machine(others=others)
    gov = governor(machine)
    for _ in range(200):
        step(gov, machine, {1: 0.01, 2: 0.01})
        step(gov, machine, {1: 0.001, 2: 0.001}, kind="batch", tokens=10)
    state = gov.state()
    assert (state.decode, state.batch) == (decode, batch)
    # What they need, though beside two spinning threads they got less of it.
    assert state.others == pytest.approx(min(others, 2.0), abs=0.08)


def test_what_others_need_is_told_from_what_they_got_beside_spinning_threads() -> None:
    assert demand(0.67, 2.0, 2) == pytest.approx(1.0, abs=0.01)
    assert demand(1.0, 1.0, 2) == 1.0  # everyone fit: they got what they wanted
    assert demand(0.3, 0.2, 2) == 0.3
    assert demand(0.94, 16.0, 16) == pytest.approx(1.0, abs=0.01)


def test_a_many_core_machine_finds_the_fastest_count_when_fewer_threads_are_faster() -> None:
    # Decode bound by memory bandwidth: 6 threads beat 8 (barriers cost, bandwidth is spent).
    times = {8: 0.0115, 7: 0.0107, 6: 0.0100, 5: 0.0106, 4: 0.0118, 3: 0.015, 2: 0.02, 1: 0.04}
    machine = Machine(cpus=8)
    gov = governor(machine, max_threads=8)
    run_for(gov, machine, 120.0, times)
    state = gov.state()
    assert state.decode == 6
    assert state.limit == "tuner"
    assert state.last_change is not None and state.last_change.startswith(
        "7 → 6: faster: 10.0 against 10.7"
    )
    # Prefill is governed apart: it was never tried, it keeps all 8.
    assert state.batch == 8


def idle(gov: Governor, machine: Machine, seconds: float) -> None:
    """The engine waits for work: it wakes when the governor wants a reading."""
    end = machine.now + seconds
    while machine.now < end:
        wait = gov.idle_wait()
        assert wait is not None
        machine.advance(max(wait, 0.001), 0)
        gov.tick()


def test_readings_go_on_while_idle_so_a_late_request_starts_on_current_ones() -> None:
    machine = Machine()
    gov = governor(machine)
    machine.others = 1.0
    run_for(gov, machine, 2.0, BUSY)
    assert gov.state().decode == 1
    idle(gov, machine, 5.0)  # the busy process runs on a while, then ends
    machine.others = 0.0
    idle(gov, machine, 60.0)
    # The first step of the next request already has every thread back.
    assert step(gov, machine, IDLE) == 2
    assert gov.state().last_change == "1 → 2: CPU free again"
    # And the other way round: a process that started while the engine was idle.
    machine.others = 1.0
    idle(gov, machine, 3.0)
    assert step(gov, machine, BUSY) == 1


def test_idle_readings_slow_down_after_a_while() -> None:
    machine = Machine()
    gov = governor(machine)
    run_for(gov, machine, 1.0, IDLE)
    waits = []
    for _ in range(60):
        wait = gov.idle_wait()
        assert wait is not None
        waits.append(wait)
        machine.advance(max(wait, 0.001), 0)
        gov.tick()
    assert max(waits[:10]) <= SAMPLE_S  # the working pace at first
    assert waits[-1] == pytest.approx(1.0)  # then once a second
    assert governor(machine, fixed=True).idle_wait() is None


def test_the_daemons_share_caps_the_count_and_its_end_lifts_it() -> None:
    machine = Machine()
    gov = governor(machine)
    run_for(gov, machine, 1.0, IDLE)
    gov.set_budget(1, "sharing 2 cores with smollm2:135m-q8")
    step(gov, machine, IDLE)
    state = gov.state()
    assert (state.decode, state.budget, state.limit) == (1, 1, "budget")
    assert state.last_change == "2 → 1: sharing 2 cores with smollm2:135m-q8"
    gov.set_budget(2, "working alone")
    step(gov, machine, IDLE)
    assert gov.state().decode == 2
    assert gov.state().last_change == "1 → 2: working alone"


def test_contention_the_readings_cannot_see_is_found_from_the_step_times() -> None:
    machine = Machine(readable=False)  # no /proc/stat (or another container's load)
    gov = governor(machine)
    run_for(gov, machine, 2.0, IDLE)
    assert gov.state().decode == 2 and gov.state().others is None
    run_for(gov, machine, 10.0, BUSY)
    state = gov.state()
    assert state.decode == 1
    assert state.limit == "tuner"
    assert state.last_change is not None and "faster" in state.last_change


def test_batch_steps_and_decode_steps_are_governed_apart() -> None:
    machine = Machine()
    gov = governor(machine)
    machine.others = 1.0
    for _ in range(20):
        step(gov, machine, BUSY, kind="batch", tokens=64)
    assert gov.state().batch == 1
    assert gov.state().decode == 2  # no decode step ran yet: nothing decided for it
    step(gov, machine, BUSY)
    assert gov.state().decode == 1


def test_a_fixed_count_never_moves_but_the_readings_are_reported() -> None:
    machine = Machine(others=1.0)
    gov = governor(machine, fixed=True, fixed_reason="fixed at 2 (num_thread)")
    assert {step(gov, machine, BUSY) for _ in range(10)} == {2}
    gov.set_budget(1, "sharing")
    assert step(gov, machine, BUSY) == 2
    state = gov.state()
    assert (state.mode, state.limit, state.reason) == ("fixed", "fixed", "fixed at 2 (num_thread)")


def test_proc_stat_lines_of_the_allowed_cpus_count_every_busy_column() -> None:
    lines = [
        "cpu  900 900 900 900 900 900 900 900 0 0",
        "cpu0 100 10 20 5000 7 3 2 5 40 0",  # user nice system idle iowait irq softirq steal
        "cpu1 200 0 0 6000 0 0 0 0 0 0",
        "cpu2 999 0 0 0 0 0 0 0 0 0",  # not ours
        "intr 12345",
    ]
    ticks = busy_seconds(lines, frozenset({0, 1}))
    assert ticks is not None
    assert ticks * 100 == pytest.approx(100 + 10 + 20 + 3 + 2 + 5 + 200)
    assert busy_seconds(lines, frozenset({7})) is None


def test_cores_are_shared_evenly_with_cpus_of_their_own() -> None:
    assert shares(["a"], 2, [0, 1], pin=True)[0].cpus is None
    a, b = shares(["a", "b"], 2, [0, 1], pin=True)
    assert (a.threads, a.cpus, b.threads, b.cpus) == (1, (0,), 1, (1,))
    assert a.reason == "sharing 2 cores with b" and b.reason == "sharing 2 cores with a"
    # SMT: 4 physical cores on 8 CPUs; three models
    x, y, z = shares(["x", "y", "z"], 4, list(range(8)), pin=True)
    assert (x.threads, y.threads, z.threads) == (2, 1, 1)
    assert (x.cpus, y.cpus, z.cpus) == ((0, 1, 2, 3), (4, 5), (6, 7))
    # More models than cores: one thread each, no CPUs of their own.
    many = shares(["a", "b", "c"], 2, [0, 1], pin=True)
    assert [s.threads for s in many] == [1, 1, 1] and {s.cpus for s in many} == {None}
    assert {s.cpus for s in shares(["a", "b"], 2, [0, 1], pin=False)} == {None}


def test_a_request_right_after_another_programs_burst_gets_every_thread_back() -> None:
    machine = Machine()
    gov = governor(machine)
    run_for(gov, machine, 1.0, IDLE)
    machine.others = 2.0  # a build, or llama-server answering, while the engine waits
    idle(gov, machine, 3.0)
    assert gov.cap("decode") == 1 and gov.cap("batch") == 1
    # Held down, the idle readings come every tenth of a second...
    assert gov.idle_wait() == pytest.approx(0.1, abs=0.01)
    machine.others = 0.0
    idle(gov, machine, 0.25)  # ...so the burst's end is seen before the next request comes
    assert step(gov, machine, IDLE) == 2
    assert step(gov, machine, IDLE, kind="batch", tokens=64) == 2
    assert gov.changes == 0  # no step ever ran on one thread


def test_held_down_batches_are_short_so_the_end_of_a_burst_lifts_the_count_soon() -> None:
    machine = Machine()
    gov = governor(machine)
    assert gov.batch_tokens() is None  # free: as many as fit
    machine.others = 1.0
    run_for(gov, machine, 0.5, BUSY)
    prompt = {1: 0.005, 2: 0.2}  # seconds per prompt token beside the busy process
    for _ in range(3):
        step(gov, machine, prompt, kind="batch", tokens=64)
    assert gov.state().batch == 1
    # 5 ms a token at one thread: a quarter second's worth
    assert gov.batch_tokens() == int(0.25 / 0.005)
    machine.others = 0.0
    machine.advance(0.15, 1)  # one held batch later, the fresh reading sees the end
    assert gov.batch_tokens() is None
    assert step(gov, machine, IDLE, kind="batch", tokens=512) == 2


def test_a_load_that_pauses_and_comes_back_does_not_make_the_count_flap() -> None:
    machine = Machine()
    gov = governor(machine)
    run_for(gov, machine, 1.0, IDLE)
    changes = []
    for _ in range(20):  # busy 0.4 s, quiet 0.3 s, over and over
        machine.others = 1.0
        run_for(gov, machine, 0.4, BUSY)
        machine.others = 0.0
        counts = run_for(gov, machine, 0.3, IDLE)
        changes.append(gov.changes)
    # The first pauses raise the count at once (a trial); lost trials make the next wait
    # longer, so later cycles change it far less than twice each.
    late = changes[-1] - changes[9]
    assert changes[1] >= 2 and late <= 6, changes
    assert counts  # the quiet spells still decode


def test_steps_right_after_a_burst_get_the_threads_back_within_a_reading_or_two() -> None:
    machine = Machine()
    gov = governor(machine)
    run_for(gov, machine, 1.0, IDLE)
    machine.others = 2.0
    idle(gov, machine, 3.0)
    machine.others = 0.0  # the burst ends and a request comes the same moment
    counts = run_for(gov, machine, 1.0, IDLE)
    # Before: half a second of readings had to agree. Now the first quiet tenth of a second
    # raises the count (a trial that holds).
    assert counts[-1] == 2 and counts.count(1) * IDLE[1] <= 0.25, counts.count(1)


def test_a_batch_right_after_a_burst_that_ended_gets_every_thread_if_nothing_else_runs() -> None:
    # The latest reading spans the others' burst (llama-server answering the request before
    # ours), but at the moment the prompt's step starts no other thread is runnable.
    for still_running, expected in ((0, 2), (1, 1)):
        machine = Machine()
        gov = governor(machine, runnable=lambda others=still_running: 1 + others)
        run_for(gov, machine, 1.0, IDLE)
        machine.others = 2.0
        machine.advance(0.2, 0)  # the burst, inside the next reading's interval
        machine.others = 0.0
        assert step(gov, machine, IDLE, kind="batch", tokens=8) == expected
        assert gov.cap("batch") == 1  # the readings themselves still say what they saw


def test_no_runnable_count_leaves_the_readings_alone() -> None:
    machine = Machine()
    gov = governor(machine, runnable=lambda: None)
    run_for(gov, machine, 1.0, IDLE)
    machine.others = 2.0
    machine.advance(0.2, 0)
    machine.others = 0.0
    assert step(gov, machine, IDLE, kind="batch", tokens=8) == 1


def test_a_first_batch_beside_a_load_that_comes_and_goes_gets_every_thread() -> None:
    # Something is always runnable at the looks (another server's OpenMP worker spinning after
    # its answer, or a load that is still on): only the load's rhythm tells them apart.
    def served_in_turn(last_burst: float) -> Governor:
        """Another server answers, then ours, then the other again (its load ended once)."""
        machine = Machine()
        gov = governor(machine, runnable=lambda: 3)
        run_for(gov, machine, 1.0, IDLE)
        machine.others = 2.0
        idle(gov, machine, 0.3)
        machine.others = 0.0
        run_for(gov, machine, 0.3, IDLE)
        machine.others = 2.0
        idle(gov, machine, last_burst)
        machine.others = 0.0
        gov.machine = machine  # type: ignore[attr-defined]
        return gov

    gov = served_in_turn(0.2)
    machine = gov.machine  # type: ignore[attr-defined]
    assert gov.cap("batch") == 1  # the latest reading holds the count down...
    assert step(gov, machine, IDLE, kind="batch", tokens=8) == 2  # ...but the load comes and goes
    # The prompt's next batch, with no idle gap before it, keeps the looks' verdict: a load
    # that came back costs at most one batch.
    machine.others = 2.0
    assert step(gov, machine, IDLE, kind="batch", tokens=8) == 1

    # A load that started and runs on (quiet, then busy) and one that never stopped.
    for before in (0.0, 1.0):
        machine = Machine(others=before)
        gov = governor(machine, runnable=lambda: 3)
        run_for(gov, machine, 1.0, IDLE if before == 0 else BUSY)
        machine.others = 1.0
        idle(gov, machine, 2.5)
        assert step(gov, machine, IDLE, kind="batch", tokens=8) == 1, before
