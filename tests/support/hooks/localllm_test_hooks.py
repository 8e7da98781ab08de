"""The test suite's fault and pause injection (see :mod:`localllm.testhooks`).

This folder is on the ``PYTHONPATH`` of a daemon only when a test fixture asks for a hook
(``hook_support.with_hooks``); the daemon and its runners then find this module by its name,
which no installed package has. Here, and only here, two variables are read:

* ``LOCALLLM_TEST_PAUSE=<step>[#<n>]`` stops the n-th store write that reaches ``<step>`` (one of
  :data:`localllm.store.storage.PAUSE_STEPS`): it writes the file ``test-pause`` (the step's
  name) in the data root and waits until the test removes it, or SIGKILLs the daemon there;
* ``LOCALLLM_TEST_FAULT=<kind>@<n>`` makes every GPU runner's n-th decode stand in for a GPU
  fault (``device-lost``: the backend aborts as on a lost Vulkan device; ``decode-failed``,
  ``out-of-memory``: ``llama_decode``'s status -3 or -2), which no software device can produce;
* ``LOCALLLM_TEST_PROBE_BUDGET=<seconds>`` ends the speed probe's rounds after that long (past
  its minimum of rounds) instead of its own budget: a test of what the probe reports, not of
  how its figures settle, on a machine the suite's other workers keep busy, where the rounds
  would otherwise go on to the budget a user's probe has.

A value that is not one of these ends the daemon's start (or the runner's load) with a
:class:`~localllm._exceptions.SettingsError` naming the variable.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

from localllm._exceptions import SettingsError
from localllm.store.storage import PAUSE_STEPS, FileOps, atomic_write

__all__ = [
    "FAULT_KINDS",
    "FaultHook",
    "PauseHook",
    "decode_fault",
    "parse_fault",
    "parse_pause",
    "probe_budget",
    "store_pause",
]

FAULT_KINDS = ("device-lost", "decode-failed", "out-of-memory")
"""The GPU faults ``LOCALLLM_TEST_FAULT`` can stand in for."""

# How often a paused write looks whether the test removed its marker.
_PAUSE_POLL = 0.01


def parse_pause(spec: str) -> tuple[str, int]:
    """``(step, n)`` from ``step`` or ``step#n``; raises ``ValueError`` naming the steps."""
    step, _, count = spec.partition("#")
    step = step.strip()
    if step not in PAUSE_STEPS:
        raise ValueError(f"unknown step {step!r}; one of {', '.join(PAUSE_STEPS)}")
    if not count:
        return step, 1
    if not count.isdigit() or int(count) < 1:
        raise ValueError(f"the count after # must be a positive integer, got {count!r}")
    return step, int(count)


class PauseHook:
    """Pauses the n-th write that reaches one step.

    Paused, it writes the step's name to ``marker`` and waits until the file is gone.
    """

    def __init__(self, step: str, count: int, marker: Path) -> None:
        self.step = step
        """The step to pause at."""
        self.count = count
        """Pause the ``count``-th time the step is reached."""
        self.marker = marker
        """The file that exists while paused."""
        self._seen = 0
        self._lock = threading.Lock()

    def __call__(self, step: str) -> None:
        """Called at every checkpoint; blocks at the chosen one."""
        if step != self.step:
            return
        with self._lock:
            self._seen += 1
            if self._seen != self.count:
                return
        self.marker.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(FileOps(), self.marker, step.encode())
        while self.marker.exists():
            time.sleep(_PAUSE_POLL)


def parse_fault(spec: str) -> tuple[str, int]:
    """``<kind>@<n>`` (the n-th decode of a runner, from 1) as (kind, n); ValueError when it
    is not one."""
    kind, _, count = spec.partition("@")
    if kind not in FAULT_KINDS or not count.isdigit() or int(count) < 1:
        raise ValueError(f"expected <kind>@<n> with kind one of {', '.join(FAULT_KINDS)}")
    return kind, int(count)


class FaultHook:
    """Stands in for a GPU fault at the n-th decode."""

    def __init__(self, spec: str) -> None:
        self.kind, self.at = parse_fault(spec)
        self.decodes = 0

    def before_decode(self) -> int | None:
        """The status a failing GPU would give this decode (None: decode as usual); a lost
        device ends the process as ggml's Vulkan backend does."""
        self.decodes += 1
        if self.decodes != self.at:
            return None
        if self.kind == "device-lost":
            sys.stderr.write(
                "ggml_vulkan: Device lost (vk::DeviceLostError, LOCALLLM_TEST_FAULT)\n"
            )
            sys.stderr.flush()
            os.abort()
        return -2 if self.kind == "out-of-memory" else -3


def _variable(name: str) -> str | None:
    raw = os.environ.get(name, "").strip()
    return raw or None


def store_pause(data_dir: Path) -> PauseHook | None:
    """The pause ``LOCALLLM_TEST_PAUSE`` asks for, its marker in ``data_dir``; else None."""
    if (spec := _variable("LOCALLLM_TEST_PAUSE")) is None:
        return None
    try:
        step, count = parse_pause(spec)
    except ValueError as exc:
        raise SettingsError(f"LOCALLLM_TEST_PAUSE: {exc}") from None
    return PauseHook(step, count, data_dir / "test-pause")


def decode_fault() -> FaultHook | None:
    """The fault ``LOCALLLM_TEST_FAULT`` asks for; else None."""
    if (spec := _variable("LOCALLLM_TEST_FAULT")) is None:
        return None
    try:
        return FaultHook(spec)
    except ValueError as exc:
        raise SettingsError(f"LOCALLLM_TEST_FAULT must be <kind>@<n> (n from 1): {exc}") from None


def probe_budget() -> float | None:
    """The speed probe's budget for its rounds that ``LOCALLLM_TEST_PROBE_BUDGET`` asks for
    (seconds); else None."""
    if (raw := _variable("LOCALLLM_TEST_PROBE_BUDGET")) is None:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise SettingsError(f"LOCALLLM_TEST_PROBE_BUDGET must be seconds (0 or more), got {raw!r}")
    return seconds
