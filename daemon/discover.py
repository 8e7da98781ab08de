"""A Hugging Face repository seen from this machine, before anything is downloaded: for each of
its quantizations, where the memory plan would put it and how fast it would run.

The plan needs the model's shapes. They come from one GGUF header read with Range requests
(:func:`localllm.sources.hub.read_header`, a few MB): the quantization asked for, else the one a
pull without a tag would start from (Q4_K_M or the nearest). The other quantizations of the
same model have the same layers with other weight types: their layout is that header's with
the bytes scaled to their file size, and their weights priced at the rates of their own main
type (``Q8_0`` for Q8_0, ``Q5_K`` for Q5_K_M...); :attr:`QuantReport.shapes` says which. When no
header can be read (a server without ranges, an unreadable file), the Hub's metadata stands in:
the parameter count and context length, all weights in one block, no KV cache counted.

Each quantization is planned by :func:`~localllm.daemon.memory.plan.plan` with the GGUF estimate
(:func:`~localllm.daemon.memory.layout.estimate`) on this machine's devices as a load would see
them (free RAM
less what loaded models may still grow into; llama.cpp's GPUs, listed by a child process), at
the settings' slots and context. :func:`fit_verdict` words the outcome as LM Studio's model
browser does: all layers on the GPU, N of M layers on the GPU, CPU only, or does not fit.

:func:`pick_quant` is what ``localllm pull hf.co/<user>/<repo>`` without a tag takes: the
largest quantization (unquantized F16/BF16/F32 left out: several times slower to decode for
little gain) that runs wholly on the fastest device at the default context, else the one that
puts the most layers on the GPU (not below 4 bits a weight when one of those fits), else the
smallest that fits at all.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localllm._exceptions import GGUFError, LocalLLMError, PullError
from localllm.gguf_info import GGUFInfo
from localllm.settings import Settings
from localllm.sources.hub import (
    QuantFiles,
    RepoListing,
    default_quant,
    list_repo,
    read_header,
)

from .memory.layout import ModelLayout, estimate, layout_from_gguf
from .memory.plan import HOST, Device, DoesNotFit, MemoryPlan, PlanRequest, plan, refusal
from .speed.model import Calibration, ModelCost, Prediction, model_cost, predict
from .speed.probe import ProbeInterrupted

if TYPE_CHECKING:
    from .scheduler import LoadedModel, Scheduler
    from .speed.book import SpeedBook
    from .speed.watch import SpeedWatch

log = logging.getLogger("localllm.discover")

__all__ = [
    "DeviceCache",
    "Discovery",
    "NothingFits",
    "QuantReport",
    "RepoReport",
    "cached_calibration",
    "fit_verdict",
    "host_device",
    "pick_quant",
    "probe_threads",
    "wire",
]

_UNQUANTIZED = ("F32", "F16", "BF16")
_MIN_BITS = 4.0
# Quant labels whose files are mostly another ggml type than the label says.
_MAIN_TYPE = {"IQ3_M": "IQ3_S", "IQ3_XS": "IQ3_S", "IQ2_M": "IQ2_S", "IQ4_NL_4_4": "IQ4_NL"}
_K_QUANT = re.compile(r"^(Q[2-6]_K)(?:_[SML]|_XL|_L)?$")


def main_type(label: str | None) -> str | None:
    """The ggml type most of a quantization's weights have (``Q4_K_M`` → ``Q4_K``), or None."""
    if not label:
        return None
    name = label.upper().removeprefix("UD-")
    if name in _MAIN_TYPE:
        return _MAIN_TYPE[name]
    if match := _K_QUANT.match(name):
        return match.group(1)
    import gguf

    return name if name in gguf.GGMLQuantizationType.__members__ else None


def host_device(memory_free: int, total: int) -> Device:
    """The host's RAM as a device (what :func:`~localllm.daemon.memory.measure.host_device` gives a
    runner)."""
    return Device(HOST, "cpu", max(memory_free, 0), total, "host RAM")


# -- one quantization ---------------------------------------------------------------------------


