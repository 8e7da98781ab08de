"""ggml's backend registry, which llama-cpp-python does not wrap: the devices llama.cpp can use.

``llama_supports_gpu_offload()`` is true for any build with a backend that can hold layers,
RPC included, so it does not say whether this machine has a GPU; the device list does. The
functions are bound once, on the ggml library llama.cpp itself loaded.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from typing import Any

__all__ = ["Device", "backends", "devices", "has_gpu"]

# enum ggml_backend_dev_type (ggml-backend.h)
_DEVICE_TYPES = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}


@dataclass(frozen=True)
class Device:
    """One ggml device, as llama.cpp sees it now."""

    name: str
    """ggml's name for it (``CPU``, ``CUDA0``, ``RPC[127.0.0.1:50052]``)."""
    description: str
    """What it is (the CPU's or GPU's model)."""
    type: str
    """``cpu``, ``gpu``, ``igpu`` or ``accel``."""
    memory_free: int
    """Bytes free (for the CPU: the system's available memory)."""
    memory_total: int
    """Bytes in all."""


@functools.cache
def _library() -> Any:
    from llama_cpp._ggml import libggml

    for name, restype, argtypes in (
        ("ggml_backend_dev_count", ctypes.c_size_t, []),
        ("ggml_backend_dev_get", ctypes.c_void_p, [ctypes.c_size_t]),
        ("ggml_backend_dev_name", ctypes.c_char_p, [ctypes.c_void_p]),
        ("ggml_backend_dev_description", ctypes.c_char_p, [ctypes.c_void_p]),
        ("ggml_backend_dev_type", ctypes.c_int, [ctypes.c_void_p]),
        (
            "ggml_backend_dev_memory",
            None,
            [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)],
        ),
        ("ggml_backend_reg_count", ctypes.c_size_t, []),
        ("ggml_backend_reg_get", ctypes.c_void_p, [ctypes.c_size_t]),
        ("ggml_backend_reg_name", ctypes.c_char_p, [ctypes.c_void_p]),
    ):
        function = getattr(libggml, name)
        function.restype, function.argtypes = restype, argtypes
    return libggml


def devices() -> list[Device]:
    """Every device registered now (call after ``llama_backend_init``)."""
    ggml = _library()
    found = []
    for index in range(ggml.ggml_backend_dev_count()):
        device = ggml.ggml_backend_dev_get(index)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        ggml.ggml_backend_dev_memory(device, ctypes.byref(free), ctypes.byref(total))
        found.append(
            Device(
                name=ggml.ggml_backend_dev_name(device).decode(),
                description=ggml.ggml_backend_dev_description(device).decode(),
                type=_DEVICE_TYPES.get(ggml.ggml_backend_dev_type(device), "other"),
                memory_free=free.value,
                memory_total=total.value,
            )
        )
    return found


def backends() -> list[str]:
    """The names of the backends this build registered (``CPU``, ``CUDA``, ``RPC``...)."""
    ggml = _library()
    return [
        ggml.ggml_backend_reg_name(ggml.ggml_backend_reg_get(i)).decode()
        for i in range(ggml.ggml_backend_reg_count())
    ]


def has_gpu() -> bool:
    """Whether a GPU (discrete or integrated) can hold layers here."""
    return any(device.type in ("gpu", "igpu") for device in devices())
