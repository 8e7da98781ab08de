"""llama.cpp measures a load before the runner makes it: its devices, and what a trial's
buffers would take (``llama_model_params.no_alloc``).

A ``no_alloc`` load reads the GGUF's metadata and lays out every tensor without allocating
or reading weights; a context built on it reserves its compute graphs the same way. llama.cpp
keeps the per-buffer figures in C++ (``llama_get_memory_breakdown`` returns a ``std::map``,
which ctypes cannot read) but logs them, so the measure reads the lines it logs while the
context is built: the KV cache's size (``llama_kv_cache: size = ... MiB``) and each compute
and output buffer (``CUDA0 compute buffer size = ... MiB``). The model's own buffers read 0 in
that mode, so weights come from the GGUF's tensor sizes placed layer by layer as llama.cpp
places them (:func:`~localllm.daemon.memory.plan.place_layers`); each layer's KV follows it, the
measured total shared out by the GGUF's per-layer sizes.

Devices are llama.cpp's own (``ggml_backend_dev_*``, in the order a model uses them: RPC
workers' devices as each worker reports them, then GPUs, integrated GPUs only without a
discrete one) with the free and total
memory their backends report; the host is the RAM this process may still use
(:func:`~localllm.daemon.memory.system.host_memory`), not the CPU backend's figure, which ignores
cgroups.
"""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from pathlib import Path

import llama_cpp

from localllm.gguf_info import inspect_gguf

from ..devices.backends import local_gpus
from ..devices.workers import probe_all
from ..engine.model import (
    batch_size,
    context_params,
    kv_layout,
    load_model,
    model_params,
    set_fields,
    tap_llama_log,
)
from ..runner.protocol import RunnerConfig
from .layout import ModelLayout, estimate, layout_from_gguf, place
from .plan import (
    HOST,
    Device,
    DeviceUse,
    MemoryPlan,
    PlanRequest,
    Trial,
    ahead_that_fits,
    plan,
    with_ahead,
)
from .system import host_memory

__all__ = ["LlamaMeasure", "MeasureError", "llama_devices", "plan_load", "plan_request"]

log = logging.getLogger("localllm.runner.measure")

_MIB = 1 << 20
_KV_LINE = re.compile(r"(?:llama_kv_cache|llama_memory_recurrent): size =\s*([\d.]+) MiB")
_BUFFER_LINE = re.compile(r"(\S+)\s+(?:compute|output) buffer size =\s*([\d.]+) MiB")
# The share of a projector's file size its image encoder adds as compute buffers (an estimate:
# mtmd reports nothing before it encodes).
_PROJECTOR_COMPUTE = 0.25


class MeasureError(RuntimeError):
    """llama.cpp could not lay out a trial (the model or a context failed to build)."""


def llama_devices() -> list[Device]:
    """This machine's offload devices in the order a model uses them (GPUs, integrated GPUs
    only when there is no discrete one), with their free and total memory."""
    gpus = local_gpus()
    chosen = [d for d in gpus if d.kind == "gpu"] or [d for d in gpus if d.kind == "igpu"]
    return [Device(d.name, d.kind, d.free, d.total, d.description) for d in chosen]


def worker_devices(config: RunnerConfig) -> list[Device]:
    """The devices of ``config``'s RPC workers, from what each reports. They join llama.cpp
    only for the load itself (:func:`.rpc.split_onto_workers`); a worker that does not answer
    is left out here and named by the load."""
    devices = []
    for status in probe_all(config.rpc_workers):
        if status.ok:
            for remote in status.devices:
                name = f"RPC[{status.endpoint}]#{remote.index}"
                devices.append(Device(name, "rpc", remote.free, remote.total, status.endpoint))
    return devices


def host_device(mapped_ram: int = 0) -> Device:
    """The host's RAM as this process may use it. ``mapped_ram`` (other runners' mapped
    weights) comes off MemAvailable, which counts those pages as reclaimable cache."""
    memory = host_memory()
    free = memory.mem_available - mapped_ram
    if memory.cgroup_room is not None:
        free = min(free, memory.cgroup_room)
    return Device(HOST, "cpu", max(free, 0), memory.total, "host RAM")