@dataclass
class QuantReport:
    """One quantization of a repository on this machine."""

    quant: QuantFiles
    """Its files."""
    shapes: str
    """Where its layout came from: ``header`` (its own), ``scaled from <label>`` (another
    quantization's header, bytes scaled to this file's size) or ``hub metadata``."""
    fit: str
    """``gpu`` (all layers on GPUs), ``partial``, ``cpu`` (a machine without a GPU, or none
    fits on it) or ``none`` (does not fit)."""
    verdict: str
    """The fit in words: ``all 31 layers on the GPU``, ``18 of 31 layers on the GPU``,
    ``CPU only``, ``does not fit``."""
    plan: MemoryPlan | None = None
    """The memory plan (None when it does not fit)."""
    refusal: str | None = None
    """What it needs and what is free, when it does not fit."""
    prediction: Prediction | None = None
    """Predicted speed (None when the probe has no figures, or it does not fit)."""
    bits_per_weight: float | None = None
    """File bits per parameter."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``POST /api/hub/show``)."""
        plan = self.plan
        return {
            **self.quant.to_dict(),
            "shapes": self.shapes,
            "fit": self.fit,
            "verdict": self.verdict,
            "context_length": plan.n_ctx_per_slot if plan is not None else None,
            "slots": plan.n_slots if plan is not None else None,
            "gpu_layers": plan.n_gpu_layers if plan is not None else 0,
            "layers": plan.n_layer + 1 if plan is not None else None,
            "memory": {u.device: u.total for u in plan.uses} if plan is not None else {},
            "refusal": self.refusal,
            "bits_per_weight": round(self.bits_per_weight, 2) if self.bits_per_weight else None,
            "predicted": self.prediction.to_dict() if self.prediction is not None else None,
        }


def fit_verdict(
    result: MemoryPlan | DoesNotFit, devices: Sequence[Device], name: str = "the model"
) -> tuple[str, str, str | None]:
    """``(fit, verdict, refusal)`` of a plan (or of its refusal) in LM Studio's words."""
    if isinstance(result, DoesNotFit):
        return "none", "does not fit", refusal(name, result.report)
    layers = result.n_layer + 1
    gpus = [d for d in devices if not d.is_host]
    if not gpus:
        return "cpu", "CPU only", None
    noun = "GPU" if len(gpus) == 1 else "GPUs"
    if result.n_gpu_layers >= layers:
        return "gpu", f"all {layers} layers on the {noun}", None
    if result.n_gpu_layers <= 0:
        return "cpu", f"CPU only (the {noun} {'has' if len(gpus) == 1 else 'have'} no room)", None
    return "partial", f"{result.n_gpu_layers} of {layers} layers on the {noun}", None


def _scaled_layout(layout: ModelLayout, factor: float) -> ModelLayout:
    return dataclasses.replace(
        layout,
        layer_weights=tuple(round(w * factor) for w in layout.layer_weights),
        input_weights=round(layout.input_weights * factor),
        output_weights=round(layout.output_weights * factor),
        tied_output=round(layout.tied_output * factor),
    )


def _hub_layout(listing: RepoListing, quant: QuantFiles) -> ModelLayout:
    """All weights in one layer, no KV: what the Hub's metadata allows when no header does."""
    context = listing.model.context_length or 0
    return ModelLayout(
        n_layer=1,
        layer_weights=(quant.size,),
        input_weights=0,
        output_weights=0,
        kv_per_cell=(0,),
        n_ctx_train=context,
    )


@dataclass(frozen=True)
class _Shapes:
    """A header's layout and cost, and which quantization it was read from."""

    label: str
    size: int
    layout: ModelLayout
    cost: ModelCost
    parameters: int


def _shapes_for(
    shapes: _Shapes | None, quant: QuantFiles
) -> tuple[ModelLayout | None, ModelCost | None, str]:
    if shapes is None:
        return None, None, "hub metadata"
    if shapes.label == quant.label:
        return shapes.layout, shapes.cost, "header"
    factor = quant.size / max(shapes.size, 1)
    cost = shapes.cost
    target = main_type(quant.label)
    if target is not None:
        # Only the quantized matrices change type; norms and biases stay F32.
        keep = {"F32"} if target not in _UNQUANTIZED else set()
        cost = cost.retyped({t: target for t in cost.types if t not in keep})
    return _scaled_layout(shapes.layout, factor), cost.scaled(factor), f"scaled from {shapes.label}"


@dataclass
class RepoReport:
    """What :meth:`Discovery.report` found."""

    listing: RepoListing
    """The repository's files and metadata."""
    quants: list[QuantReport]
    """Each quantization on this machine, smallest first."""
    devices: list[Device]
    """The devices as planned on."""
    header: str | None
    """The quantization whose header was read (None: the Hub's metadata stood in)."""
    header_error: str | None = None
    """Why no header could be read, when none was."""
    speed_error: str | None = None
    """Why nothing is predicted, when the probe could not run."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``POST /api/hub/show``)."""
        listing = self.listing
        return {
            "model": f"hf.co/{listing.repo_id}",
            "revision": listing.revision,
            "info": listing.model.to_dict(),
            "card": listing.card,
            "projectors": [{"path": p.path, "size": p.size} for p in listing.projectors],
            "header": self.header,
            "header_error": self.header_error,
            "speed_error": self.speed_error,
            "devices": [dataclasses.asdict(d) for d in self.devices],
            "quants": [q.to_dict() for q in self.quants],
        }


