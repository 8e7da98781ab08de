"""llama.cpp's own report of this machine (version, system info, backends and devices, GPU
offload and RPC support), asked of a child process so that a fault cannot take the caller down.

The CPU listing (``doctor``, the fit verdicts) and the GPU listing (:mod:`.gpuinfo`, one child per
Vulkan index) both ask through :func:`system_report`.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from localllm._process import child_report

__all__ = ["system_report"]


def system_report(timeout: float = 60.0, env: dict[str, str] | None = None) -> dict[str, Any]:
    """llama.cpp's own view of this machine, from a child process (so a fault cannot take the
    caller down): version, system info, backends and devices, GPU offload and RPC support.
    ``env``: the child's environment (default: this process's). On failure: ``{"error":
    "..."}``."""
    command = [sys.executable, "-P", "-m", "localllm.daemon.devices.cpu", "info"]
    try:
        done = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            check=False,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"llama.cpp's report did not finish within {timeout:.0f} s"}
    report, failure = child_report(done)
    return report if report is not None else {"error": f"loading llama.cpp {failure}"}