def _layout(config: RunnerConfig) -> ModelLayout:
    parts = [inspect_gguf(p) for p in (config.model_path, *config.extra_model_paths)]
    return layout_from_gguf(parts, config.kv_cache_type)


class _Extras:
    """The projector and the draft model, estimated from their GGUFs: a draft keeps the
    target's slots and context, so its KV follows the trial's cells."""

    def __init__(self, config: RunnerConfig) -> None:
        self.fixed = 0
        self.per_cell = 0
        if config.projector:
            size = Path(config.projector).stat().st_size
            self.fixed += size + int(size * _PROJECTOR_COMPUTE)
        if config.draft_model:
            draft = layout_from_gguf([inspect_gguf(config.draft_model)], config.kv_cache_type)
            self.fixed += draft.weights + min(config.n_batch, 64) * draft.n_vocab * 4
            self.per_cell = sum(draft.kv_per_cell)

    def bytes(self, cells: int) -> int:
        """Their bytes for a trial of ``cells`` KV cells."""
        return self.fixed + self.per_cell * cells


def _buffer_device(buffer: str, devices: list[Device], host: str) -> str:
    """The device a llama.cpp buffer type lives on: ``CUDA0`` on CUDA0, ``CUDA_Host`` (pinned
    RAM), ``CPU`` and ``CPU_REPACK`` on the host."""
    for device in devices:
        if not device.is_host and buffer.startswith(device.name) and "Host" not in buffer:
            return device.name
    return host


class LlamaMeasure:
    """Prices trials of one model with ``no_alloc`` loads (a memplan :data:`Measure`)."""

    def __init__(self, config: RunnerConfig, devices: list[Device], layout: ModelLayout) -> None:
        self.config = config
        self.devices = devices
        self.layout = layout
        self.host = next(d.name for d in devices if d.is_host)
        self._extras = _Extras(config)
        self._model: llama_cpp.llama_model_p | None = None
        self._model_layers: int | None = None

    def _load(self, n_gpu_layers: int) -> llama_cpp.llama_model_p:
        if self._model is not None and self._model_layers == n_gpu_layers:
            return self._model
        self.close()
        params = model_params(replace(self.config, use_mmap=False, use_mlock=False), n_gpu_layers)
        set_fields(params, no_alloc=True)
        model = load_model(self.config, params)
        if not model:
            raise MeasureError(f"llama.cpp could not lay out {self.config.model_path}")
        self._model, self._model_layers = model, n_gpu_layers
        return model

    def __call__(self, trial: Trial) -> list[DeviceUse]:
        """What ``trial`` needs on each device."""
        config = replace(
            self.config,
            n_slots=trial.n_slots,
            n_ctx_per_slot=trial.n_ctx_per_slot,
            kv_cells=trial.kv_cells,
        )
        model = self._load(trial.n_gpu_layers)
        # Laid out as the load will lay it out: one pool, or a stream per slot.
        unified, n_ctx, n_seq = kv_layout(config)
        params = context_params(config, n_ctx, n_seq, 1, unified=unified)
        n_batch = batch_size(config)
        set_fields(params, n_batch=n_batch, n_ubatch=n_batch)
        with tap_llama_log() as lines:
            ctx = llama_cpp.llama_init_from_model(model, params)
        if not ctx:
            raise MeasureError(
                f"llama.cpp could not lay out a context of {trial.cells} cells for "
                f"{trial.n_slots} slots"
            )
        llama_cpp.llama_free(ctx)
        return self._uses(trial, "".join(lines), n_batch)

    def _uses(self, trial: Trial, text: str, n_ubatch: int) -> list[DeviceUse]:
        uses = place(self.layout, trial, self.devices, n_ubatch)
        by_name = {u.device: u for u in uses}
        measured_kv = sum(float(m) for m in _KV_LINE.findall(text)) * _MIB
        estimated_kv = sum(u.kv for u in uses)
        if measured_kv and estimated_kv:
            for use in uses:
                use.kv = round(use.kv * measured_kv / estimated_kv)
        elif measured_kv:  # recurrent state: spread over the layers
            layers = sum(u.layers for u in uses) or 1
            for use in uses:
                use.kv = round(measured_kv * use.layers / layers)
        buffers = _BUFFER_LINE.findall(text)
        for buffer, mib in buffers:
            by_name[_buffer_device(buffer, self.devices, self.host)].compute += round(
                float(mib) * _MIB
            )
        if not buffers:  # a llama.cpp that words its report otherwise: the GGUF's guess
            log.warning("llama.cpp reported no compute buffers; estimating them from the GGUF")
            guess = estimate(
                self.layout,
                self.devices,
                n_batch=n_ubatch,
                flash_attention=self.config.flash_attention,
            )(trial)
            for use in guess:
                by_name[use.device].compute = use.compute
        by_name[place_head(uses, self.host)].other += self._extras.bytes(trial.cells)
        return uses

    def close(self) -> None:
        """Free the laid-out model."""
        if self._model is not None:
            llama_cpp.llama_model_free(self._model)
            self._model = None
            self._model_layers = None