# -- choosing ------------------------------------------------------------------------------------


class NothingFits(PullError):
    """No quantization of a repository fits this machine's memory."""


def _is_unquantized(report: QuantReport) -> bool:
    return main_type(report.quant.label) in _UNQUANTIZED


def pick_quant(reports: Sequence[QuantReport], has_gpu: bool) -> tuple[QuantReport, str]:
    """The quantization a pull without a tag takes (see the module docstring), and why.

    Raises :class:`NothingFits` when none fits, naming the smallest's needs."""
    fitting = [r for r in reports if r.fit != "none"]
    if not fitting:
        smallest = min(reports, key=lambda r: r.quant.size)
        raise NothingFits(
            f"no quantization fits this machine; the smallest, {smallest.quant.label}: "
            f"{smallest.refusal}"
        )
    quantized = [r for r in fitting if not _is_unquantized(r)] or fitting
    device = "the GPU" if has_gpu else "the CPU"
    whole = [r for r in quantized if r.fit == ("gpu" if has_gpu else "cpu")]
    if whole:
        best = max(whole, key=lambda r: r.quant.size)
        context = best.plan.n_ctx_per_slot if best.plan is not None else 0
        why = (
            f"the largest quantization that runs wholly on {device} at a {context:,}-token context"
        )
        if len(quantized) < len(fitting):
            why += " (F16/BF16/F32 left out: several times slower to decode for little gain)"
        return best, why

    def layers(report: QuantReport) -> int:
        return report.plan.n_gpu_layers if report.plan is not None else 0

    solid = [r for r in quantized if (r.bits_per_weight or _MIN_BITS) >= _MIN_BITS] or quantized
    best = max(solid, key=lambda r: (layers(r), r.quant.size))
    why = f"none runs wholly on {device}; this one puts the most layers there ({best.verdict})"
    if len(solid) < len(quantized):
        why += f", and keeps at least {_MIN_BITS:.0f} bits a weight"
    return best, why


# -- the service ---------------------------------------------------------------------------------


Devices = Callable[[], list[Device]]
"""This machine's devices for a plan: the host first, then llama.cpp's GPUs."""


