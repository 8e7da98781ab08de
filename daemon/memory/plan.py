"""The memory plan: where a model's weights, KV cache and compute buffers go, and whether they
fit, decided before anything is allocated.

llama-server's ``--fit`` (llama.cpp's ``common/fit.cpp``, C++ that the ctypes API does not
export) searches the load parameters against each device's free memory, measuring every
candidate with a ``no_alloc`` load. :func:`plan` is that search in this project's terms:

* **Devices are data** (:class:`Device`: name, kind, free and total bytes): the host's RAM
  (read by :mod:`localllm.daemon.memory.system`, cgroup-aware), llama.cpp's GPUs, remote RPC
  devices alike. Each gets
  a budget: its free bytes less a margin (:func:`margin`) and less what other loaded models
  are still entitled to grow into (``reserved``).
* **A measure prices a trial** (:data:`Measure`: context, slots, GPU layers → bytes per
  device). The runner's measure asks llama.cpp (``no_alloc`` loads,
  :mod:`localllm.daemon.memory.measure`);
  :func:`localllm.daemon.memory.layout.estimate` computes the same from the GGUF alone, for the
  unit tests and
  wherever llama.cpp cannot be asked.
* **GPU layers** (``num_gpu`` not given): all of them when they fit, else the most the GPUs
  hold, found by bisection (GPU memory grows with each layer offloaded, host memory shrinks).
  Layers go to devices as llama.cpp puts them (:func:`localllm.daemon.memory.layout.place_layers`):
  the last
  ones first, split between GPUs in proportion to their free memory, the output layer last.
* **Context** (``num_ctx`` not given): the largest of :data:`CONTEXT_STEPS` and the trained
  length that fits *with headroom* (within :data:`AUTO_HEADROOM` of every budget) without
  giving up a GPU layer that the smallest step keeps: a longer default context never costs
  speed. The smallest step must fit, without the headroom.
* **Nothing fits**: :class:`DoesNotFit` carries what the smallest trial needs, what is free and
  what would fit instead (a smaller ``num_ctx``, one slot, fewer GPU layers), each checked with
  the same measure; :func:`refusal` words it for people.
* **The prefix cache** (idle prompts' KV kept in RAM) is flexible: it gets at most half of
  the RAM the model leaves, up to the configured size, and never makes a load fail.

A ``num_ctx`` above the trained length is honoured with a warning in the plan (llama.cpp
extends positions past training; answers there may degrade), never clamped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from localllm._format import processor

__all__ = [
    "AUTO_HEADROOM",
    "CONTEXT_STEPS",
    "HOST",
    "MIB",
    "Device",
    "DeviceUse",
    "DoesNotFit",
    "MemoryPlan",
    "NoFitReport",
    "PlanRequest",
    "Trial",
    "ahead_that_fits",
    "budgets",
    "context_candidates",
    "margin",
    "plan",
    "refusal",
    "with_ahead",
]

MIB = 1 << 20
HOST = "CPU"
"""The host's RAM as a device (llama.cpp's name for its CPU device)."""
CONTEXT_STEPS = (4096, 8192, 16384, 32768)
"""Context lengths a plan chooses from when none is given (with the trained length)."""
AUTO_HEADROOM = 0.75
"""A context chosen by memory beyond the smallest step uses at most this share of a budget."""
_SMALLEST_SUGGESTION = 256


@dataclass(frozen=True)
class Device:
    """Memory a model can be placed in: the host's RAM, a GPU, a remote (RPC) device."""

    name: str
    """llama.cpp's device name (``CPU``, ``CUDA0``, ``Vulkan1``, ``RPC[host:port]``)."""
    kind: str
    """``cpu`` (the host's RAM), ``gpu``, ``igpu`` (shares RAM), ``rpc`` or ``accel``."""
    free: int
    """Bytes free now."""
    total: int
    """Bytes in all."""
    description: str = ""
    """What the device is (``NVIDIA GeForce RTX 4090``), for people."""

    @property
    def is_host(self) -> bool:
        """True for the host's RAM (where layers not offloaded stay)."""
        return self.kind == "cpu"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Device:
        """The inverse of ``dataclasses.asdict``."""
        return cls(
            **{k: data[k] for k in ("name", "kind", "free", "total") if k in data},
            description=str(data.get("description", "")),
        )


