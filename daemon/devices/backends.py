"""ggml's backend registry through ctypes: the devices llama.cpp can put layers on.

llama-cpp-python binds llama.h but not ggml-backend.h, whose registry is how llama.cpp's own
tools find devices and reach the RPC backend (``ggml_backend_reg_by_name("RPC")`` and its proc
addresses, as ``rpc-server`` and ``llama-server --rpc`` do). The few functions used are bound
here, on the ``libggml`` that llama-cpp-python loaded, so everything runs in the same copy of
ggml as the model. Importing this module loads llama.cpp: only runner processes do.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

import llama_cpp
from llama_cpp._ggml import libggml

__all__ = [
    "Device",
    "DeviceKind",
    "add_rpc_server",
    "all_devices",
    "backend_names",
    "cpu_device",
    "device_by_name",
    "has_local_gpu",
    "local_gpus",
    "rpc_function",
]

DeviceKind = Literal["cpu", "gpu", "igpu", "accel", "rpc"]

# enum ggml_backend_dev_type
_KINDS: dict[int, DeviceKind] = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}
_TYPE_CPU = 0

_void_p = ctypes.c_void_p
_size_t = ctypes.c_size_t


@lru_cache(maxsize=1)
def _lib() -> Any:
    """libggml with the signatures used here (set once)."""
    llama_cpp.llama_backend_init()  # loads the backends into the registry
    signatures: dict[str, tuple[Any, list[Any]]] = {
        "ggml_backend_reg_by_name": (_void_p, [ctypes.c_char_p]),
        "ggml_backend_reg_get_proc_address": (_void_p, [_void_p, ctypes.c_char_p]),
        "ggml_backend_reg_dev_count": (_size_t, [_void_p]),
        "ggml_backend_reg_dev_get": (_void_p, [_void_p, _size_t]),
        "ggml_backend_reg_name": (ctypes.c_char_p, [_void_p]),
        "ggml_backend_reg_count": (_size_t, []),
        "ggml_backend_reg_get": (_void_p, [_size_t]),
        "ggml_backend_dev_count": (_size_t, []),
        "ggml_backend_dev_get": (_void_p, [_size_t]),
        "ggml_backend_dev_by_type": (_void_p, [ctypes.c_int]),
        "ggml_backend_dev_name": (ctypes.c_char_p, [_void_p]),
        "ggml_backend_dev_description": (ctypes.c_char_p, [_void_p]),
        "ggml_backend_dev_type": (ctypes.c_int, [_void_p]),
        "ggml_backend_dev_memory": (
            None,
            [_void_p, ctypes.POINTER(_size_t), ctypes.POINTER(_size_t)],
        ),
    }
    for name, (restype, argtypes) in signatures.items():
        function = getattr(libggml, name)
        function.restype = restype
        function.argtypes = argtypes
    return libggml


@dataclass(frozen=True)
class Device:
    """A ggml device (plain data, plus the handle llama.cpp takes in ``devices``)."""

    handle: int
    """The ``ggml_backend_dev_t``, as an address."""
    name: str
    """ggml's name: ``CPU``, ``CUDA0``, ``RPC0``..."""
    description: str
    """The hardware (``AMD EPYC``), or the endpoint for an RPC device."""
    kind: DeviceKind
    """What it is; ``rpc`` for a worker's device."""
    free: int
    """Free memory in bytes when it was listed."""
    total: int
    """Total memory in bytes."""
    endpoint: str | None = None
    """The worker serving it (RPC devices only)."""


def _text(raw: bytes | None) -> str:
    return raw.decode("utf-8", errors="replace") if raw else ""


def _device(
    handle: int, kind: DeviceKind | None = None, endpoint: str | None = None, memory: bool = True
) -> Device:
    lib = _lib()
    free, total = _size_t(0), _size_t(0)
    if memory and kind != "rpc":
        # An RPC device's memory is asked over its connection, where a failure aborts the
        # process; callers pass what the worker check already read instead.
        lib.ggml_backend_dev_memory(handle, ctypes.byref(free), ctypes.byref(total))
    return Device(
        handle=handle,
        name=_text(lib.ggml_backend_dev_name(handle)),
        description=_text(lib.ggml_backend_dev_description(handle)),
        kind=kind or _KINDS.get(int(lib.ggml_backend_dev_type(handle)), "accel"),
        free=free.value,
        total=total.value,
        endpoint=endpoint,
    )


def all_devices() -> list[Device]:
    """Every device in the registry (RPC workers are never registered there: llama.cpp gets
    them in ``llama_model_params.devices`` only, so no other context uses them by accident)."""
    lib = _lib()
    return [_device(lib.ggml_backend_dev_get(i)) for i in range(lib.ggml_backend_dev_count())]


def backend_names() -> list[str]:
    """The backends this build registered: ``CPU``, ``CUDA``, ``RPC``..."""
    lib = _lib()
    return [
        _text(lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(i)))
        for i in range(lib.ggml_backend_reg_count())
    ]


def has_local_gpu() -> bool:
    """Whether this machine has a GPU llama.cpp can offload to (asks no device for its memory,
    which would start a GPU context on each)."""
    lib = _lib()
    return any(
        _KINDS.get(int(lib.ggml_backend_dev_type(lib.ggml_backend_dev_get(i)))) in ("gpu", "igpu")
        for i in range(lib.ggml_backend_dev_count())
    )


def cpu_device() -> Device:
    """The local CPU, which always holds the input layer and any layer not offloaded."""
    handle = _lib().ggml_backend_dev_by_type(_TYPE_CPU)
    if not handle:
        raise RuntimeError("this llama.cpp has no CPU backend")
    return _device(handle)


def local_gpus() -> list[Device]:
    """This machine's GPUs (discrete and integrated), as llama.cpp would offload to them."""
    return [d for d in all_devices() if d.kind in ("gpu", "igpu")]


def device_by_name(name: str) -> Device | None:
    """The registry's device called ``name`` (case-insensitive), if any."""
    return next((d for d in all_devices() if d.name.lower() == name.lower()), None)


def rpc_function(name: str, prototype: Any) -> Any | None:
    """A function of the RPC backend by its proc address, as ``prototype``; None when this
    build has no RPC backend (or no such function)."""
    lib = _lib()
    registry = lib.ggml_backend_reg_by_name(b"RPC")
    if not registry:
        return None
    address = lib.ggml_backend_reg_get_proc_address(registry, name.encode())
    return prototype(address) if address else None


_ADD_SERVER = ctypes.CFUNCTYPE(_void_p, ctypes.c_char_p)


def add_rpc_server(endpoint: str, memory: list[tuple[int, int]]) -> list[Device]:
    """Register a worker with the RPC backend (``ggml_backend_rpc_add_server``) and return its
    devices; ``memory`` is each device's (free, total) as the worker check read them.

    llama.cpp aborts the process if the worker does not answer: check it first
    (:func:`.workers.probe`).
    """
    add = rpc_function("ggml_backend_rpc_add_server", _ADD_SERVER)
    if add is None:
        raise RuntimeError("this llama.cpp has no RPC backend")
    registry = add(endpoint.encode())
    if not registry:
        raise RuntimeError(f"RPC worker {endpoint} exposes no devices")
    lib = _lib()
    devices = []
    for index in range(lib.ggml_backend_reg_dev_count(registry)):
        device = _device(lib.ggml_backend_reg_dev_get(registry, index), "rpc", endpoint, False)
        free, total = memory[index] if index < len(memory) else (0, 0)
        devices.append(
            Device(device.handle, device.name, device.description, "rpc", free, total, endpoint)
        )
    return devices