@dataclass
class Discovery:
    """Plans and predictions for Hub repositories on this machine (the daemon keeps one)."""

    settings: Settings
    """Slots, context, KV type, Hub endpoint and timeout."""
    devices: Devices
    """Where a model could go, as free as they are now."""
    calibration: Callable[..., Calibration] | None = None
    """The speed probe's figures with these weight types measured (None: no predictions);
    ``experts=`` names the types whose routed experts must be measured too (a
    mixture-of-experts repository's)."""
    cached: Callable[[], Calibration | None] = lambda: None
    """The figures measured so far, without probing."""
    correction: Callable[[str | None], tuple[float, float]] = lambda main_type: (0.0, 0.0)
    """Seconds learned from served models, per decode step and per prompt token, for a model
    of the given main weight type."""

    def _request(self, layout: ModelLayout) -> PlanRequest:
        settings = self.settings
        return PlanRequest(
            n_slots=settings.num_parallel,
            n_ctx_per_slot=settings.context_length or None,
            n_gpu_layers=None,
            n_layer=layout.n_layer,
            n_ctx_train=layout.n_ctx_train,
            prefix_cache=settings.kv_cache_ram,
        )

    def plan_layout(
        self, layout: ModelLayout, devices: Sequence[Device], projector: int = 0
    ) -> MemoryPlan | DoesNotFit:
        """The memory plan of ``layout`` on ``devices`` (its refusal when it does not fit)."""
        measure = estimate(
            layout,
            devices,
            flash_attention=self.settings.flash_attention,
            host_other=projector + projector // 4,
        )
        try:
            return plan(self._request(layout), devices, measure)
        except DoesNotFit as exc:
            return exc

    def _shapes(self, listing: RepoListing, quant: QuantFiles) -> tuple[_Shapes | None, str | None]:
        try:
            parts = read_header(self.settings, listing, quant)
        except (GGUFError, PullError) as exc:
            return None, str(exc)
        return self.shapes_of(quant, parts), None

    def shapes_of(self, quant: QuantFiles, parts: Sequence[GGUFInfo]) -> _Shapes:
        """The layout and cost of ``quant`` from its headers."""
        layout = layout_from_gguf(parts, self.settings.kv_cache_type)
        cost = model_cost(parts, layout.kv_per_cell)
        parameters = sum(p.parameter_count for p in parts)
        return _Shapes(quant.label, quant.size, layout, cost, parameters)

    def _calibration(
        self, shapes: _Shapes | None, quants: Sequence[QuantFiles], probe: bool
    ) -> tuple[Calibration | None, str | None, str | None]:
        """The figures to predict with, why there are none, and why some types have none
        (their probe's figures were not kept: the kept figures still predict the rest)."""
        if self.calibration is None or shapes is None:
            return None, None, None
        types = set(shapes.cost.types)
        types |= {t for q in quants if (t := main_type(q.label)) is not None}
        # A mixture-of-experts model's experts, in whatever type each quantization has them
        # (the header's own, or the quantization's main type: ``_shapes_for``).
        experts: set[str] = set()
        if shapes.cost.experts[0]:
            experts = shapes.cost.expert_types
            experts |= {t for q in quants if (t := main_type(q.label)) is not None}
        if not probe:
            figures = self.cached()
            if figures is not None and types <= set(figures.types):
                return figures, None, None
            return None, None, None
        try:
            if experts:
                return self.calibration(sorted(types), experts=sorted(experts)), None, None
            return self.calibration(sorted(types)), None, None
        except ProbeInterrupted as exc:
            # A probe of the types not measured yet did not keep its figures (a busy machine):
            # what was measured before still predicts every quantization made of those types.
            kept = self.cached()
            if kept is None:
                return None, f"no speed figures: {exc}", None
            return kept, None, str(exc)
        except (LocalLLMError, RuntimeError, OSError) as exc:
            return None, f"no speed figures: {exc}", None

    def report(
        self,
        repo_id: str,
        tag: str | None = None,
        *,
        listing: RepoListing | None = None,
        devices: Sequence[Device] | None = None,
        probe: bool = True,
    ) -> RepoReport:
        """Every quantization of ``hf.co/<repo_id>`` (only ``tag``'s when given) on this
        machine: fit, context and predicted speed. Blocking (Hub requests, maybe the probe;
        without ``probe``, speed is predicted only from figures already measured)."""
        listing = listing or list_repo(self.settings, repo_id)
        devices = list(devices if devices is not None else self.devices())
        quants = [listing.find(tag)] if tag else listing.quants
        first = quants[0] if tag else default_quant(listing)
        shapes, header_error = self._shapes(listing, first)
        calibration, speed_error, unkept = self._calibration(shapes, quants, probe)
        # Quantizations of one main type share one correction (each reads the speed book).
        correction = functools.cache(self.correction)
        reports = [
            self._quant_report(listing, quant, shapes, devices, calibration, correction)
            for quant in quants
        ]
        for report in reports:
            predicted = report.prediction
            if unkept and predicted is not None and predicted.decode is None:
                report.prediction = dataclasses.replace(predicted, why=f"{predicted.why}: {unkept}")
        return RepoReport(
            listing=listing,
            quants=reports,
            devices=devices,
            header=shapes.label if shapes is not None else None,
            header_error=header_error,
            speed_error=speed_error,
        )

    def _quant_report(
        self,
        listing: RepoListing,
        quant: QuantFiles,
        shapes: _Shapes | None,
        devices: Sequence[Device],
        calibration: Calibration | None,
        correction: Callable[[str | None], tuple[float, float]],
    ) -> QuantReport:
        layout, cost, origin = _shapes_for(shapes, quant)
        if layout is None:
            layout = _hub_layout(listing, quant)
        projector = quant.projector.size if quant.projector is not None else 0
        result = self.plan_layout(layout, devices, projector)
        fit, verdict, refused = fit_verdict(result, devices, f"{listing.repo_id}:{quant.tag}")
        parameters = shapes.parameters if shapes is not None else listing.model.parameters
        report = QuantReport(
            quant=quant,
            shapes=origin,
            fit=fit,
            verdict=verdict,
            plan=result if isinstance(result, MemoryPlan) else None,
            refusal=refused,
            bits_per_weight=quant.size * 8 / parameters if parameters else None,
        )
        if report.plan is not None and cost is not None and calibration is not None:
            report.prediction = predict(
                cost,
                calibration,
                context=report.plan.n_ctx_per_slot,
                gpu_layers=report.plan.n_gpu_layers,
                kv_cache_type=self.settings.kv_cache_type,
                correction=correction(cost.main_type),
            )
        return report


