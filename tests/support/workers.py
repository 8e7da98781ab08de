"""The suite on every core: how many pytest-xdist workers, and tests that run alone.

pyproject's addopts run the suite with pytest-xdist (``-n auto``): one worker more than the
cores this process may use, at most :data:`MAX_WORKERS` (each worker's daemons start runners of
their own, and more workers than that only fight over memory bandwidth). The one more: a test
spends much of its time waiting for a daemon, a runner or a child process to start or answer,
and with one worker per core those waits left the cores idle (2 cores, 1,685 tests: one worker
per core used 1.37 cores on average and took 5 min 44 s and 6 min 06 s; three workers 5 min 00 s
and 5 min 46 s; four 5 min 59 s).
``-n 0`` runs it in one process.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator

import pytest

__all__ = ["MAX_WORKERS"]

MAX_WORKERS = 4


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """One worker more than the cores this process may run on, at most :data:`MAX_WORKERS`."""
    # the CPUs this process may run on (a container's or taskset's share); all of them where
    # the platform cannot say (macOS)
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min((usable or 1) + 1, MAX_WORKERS))


@contextlib.contextmanager
def _suite_lock(tmp_path_factory: pytest.TempPathFactory, alone: bool) -> Iterator[None]:
    """Hold the suite's lock: exclusively when ``alone``, else shared (see
    :func:`_alone_when_marked`)."""
    root = tmp_path_factory.getbasetemp().parent  # popen-gwN's parent: shared by the workers
    with open(root / "gate.lock", "a") as gate, open(root / "suite.lock", "a") as suite:
        if alone:
            fcntl.flock(gate, fcntl.LOCK_EX)
            fcntl.flock(suite, fcntl.LOCK_EX)
        else:
            fcntl.flock(gate, fcntl.LOCK_SH)
            fcntl.flock(suite, fcntl.LOCK_SH)
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(suite, fcntl.LOCK_UN)
            fcntl.flock(gate, fcntl.LOCK_UN)


_module_alone: list[bool] = [False]  # a module marked alone holds the lock for its tests


@pytest.fixture(scope="module", autouse=True)
def _alone_module(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """A module marked ``alone`` (``pytestmark``) runs alone from before its module-scoped
    fixtures start (daemons, a gateway) until after they end."""
    if "PYTEST_XDIST_WORKER" not in os.environ or request.node.get_closest_marker("alone") is None:
        yield
        return
    with _suite_lock(tmp_path_factory, alone=True):
        _module_alone[0] = True
        try:
            yield
        finally:
            _module_alone[0] = False


@pytest.fixture(autouse=True)
def _alone_when_marked(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """A test marked ``alone`` runs while no other test of the suite does.

    Such a test is about the machine's own load (the governor giving threads back once the CPU
    is free, the speed probe waiting for a quiet moment): the suite's other workers are load it
    would wait out. A readers-writer lock over the workers' shared temporary root: every test
    holds ``suite.lock`` shared; an ``alone`` test takes ``gate.lock`` first, so that no new test
    starts, then ``suite.lock`` exclusively once the running ones have ended.
    """
    if "PYTEST_XDIST_WORKER" not in os.environ or _module_alone[0]:
        yield  # one process, or its module holds the lock already
        return
    with _suite_lock(tmp_path_factory, request.node.get_closest_marker("alone") is not None):
        yield
