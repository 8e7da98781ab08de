"""Where llama.cpp's workers wake for a prompt's step (daemon/devices/spread.py): off the
engine thread's CPU for the decode, on every CPU again after it; found among the process's
threads with real llama.cpp."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from speculative_runs import Run, options
from tiny_gguf import write_tiny_gguf

from localllm.daemon.devices.spread import WorkerSpread, native_threads
from localllm.daemon.engine.model import LlamaModel
from localllm.daemon.runner.protocol import RunnerConfig

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs per-thread affinity and two CPUs this process may use",
)


@pytest.fixture
def sleeper() -> Iterator[int]:
    """A thread that waits (as an OpenMP worker between decodes); its id."""
    release = threading.Event()
    thread = threading.Thread(target=release.wait, args=(30,))
    thread.start()
    assert thread.native_id is not None
    yield thread.native_id
    release.set()
    thread.join()


def test_a_worker_runs_off_the_engine_threads_cpu_for_a_step_and_anywhere_after(
    sleeper: int,
) -> None:
    allowed = os.sched_getaffinity(0)
    cpu = min(allowed)
    spread = WorkerSpread(tasks=lambda: [sleeper], current_cpu=lambda: cpu)
    with spread.apart(2):
        assert os.sched_getaffinity(sleeper) == allowed - {cpu}
    assert os.sched_getaffinity(sleeper) == allowed
    assert spread.moved == 1
    with pytest.raises(RuntimeError), spread.apart(2):  # a failed decode gives them back too
        raise RuntimeError("llama_decode failed")
    assert os.sched_getaffinity(sleeper) == allowed
    with spread.apart(1):  # one thread: no team to wake
        assert os.sched_getaffinity(sleeper) == allowed
    assert spread.moved == 2


def test_threads_that_ended_or_an_unknown_cpu_change_nothing(sleeper: int) -> None:
    allowed = os.sched_getaffinity(0)
    gone = WorkerSpread(tasks=lambda: [2**22 + 1], current_cpu=lambda: min(allowed))
    with gone.apart(2):  # no such thread: nothing moved, nothing raised
        pass
    assert gone.moved == 0
    unknown = WorkerSpread(tasks=lambda: [sleeper], current_cpu=lambda: -1)
    with unknown.apart(2):
        assert os.sched_getaffinity(sleeper) == allowed
    assert unknown.moved == 0


def test_the_real_reader_names_a_cpu_this_thread_may_run_on() -> None:
    spread = WorkerSpread()
    assert spread.available
    assert spread._current_cpu is not None
    assert spread._current_cpu() in os.sched_getaffinity(0)
    assert threading.get_native_id() not in native_threads()


def test_llama_cpps_workers_are_moved_for_a_prompts_step_and_given_back(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    model = LlamaModel(
        RunnerConfig(
            model_path=str(path), n_slots=1, n_ctx_per_slot=256, n_threads=2, fixed_threads=True
        )
    )
    try:
        job = [("first", "The keeper counted the ships", options(num_predict=4))]
        Run(model, num_draft=0).run(job)  # two threads: llama.cpp's workers now exist
        workers = native_threads()
        assert workers, "a two-thread decode leaves worker threads in the process"
        again = Run(model, num_draft=0)
        again.run([("second", "The keeper counted the ships again", options(num_predict=4))])
        assert again.engine.spread.moved >= 1  # the prompt's step moved them ...
        allowed = os.sched_getaffinity(0)
        checked = 0
        for worker in native_threads():  # ... and gave every CPU back after it
            try:
                assert os.sched_getaffinity(worker) == allowed
            except ProcessLookupError:  # a native thread of another library that just ended
                continue
            checked += 1
        assert checked
    finally:
        model.close()
