"""What a load really allocated on each device, read from the buffer sizes llama.cpp logs.

llama.cpp keeps its per-buffer figures in C++ (``llama_get_memory_breakdown`` returns a
``std::map``, which ctypes cannot read) but logs every buffer it allocates while a model and
its context are made: ``load_tensors: Vulkan0 model buffer size = 92.10 MiB``,
``llama_kv_cache: Vulkan0 KV buffer size = 360.00 MiB``, ``sched_reserve: Vulkan0 compute
buffer size = 97.12 MiB``. Summed per device, that is what ``/api/ps`` reports as ``size`` and
``size_vram``: what the load took, not what the plan expected. Pinned host buffers
(``Vulkan_Host``, ``CUDA_Host``), mapped and repacked weights (``CPU_Mapped``, ``CPU_REPACK``,
``AMX``) are the host's RAM.
"""

from __future__ import annotations

import re

__all__ = ["HOST", "allocated", "is_host_buffer"]

HOST = "CPU"
"""The host's RAM, by llama.cpp's name for its CPU device."""
_MIB = 1 << 20
_BUFFER = re.compile(r"(\S+)\s+(?:model|KV|RS|compute|output) buffer size =\s*([\d.]+) MiB")
_HOST_BUFFERS = ("CPU", "AMX")


def is_host_buffer(buffer: str) -> bool:
    """Whether a llama.cpp buffer type lives in the host's RAM."""
    return buffer.startswith(_HOST_BUFFERS) or "Host" in buffer


def allocated(log_text: str) -> dict[str, int]:
    """Bytes allocated per device (``CPU`` for the host) in the buffers ``log_text`` reports."""
    totals: dict[str, int] = {}
    for buffer, mib in _BUFFER.findall(log_text):
        device = HOST if is_host_buffer(buffer) else buffer
        totals[device] = totals.get(device, 0) + round(float(mib) * _MIB)
    return totals
