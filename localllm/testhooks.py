"""Test hooks: fault and pause injection, present only where the test suite puts them.

Some failures cannot be caused on purpose here (a GPU that loses its device, a daemon killed
between two steps of a store write), so the tests stand them in through two seams: a store
write's checkpoints (:meth:`localllm.store.store.Store.checkpoint`) and the engine's decode
(:mod:`localllm.daemon.devices.faults`). A third seam shortens the speed probe's rounds for
tests of what it reports (:mod:`localllm.daemon.speed.measure`). What fills a seam is not part
of localllm: it is the module :data:`MODULE` in the test tree (``tests/support/hooks/``), which
a test fixture puts on the ``PYTHONPATH`` of the daemon it starts (its runners inherit it). No
installed package has that name, so outside the test fixtures every hook here is None and the
``LOCALLLM_TEST_*`` variables of a user's environment do nothing (``localllm doctor`` names
them, and says so).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Protocol

__all__ = ["MODULE", "DecodeFault", "decode_fault", "location", "probe_budget", "store_pause"]

MODULE = "localllm_test_hooks"
"""The hooks module's name; only the test fixtures' ``PYTHONPATH`` has it."""


class DecodeFault(Protocol):
    """Stands in for a GPU fault at a chosen decode (the engine asks before each decode)."""

    def before_decode(self) -> int | None:
        """The status a failing GPU would give this decode; None: decode as usual."""
        ...


def _hooks() -> ModuleType | None:
    try:
        return importlib.import_module(MODULE)
    except ModuleNotFoundError as exc:
        if exc.name != MODULE:  # the hooks module is there but broken: say so
            raise
        return None


def location() -> str | None:
    """Where this process would find the hooks module (None: nowhere, the hooks are off)."""
    spec = importlib.util.find_spec(MODULE)
    return None if spec is None else str(spec.origin)


def store_pause(data_dir: Path) -> Callable[[str], None] | None:
    """What a store write calls at each checkpoint when a test asked for a pause, else None."""
    hooks = _hooks()
    return None if hooks is None else hooks.store_pause(data_dir)


def decode_fault() -> DecodeFault | None:
    """The GPU fault a test asked this runner to stand in for, else None."""
    hooks = _hooks()
    return None if hooks is None else hooks.decode_fault()


def probe_budget() -> float | None:
    """How long the speed probe's rounds may go on (seconds, past their minimum) when a test
    asked for less than the probe's own budget, else None."""
    hooks = _hooks()
    return None if hooks is None else hooks.probe_budget()