@dataclass
class DeviceUse:
    """What one trial puts on one device, in bytes."""

    device: str
    """The device's name."""
    weights: int = 0
    """Model weights."""
    kv: int = 0
    """KV cache."""
    compute: int = 0
    """Compute (scratch) buffers, and the output (logits) buffer."""
    other: int = 0
    """The vision projector and the draft model."""
    layers: int = 0
    """Layers placed here (the output layer counts as one)."""

    @property
    def total(self) -> int:
        """Everything together."""
        return self.weights + self.kv + self.compute + self.other


@dataclass(frozen=True)
class Trial:
    """One candidate set of load parameters."""

    n_ctx_per_slot: int
    """Context per slot."""
    n_slots: int
    """Parallel sequences."""
    n_gpu_layers: int
    """Layers offloaded (llama.cpp's ``n_gpu_layers``: the output layer counts as one)."""
    kv_cells: int = 0
    """KV cells in all; 0 means slots × context."""

    @property
    def cells(self) -> int:
        """KV cells in all."""
        return self.kv_cells or self.n_ctx_per_slot * self.n_slots


Measure = Callable[[Trial], list[DeviceUse]]
"""Prices a trial: the bytes it needs on each device."""


@dataclass(frozen=True)
class PlanRequest:
    """What a load asks for; ``None`` leaves the choice to the plan."""

    n_slots: int
    """Parallel sequences (never changed by the plan)."""
    n_ctx_per_slot: int | None
    """Context per slot; None: the largest step that fits."""
    n_gpu_layers: int | None
    """Layers to offload; None: as many as fit."""
    n_layer: int
    """Repeating layers of the model."""
    n_ctx_train: int
    """The context length the model was trained for (0: unknown)."""
    kv_cells: int = 0
    """KV cells in all when fixed (an overcommitted unified cache); 0: slots × context."""
    prefix_cache: int = 0
    """Bytes of RAM wanted for saved prompt prefixes (shrunk to what is left)."""


@dataclass
class MemoryPlan:
    """A load that fits: its parameters and what it puts where."""

    n_slots: int
    """Parallel sequences."""
    n_ctx_per_slot: int
    """Context per slot."""
    n_gpu_layers: int
    """Layers offloaded (the output layer counts as one)."""
    n_layer: int
    """Repeating layers of the model."""
    kv_cells: int
    """KV cells in all."""
    uses: list[DeviceUse]
    """Bytes per device."""
    devices: list[Device]
    """The devices as the plan saw them."""
    budgets: dict[str, int]
    """Bytes the plan could use on each device."""
    prefix_cache: int = 0
    """Bytes of RAM for saved prompt prefixes (the configured size, or what was left)."""
    context_chosen: bool = False
    """True when the plan chose the context (none was given)."""
    measured: bool = False
    """True when llama.cpp measured the buffers (``no_alloc``), not only the GGUF estimate."""
    warnings: list[str] = field(default_factory=list)
    """What people should know (a context above the trained length...)."""
    n_ahead: int = 0
    """Prefill-ahead sequences (``RunnerConfig.n_ahead``) in the memory the rest of the plan
    leaves (:func:`ahead_that_fits`); ``uses`` count them."""

    @property
    def size(self) -> int:
        """Bytes in all (the prefix cache, which grows with use, left out)."""
        return sum(u.total for u in self.uses)

    @property
    def size_vram(self) -> int:
        """Bytes on devices other than the host's RAM."""
        hosts = {d.name for d in self.devices if d.is_host}
        return sum(u.total for u in self.uses if u.device not in hosts)

    @property
    def host_bytes(self) -> int:
        """Bytes of the host's RAM, the prefix cache included."""
        return self.size - self.size_vram + self.prefix_cache

    def processor(self) -> str:
        """Where it runs, as ``ollama ps`` says it: ``100% CPU``, ``38%/62% CPU/GPU``."""
        return processor(self.size, self.size_vram)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the runner's health and ``/api/plan`` carry it)."""
        data = asdict(self)
        data.update(size=self.size, size_vram=self.size_vram, processor=self.processor())
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MemoryPlan:
        """The inverse of :meth:`to_dict`."""
        return cls(
            n_slots=int(data["n_slots"]),
            n_ctx_per_slot=int(data["n_ctx_per_slot"]),
            n_gpu_layers=int(data["n_gpu_layers"]),
            n_layer=int(data["n_layer"]),
            kv_cells=int(data["kv_cells"]),
            uses=[DeviceUse(**u) for u in data.get("uses", [])],
            devices=[Device.from_dict(d) for d in data.get("devices", [])],
            budgets={str(k): int(v) for k, v in data.get("budgets", {}).items()},
            prefix_cache=int(data.get("prefix_cache", 0)),
            context_chosen=bool(data.get("context_chosen", False)),
            measured=bool(data.get("measured", False)),
            warnings=[str(w) for w in data.get("warnings", [])],
            n_ahead=int(data.get("n_ahead", 0)),
        )