def place_head(uses: list[DeviceUse], host: str) -> str:
    """The device holding the output layer: where the projector and draft also go (they use
    the GPU when the model does)."""
    offloaded = [u for u in uses if u.device != host and u.layers]
    return offloaded[-1].device if offloaded else host


def plan_request(config: RunnerConfig, layout: ModelLayout) -> PlanRequest:
    """What ``config`` leaves to the plan: a context of 0 and GPU layers of -1 are open."""
    return PlanRequest(
        n_slots=config.n_slots,
        n_ctx_per_slot=config.n_ctx_per_slot or None,
        n_gpu_layers=None if config.n_gpu_layers < 0 else config.n_gpu_layers,
        n_layer=layout.n_layer,
        n_ctx_train=layout.n_ctx_train,
        kv_cells=config.kv_cells,
        prefix_cache=config.kv_cache_ram,
    )


def plan_load(config: RunnerConfig) -> MemoryPlan:
    """The memory plan for ``config`` on this machine, measured by llama.cpp; raises
    :class:`~localllm.daemon.memory.plan.DoesNotFit`."""
    llama_cpp.llama_backend_init()
    layout = _layout(config)
    host = host_device(config.mapped_ram)
    remote = worker_devices(config) if config.rpc_workers else []
    devices = [host, *remote, *llama_devices()]
    if remote:
        # A trial load onto the workers would connect to each (they serve one client at a
        # time): their share is priced from the GGUF instead.
        result = plan(
            plan_request(config, layout),
            devices,
            estimate(
                layout,
                devices,
                n_batch=batch_size(config),
                flash_attention=config.flash_attention,
            ),
            reserved=config.memory_reserved,
            gpu_cap=config.gpu_memory,
        )
        result = with_ahead(result, ahead_that_fits(result, config.n_ahead))
    else:
        # Planned without the prefill-ahead sequences: they get only what the plan leaves
        # (never a shorter context or a GPU layer), then the chosen load is measured with them.
        measure = LlamaMeasure(replace(config, n_ahead=0), devices, layout)
        try:
            result = plan(
                plan_request(config, layout),
                devices,
                measure,
                reserved=config.memory_reserved,
                gpu_cap=config.gpu_memory,
                measured=True,
            )
            if n_ahead := ahead_that_fits(result, config.n_ahead):
                measure.config = replace(measure.config, n_ahead=n_ahead)
                trial = Trial(
                    result.n_ctx_per_slot, result.n_slots, result.n_gpu_layers, config.kv_cells
                )
                result = with_ahead(result, n_ahead, measure(trial))
        finally:
            measure.close()
    log.info(
        "memory plan: %d slots x %d tokens, %d of %d layers offloaded, %d MiB (%s); %s",
        result.n_slots,
        result.n_ctx_per_slot,
        result.n_gpu_layers,
        result.n_layer + 1,
        result.size // _MIB,
        result.processor(),
        ", ".join(f"{d.name} {result.budgets.get(d.name, 0) // _MIB} MiB usable" for d in devices),
    )
    return result
