"""GPU faults: how one shows, how it is named, and the test hook that stands in for one.

A GPU fails in two ways under llama.cpp. ``llama_decode`` may return a fatal status (``-2``:
a compute buffer could not be allocated, ``-3``: the backend failed to compute): the engine
then ends the requests in that batch with a named error and stops, since the context's state
is no longer certain, and the runner exits with :data:`EXIT_DEVICE_FAULT`. Or the backend
aborts the process (a lost Vulkan device throws ``vk::DeviceLostError``, a CUDA error calls
``GGML_ABORT``): the runner dies by SIGABRT, and its log says why. Either way the daemon names
the fault to the requests it cost (:func:`gpu_cause` finds the GPU's line in the log) and
loads the model again on the next request; when the GPU fails again, the scheduler falls back
to the CPU and says so.

Neither can be caused on purpose on a software device (lavapipe loses nothing), so the tests
stand one in at a chosen decode through :func:`injected_fault`: the hook is in the test tree,
found only where a test fixture put it (:mod:`localllm.testhooks`), never in a user's runner.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from localllm import testhooks

__all__ = [
    "EXIT_DEVICE_FAULT",
    "DeviceFault",
    "decode_failure",
    "gpu_cause",
    "injected_fault",
]

EXIT_DEVICE_FAULT = 4
"""A runner's exit status after its GPU failed a decode (the daemon reloads it, or falls back
to the CPU when it fails again)."""

_GPU_LINE = re.compile(
    r"(?:CUDA error|HIP error|ROCm error|ggml_vulkan: .*(?:error|lost|Error)|vk::\w*Error"
    r"|DeviceLost|ErrorOutOfDeviceMemory|ggml_metal.*(?:error|failed))[^\n]*",
    re.IGNORECASE,
)
_TAIL_BYTES = 64 << 10


class DeviceFault(RuntimeError):
    """The GPU failed a decode; the engine stops and the runner exits for a reload."""


def decode_failure(status: int, devices: str) -> str:
    """The error a request gets when ``llama_decode`` failed with ``status`` on ``devices``."""
    if status == -2:
        what = "ran out of memory (a compute buffer could not be allocated)"
    else:
        what = "failed to compute the batch"
    return (
        f"the GPU {what} while decoding ({devices}: llama_decode status {status}); "
        "the model is loaded again for the next request"
    )


def gpu_cause(log_path: Path, since: int = 0) -> str | None:
    """The last line a GPU backend logged about failing, after byte ``since`` of the runner's
    log (within its last 64 KiB); None when the log names no GPU fault."""
    try:
        with open(log_path, "rb") as log_file:
            since = max(since, log_file.seek(0, os.SEEK_END) - _TAIL_BYTES)
            log_file.seek(since)
            text = log_file.read().decode("utf-8", "replace")
    except OSError:
        return None
    found = _GPU_LINE.findall(text)
    return found[-1].strip()[:300] if found else None


def injected_fault(on_gpu: bool) -> testhooks.DecodeFault | None:
    """The GPU fault a test asked this runner to stand in for (None outside the test
    fixtures, and for a model with no layer on a GPU)."""
    return testhooks.decode_fault() if on_gpu else None