class DeviceCache:
    """llama.cpp's GPUs (from a child process: the daemon never loads llama.cpp), listed at
    most every ``ttl`` seconds; the host's RAM read fresh each time."""

    def __init__(
        self,
        reserved: Callable[[], tuple[dict[str, int], int]],
        ttl: float = 30.0,
    ) -> None:
        self._reserved = reserved
        self._ttl = ttl
        self._gpus: list[Device] = []
        self._listed = 0.0

    def _list_gpus(self) -> list[Device]:
        from .devices.llamareport import system_report

        report = system_report()
        kinds = [d for d in report.get("devices", []) if d.get("type") in ("gpu", "igpu")]
        chosen = [d for d in kinds if d["type"] == "gpu"] or kinds
        return [
            Device(
                str(d["name"]),
                str(d["type"]),
                int(d.get("memory_free", 0)),
                int(d.get("memory_total", 0)),
                str(d.get("description", "")),
            )
            for d in chosen
        ]

    def __call__(self) -> list[Device]:
        """The host (free RAM less what loaded models may grow into), then the GPUs."""
        from .memory.system import host_memory

        now = time.monotonic()
        if now - self._listed > self._ttl:
            self._gpus = self._list_gpus()
            self._listed = now
        reserved, mapped = self._reserved()
        memory = host_memory()
        free = memory.mem_available - mapped - reserved.get(HOST, 0)
        if memory.cgroup_room is not None:
            free = min(free, memory.cgroup_room - reserved.get(HOST, 0))
        return [host_device(free, memory.total), *self._gpus]


# -- the daemon's objects -----------------------------------------------------------------------


def probe_threads(settings: Settings) -> int:
    """The thread count runners use at most, which the speed probe measures with."""
    from .devices.cpu import default_threads

    return settings.num_threads or default_threads()


def cached_calibration(settings: Settings) -> Calibration | None:
    """The probe's figures for the runners' thread count, if measured (never probes)."""
    from .speed.probe import cached_calibration as cached

    return cached(settings, probe_threads(settings))


def wire(settings: Settings, scheduler: Scheduler) -> tuple[Discovery, SpeedBook, SpeedWatch]:
    """The daemon's discovery, speed book (the scheduler telling it of every finished
    request) and the watch that measures this machine's speed at its first quiet moment."""
    from .speed.book import SpeedBook
    from .speed.probe import calibrate, probe_key
    from .speed.watch import SpeedWatch

    threads = probe_threads(settings)
    book = SpeedBook(settings.cache_dir / "speed-observed", lambda: probe_key(threads))

    def calibration(types: Sequence[str], experts: Sequence[str] = ()) -> Calibration:
        return calibrate(settings, threads=threads, types=types, experts=experts)

    def correction(main_type: str | None) -> tuple[float, float]:
        figures = cached_calibration(settings)
        if figures is None:
            return (0.0, 0.0)
        return book.correction(figures, main_type=main_type)

    discovery = Discovery(
        settings,
        DeviceCache(lambda: scheduler.reservations("")),
        calibration=calibration,
        cached=lambda: cached_calibration(settings),
        correction=correction,
    )
    scheduler.on_request_done = lambda loaded, result: _observe(book, loaded, result, threads)
    watch = SpeedWatch(
        settings,
        threads,
        lambda: scheduler.working,
        cached=lambda: cached_calibration(settings),
    )
    return discovery, book, watch


def _observe(book: SpeedBook, loaded: LoadedModel, result: Any, threads: int) -> None:
    """One finished request's rates for the book: only plain decoding with all the
    ``threads`` the probe measured with (the CPU governor's fewer threads, a request's own
    thread count and speculative drafts are not what the model predicts)."""
    t = result.timings
    plan = loaded.plan
    alone = (
        loaded.handed <= 1
        and loaded.pending == 0
        and t.draft_tokens == 0
        and t.threads_of in (0, threads)
        and (not t.threads_of or t.threads_min >= t.threads_of)
    )
    try:
        book.observe(
            loaded.model.entry.digest,
            loaded.name,
            [str(p) for p in loaded.model.gguf_paths],
            alone=alone,
            decoded=t.completion_tokens,
            decode_rate=t.decode_tokens_per_s,
            prefilled=t.prompt_tokens - t.cached_tokens,
            prefill_rate=t.prompt_tokens_per_s,
            context=t.prompt_tokens + t.completion_tokens // 2,
            kv_cache_type=loaded.config.kv_cache_type,
            gpu_layers=plan.n_gpu_layers if plan is not None else 0,
        )
    except Exception:  # the book only learns; it never fails a request
        log.exception("could not record the speed of a request")