@dataclass
class NoFitReport:
    """Why a load cannot fit: the smallest trial's needs against the budgets."""

    trial: Trial
    """The trial priced (the smallest the request allows)."""
    uses: list[DeviceUse]
    """What it needs per device."""
    devices: list[Device]
    """The devices."""
    budgets: dict[str, int]
    """Bytes usable per device."""
    num_ctx: int | None = None
    """A context per slot that fits with the same slots, if one does."""
    one_slot: bool = False
    """Whether the requested context fits with one slot."""
    num_gpu: int | None = None
    """GPU layers that fit, when the request fixed more."""

    def short(self) -> dict[str, int]:
        """Bytes missing per device (the devices over budget only)."""
        return {
            u.device: u.total - self.budgets.get(u.device, 0)
            for u in self.uses
            if u.total > self.budgets.get(u.device, 0)
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the runner sends it to the daemon)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NoFitReport:
        """The inverse of :meth:`to_dict`."""
        return cls(
            trial=Trial(**data["trial"]),
            uses=[DeviceUse(**u) for u in data.get("uses", [])],
            devices=[Device.from_dict(d) for d in data.get("devices", [])],
            budgets={str(k): int(v) for k, v in data.get("budgets", {}).items()},
            num_ctx=data.get("num_ctx"),
            one_slot=bool(data.get("one_slot", False)),
            num_gpu=data.get("num_gpu"),
        )


class DoesNotFit(Exception):
    """No load parameters the request allows fit in the budgets."""

    def __init__(self, report: NoFitReport) -> None:
        super().__init__(refusal("the model", report))
        self.report = report
        """What was needed, what was free, what would fit instead."""


# -- budgets ------------------------------------------------------------------------------------


