"""What a GPU build sees, for ``localllm doctor`` and the tests: software devices, the Vulkan
devices llama.cpp leaves out by default, and the command that gives a build without a GPU
backend one.

llama.cpp's Vulkan backend uses discrete and integrated GPUs only: a CPU-type device such as
Mesa's lavapipe (``llvmpipe``) is skipped unless ``GGML_VK_VISIBLE_DEVICES`` names it, as it
is far slower than the CPU backend. localllm never picks one by itself either (the variable
reaches the runners untouched). To list what was skipped, :func:`hidden_vulkan_devices` asks
llama.cpp again in a child process per index with that variable set, so the answer is the
backend's own enumeration, not a second Vulkan binding. Importing this module does not load
llama.cpp.
"""

from __future__ import annotations

import os
import platform
import shutil
from typing import Any

from .llamareport import system_report

__all__ = [
    "HIDDEN_GPUS",
    "SOFTWARE_DEVICES",
    "gpu_build_command",
    "hidden_vulkan_devices",
    "is_software",
]

SOFTWARE_DEVICES = ("llvmpipe", "lavapipe", "swiftshader", "softpipe")
"""Names of devices that are CPUs pretending to be GPUs (as their drivers describe them)."""
_MOST_VULKAN_INDICES = 8
HIDDEN_GPUS = {"GGML_VK_VISIBLE_DEVICES": "", "CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": ""}
"""The environment under which llama.cpp's Vulkan, CUDA and ROCm backends find no device."""


def is_software(description: str) -> bool:
    """Whether a device's description names a software rasteriser (a CPU, not a GPU)."""
    text = description.lower()
    return any(name in text for name in SOFTWARE_DEVICES)


def gpu_build_command() -> str:
    """The command that builds the GPU flavour most likely right for this machine."""
    if platform.system() == "Darwin":
        flavour = "metal"
    elif shutil.which("nvidia-smi") or os.path.exists("/proc/driver/nvidia"):
        flavour = "cuda"
    elif shutil.which("rocminfo") or os.path.exists("/dev/kfd"):
        flavour = "rocm"
    else:
        flavour = "vulkan"
    return f"scripts/gpu-build.sh {flavour} VENV"


def _vulkan_devices_at(index: int, timeout: float) -> list[dict[str, Any]] | None:
    """The Vulkan devices llama.cpp lists with only ``index`` visible; None when there is no
    such index (llama.cpp then fails to start its Vulkan backend) or the child fails."""
    environment = dict(os.environ, GGML_VK_VISIBLE_DEVICES=str(index))
    report = system_report(timeout, env=environment)
    if "error" in report:
        return None
    return [d for d in report.get("devices", []) if str(d.get("name", "")).startswith("Vulkan")]


def hidden_vulkan_devices(
    report: dict[str, Any], visible_setting: str | None, timeout: float = 60.0
) -> list[dict[str, Any]]:
    """Vulkan devices this machine has that llama.cpp does not use by default.

    ``report`` is llama.cpp's own report (:func:`.llamareport.system_report`); ``visible_setting``
    is
    ``GGML_VK_VISIBLE_DEVICES`` as the settings read it: when it is set, the user chose, and
    nothing is hidden. Each device found comes back with ``index`` (the value that makes it
    visible) and ``software``.
    """
    if visible_setting is not None or "Vulkan" not in report.get("backends", []):
        return []
    shown = {d.get("description") for d in report.get("devices", [])}
    hidden: list[dict[str, Any]] = []
    for index in range(_MOST_VULKAN_INDICES):
        devices = _vulkan_devices_at(index, timeout)
        if devices is None:
            break
        for device in devices:
            if device.get("description") not in shown:
                software = is_software(str(device.get("description", "")))
                hidden.append(device | {"index": index, "software": software})
    return hidden
