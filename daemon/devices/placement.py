"""Which device holds which layers when a model is split across the CPU, GPUs and RPC workers.

llama.cpp puts layers ``[0, n_layer + 1 - n_gpu_layers)`` on the CPU and splits the rest, in
order, over ``llama_model_params.devices`` in the proportions of ``tensor_split``; the output
layer counts as layer ``n_layer``. Giving ``tensor_split`` as whole layer counts makes its
split exact (device *i* gets the layers between the running sums of the counts), so the plan
computed here is what llama.cpp does, and what ``ps`` reports.

The shares follow each device's free memory, as llama.cpp's default split does; the local CPU
takes a share too when this machine has no GPU (on CPU-only machines its RAM is where layers
would go), and only what is not offloaded otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .backends import Device

__all__ = ["Placement", "place_layers", "split_units"]


def split_units(count: int, weights: list[int]) -> list[int]:
    """``count`` whole units shared in proportion to ``weights`` (largest remainder; ties go
    to the earlier entry). All-zero weights share equally."""
    if not weights:
        return []
    if sum(weights) <= 0:
        weights = [1] * len(weights)
    total = sum(weights)
    exact = [count * w / total for w in weights]
    shares = [int(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - shares[i]), i))
    for i in order[: count - sum(shares)]:
        shares[i] += 1
    return shares


@dataclass(frozen=True)
class Placement:
    """A model's layers over its devices."""

    n_layer: int
    """Repeating layers (blocks) of the model."""
    cpu: Device
    """The local CPU."""
    devices: list[Device]
    """The offload devices in llama.cpp's order (local GPUs, then the workers')."""
    cpu_units: int
    """Layers kept on the CPU (the output layer counts as one, the last)."""
    device_units: list[int]
    """Layers on each of ``devices``."""

    @property
    def n_gpu_layers(self) -> int:
        """What llama.cpp's ``n_gpu_layers`` must be."""
        return sum(self.device_units)

    @property
    def local_gpu_layers(self) -> int:
        """Layers on this machine's GPUs (what ``size_vram`` reflects)."""
        return sum(
            units
            for d, units in zip(self.devices, self.device_units, strict=True)
            if d.kind in ("gpu", "igpu")
        )

    def report(self) -> list[dict[str, Any]]:
        """Each device with the layers it holds, CPU first, for ``health`` and ``/api/ps``:
        ``name, kind, description, endpoint, free, total, layers, first_layer, output``."""
        rows = []
        start = 0
        pairs = zip(self.devices, self.device_units, strict=True)
        for device, units in [(self.cpu, self.cpu_units), *pairs]:
            end = start + units
            blocks = max(0, min(end, self.n_layer) - start)
            rows.append(
                {
                    "name": device.name,
                    "kind": device.kind,
                    "description": device.description,
                    "endpoint": device.endpoint,
                    "free": device.free,
                    "total": device.total,
                    "layers": blocks,
                    "first_layer": start if blocks else None,
                    "output": start <= self.n_layer < end,
                }
            )
            start = end
        return rows


def _free(device: Device, cpu: Device) -> int:
    # Devices that cannot say (free and total 0) stand for host memory, as in llama.cpp.
    return cpu.free if device.free == 0 and device.total == 0 else device.free


def place_layers(n_layer: int, cpu: Device, devices: list[Device], n_gpu_layers: int) -> Placement:
    """The split of ``n_layer`` blocks and the output layer: ``n_gpu_layers`` of them (all for
    -1) on ``devices`` by free memory, or with -1 on a machine without a local GPU, the CPU
    sharing in by its free memory too."""
    units = n_layer + 1
    weights = [_free(d, cpu) for d in devices]
    if n_gpu_layers >= 0:
        offloaded = min(n_gpu_layers, units)
        return Placement(n_layer, cpu, devices, units - offloaded, split_units(offloaded, weights))
    if any(d.kind in ("gpu", "igpu") for d in devices):
        return Placement(n_layer, cpu, devices, 0, split_units(units, weights))
    cpu_units, *device_units = split_units(units, [cpu.free, *weights])
    return Placement(n_layer, cpu, devices, cpu_units, device_units)