def margin(device: Device) -> int:
    """Bytes left unplanned on a device: 5% of it, at least 64 MiB of RAM (the runner's own
    Python and request buffers grow there) or 256 MiB of a GPU (driver scratch), at most 1 GiB
    (llama.cpp's ``--fit`` leaves 1 GiB per GPU)."""
    floor = 64 * MIB if device.is_host else 256 * MIB
    return min(max(device.total // 20, floor), 1024 * MIB)


def budgets(
    devices: Sequence[Device], reserved: dict[str, int] | None = None, gpu_cap: int = 0
) -> dict[str, int]:
    """Bytes a new load may plan on each device: free, less the margin, less ``reserved`` (what
    loaded models are still entitled to grow into); on a local GPU at most ``gpu_cap`` when it
    is set (``LOCALLLM_GPU_MEMORY``)."""
    reserved = reserved or {}
    budget = {d.name: max(d.free - margin(d) - reserved.get(d.name, 0), 0) for d in devices}
    if gpu_cap > 0:
        for device in devices:
            if device.kind in ("gpu", "igpu"):
                budget[device.name] = min(budget[device.name], gpu_cap)
    return budget


def context_candidates(n_ctx_train: int) -> list[int]:
    """Contexts to choose from when none is given, smallest first: the steps up to the trained
    length and the trained length itself (the trained length alone when it is below 4096)."""
    if n_ctx_train <= 0:
        return list(CONTEXT_STEPS)
    steps = {c for c in CONTEXT_STEPS if c <= n_ctx_train} | {n_ctx_train}
    return sorted(steps)


# -- the search -------------------------------------------------------------------------------


def ahead_that_fits(plan: MemoryPlan, wanted: int) -> int:
    """How many of ``wanted`` prefill-ahead sequences (``RunnerConfig.n_ahead``: a KV stream
    as large as a slot's each) fit beside ``plan`` within :data:`AUTO_HEADROOM` of every
    budget, its prefix cache counted. They take only what the plan leaves: never a shorter
    context or a GPU layer. In an overcommitted unified cache they share the pool's cells,
    so all fit."""
    if wanted <= 0 or plan.kv_cells != plan.n_ctx_per_slot * plan.n_slots:
        return max(wanted, 0)
    hosts = {d.name for d in plan.devices if d.is_host}
    fit = wanted
    for use in plan.uses:
        if not use.kv:
            continue
        per_stream = use.kv / plan.n_slots
        used = use.total + (plan.prefix_cache if use.device in hosts else 0)
        room = plan.budgets.get(use.device, 0) * AUTO_HEADROOM - used
        fit = min(fit, max(0, math.floor(room / per_stream)))
    return fit


def with_ahead(plan: MemoryPlan, n_ahead: int, uses: list[DeviceUse] | None = None) -> MemoryPlan:
    """``plan`` with ``n_ahead`` prefill-ahead sequences: ``uses`` as measured with them, or
    (None) the KV grown by as many streams, each a slot's (the GGUF estimate's way)."""
    if n_ahead <= 0:
        return plan
    if uses is None:
        streams = plan.kv_cells == plan.n_ctx_per_slot * plan.n_slots
        grow = n_ahead / plan.n_slots if streams else 0.0  # a unified pool's cells are shared
        uses = [replace(u, kv=u.kv + round(u.kv * grow)) for u in plan.uses]
    return replace(plan, uses=uses, n_ahead=n_ahead)


def _fits(uses: Sequence[DeviceUse], budget: dict[str, int], share: float = 1.0) -> bool:
    return all(u.total <= budget.get(u.device, 0) * share for u in uses)


def _gpus_fit(uses: Sequence[DeviceUse], budget: dict[str, int], host: str) -> bool:
    return all(u.total <= budget.get(u.device, 0) for u in uses if u.device != host)


class _Search:
    """One plan's trials, each priced once."""

    def __init__(
        self,
        request: PlanRequest,
        devices: Sequence[Device],
        measure: Measure,
        budget: dict[str, int],
    ) -> None:
        self.request = request
        self.measure = measure
        self.budget = budget
        self.host = next(d.name for d in devices if d.is_host)
        has_gpu = any(not d.is_host for d in devices)
        self.max_layers = request.n_layer + 1 if has_gpu else 0
        self._priced: dict[Trial, list[DeviceUse]] = {}

    def price(self, ctx: int, layers: int, slots: int | None = None) -> list[DeviceUse]:
        trial = Trial(ctx, slots or self.request.n_slots, layers, self.request.kv_cells)
        if trial not in self._priced:
            self._priced[trial] = self.measure(trial)
        return self._priced[trial]

    def most_layers(self, ctx: int) -> int:
        """The most layers the GPUs hold at ``ctx`` (GPU memory grows with layers)."""
        if self.max_layers == 0:
            return 0
        if _gpus_fit(self.price(ctx, self.max_layers), self.budget, self.host):
            return self.max_layers
        low, high = 0, self.max_layers  # the GPUs hold `low` layers, not `high`
        while high - low > 1:
            middle = (low + high) // 2
            if _gpus_fit(self.price(ctx, middle), self.budget, self.host):
                low = middle
            else:
                high = middle
        return low

    def layers(self, ctx: int) -> int:
        """GPU layers for a trial at ``ctx``: the request's, else the most that fit."""
        fixed = self.request.n_gpu_layers
        if fixed is not None:
            return min(max(fixed, 0), self.max_layers)
        return self.most_layers(ctx)

    def report(self, ctx: int) -> NoFitReport:
        layers = self.layers(ctx)
        uses = self.price(ctx, layers)
        report = NoFitReport(
            Trial(ctx, self.request.n_slots, layers, self.request.kv_cells), uses, [], self.budget
        )
        if not self.request.kv_cells:
            smaller = 1 << max(ctx - 1, 1).bit_length() - 1
            while smaller >= _SMALLEST_SUGGESTION:
                if smaller < ctx and _fits(self.price(smaller, layers), self.budget):
                    report.num_ctx = smaller
                    break
                smaller //= 2
        if self.request.n_slots > 1:
            report.one_slot = _fits(self.price(ctx, layers, slots=1), self.budget)
        fixed = self.request.n_gpu_layers
        if fixed is not None and fixed > 0 and self.max_layers:
            fitting = self.most_layers(ctx)
            if fitting < min(fixed, self.max_layers) and _fits(
                self.price(ctx, fitting), self.budget
            ):
                report.num_gpu = fitting
        return report


def plan(
    request: PlanRequest,
    devices: Sequence[Device],
    measure: Measure,
    reserved: dict[str, int] | None = None,
    *,
    measured: bool = False,
    gpu_cap: int = 0,
) -> MemoryPlan:
    """The load parameters for ``request`` that fit ``devices`` (see the module docstring);
    raises :class:`DoesNotFit`. ``devices`` must hold one host device; ``gpu_cap`` is the most
    planned on each local GPU (0: what is free)."""
    if not any(d.is_host for d in devices):
        raise ValueError("a plan needs the host's RAM among its devices")
    budget = budgets(devices, reserved, gpu_cap)
    search = _Search(request, devices, measure, budget)
    warnings: list[str] = []
    wanted = request.n_ctx_per_slot
    if wanted is not None and request.n_ctx_train and wanted > request.n_ctx_train:
        warnings.append(
            f"num_ctx {wanted:,} is above the {request.n_ctx_train:,} tokens the model was "
            "trained for: llama.cpp extends positions past training, and answers that go "
            "beyond it may degrade"
        )
    if request.n_gpu_layers and request.n_gpu_layers > 0 and search.max_layers == 0:
        warnings.append(
            f"num_gpu {request.n_gpu_layers} asks for GPU layers, but llama.cpp found no GPU: "
            "everything runs on the CPU"
        )
    candidates = [wanted] if wanted is not None else context_candidates(request.n_ctx_train)
    ctx = candidates[0]
    layers = search.layers(ctx)
    uses = search.price(ctx, layers)
    if not _fits(uses, budget):
        report = search.report(ctx)
        report.devices = list(devices)
        raise DoesNotFit(report)
    for larger in reversed(candidates[1:]):
        larger_uses = search.price(larger, layers)
        if _fits(larger_uses, budget, AUTO_HEADROOM):
            ctx, uses = larger, larger_uses
            break
    if request.n_gpu_layers is None and layers < search.max_layers:
        warnings.append(_partial_offload(layers, search.max_layers, devices, budget, gpu_cap))
    host_use = next((u.total for u in uses if u.device == search.host), 0)
    left = budget[search.host] - host_use
    prefix = min(request.prefix_cache, max(left // 2, 0))
    if prefix < request.prefix_cache:
        warnings.append(
            f"the prompt-prefix cache gets {prefix // MIB:,} MiB of RAM, not the "
            f"{request.prefix_cache // MIB:,} MiB configured (LOCALLLM_KV_CACHE_RAM): that is "
            "half of what the model leaves free"
        )
    return MemoryPlan(
        n_slots=request.n_slots,
        n_ctx_per_slot=ctx,
        n_gpu_layers=layers,
        n_layer=request.n_layer,
        kv_cells=request.kv_cells or ctx * request.n_slots,
        uses=uses,
        devices=list(devices),
        budgets=budget,
        prefix_cache=prefix,
        context_chosen=wanted is None,
        measured=measured,
        warnings=warnings,
    )


# -- words ------------------------------------------------------------------------------------


def _mib(n: int, up: bool = True) -> str:
    return f"{math.ceil(n / MIB) if up else n // MIB:,}"


def _partial_offload(
    layers: int, most: int, devices: Sequence[Device], budget: dict[str, int], gpu_cap: int
) -> str:
    """Why a plan left layers on the CPU, for people."""
    gpus = [d for d in devices if not d.is_host]
    usable = ", ".join(f"{d.name} {_mib(budget.get(d.name, 0), up=False)} MiB" for d in gpus)
    why = f"the GPU memory usable ({usable}) holds no more"
    if gpu_cap > 0:
        why += f"; LOCALLLM_GPU_MEMORY caps each GPU at {_mib(gpu_cap, up=False)} MiB"
    return f"{layers} of {most} layers on the GPU, the rest on the CPU: {why}"


def _where(device: str, devices: Sequence[Device], several: bool) -> str:
    if not several:
        return ""
    host = any(d.is_host and d.name == device for d in devices)
    return " of RAM" if host else f" on {device}"


def refusal(name: str, report: NoFitReport) -> str:
    """The sentence a refused load answers with: what it needs (and of what), what is free,
    and what to change, e.g. "smollm2:135m needs 913 MiB (weights 95, KV 720 for 4 × 8,192
    cells, compute 98); 612 MiB are free; try num_ctx 2048 or LOCALLLM_NUM_PARALLEL=1"."""
    trial = report.trial
    used = [u for u in report.uses if u.total > 0]
    several = len(used) > 1
    cells = (
        f"{trial.n_slots} × {trial.n_ctx_per_slot:,} cells"
        if not trial.kv_cells
        else f"{trial.kv_cells:,} cells"
    )
    needs, told_cells = [], False
    for use in used:
        parts = [f"weights {_mib(use.weights)}"] if use.weights else []
        if use.kv:
            parts.append(f"KV {_mib(use.kv)}" + ("" if told_cells else f" for {cells}"))
            told_cells = True
        if use.compute:
            parts.append(f"compute {_mib(use.compute)}")
        if use.other:
            parts.append(f"projector and draft {_mib(use.other)}")
        where = _where(use.device, report.devices, several)
        needs.append(f"{_mib(use.total)} MiB{where} ({', '.join(parts)})")
    free = [
        f"{_mib(report.budgets.get(u.device, 0), up=False)} MiB"
        f"{_where(u.device, report.devices, several)}"
        for u in used
    ]
    tries = []
    if report.num_ctx is not None:
        tries.append(f"num_ctx {report.num_ctx}")
    if report.one_slot:
        tries.append("LOCALLLM_NUM_PARALLEL=1")
    if report.num_gpu is not None:
        tries.append(f"num_gpu {report.num_gpu}")
    advice = (
        "try " + " or ".join(tries)
        if tries
        else "free memory (stop other models or programs) or use a smaller quantization"
    )
    return f"{name} needs {' and '.join(needs)}; {' and '.join(free)} are free; {advice}"
