"""The speed model: how many tokens per second a model will decode and prefill on this machine,
before it is loaded or even downloaded.

Decode is bound by memory: every generated token reads each weight of every layer once, the
output head, and the KV cache of the context so far. Prefill is bound by compute: a batch of
prompt tokens reuses each weight for every token, two floating-point operations (a multiply and
an add) per weight per token. So, per decode step::

    seconds = fixed + layers × per_layer + Σ_type weight_bytes[type] / rate[type]
              + rows × per_row + kv_bytes(context) / rate[kv type]
              + runner + vocabulary × per_token_sampled

(``rows``: the rows of every matrix a step goes through, the output head's one per token of
the vocabulary: a large vocabulary's head of short rows is slower per byte than a layer;
``runner``: the runner's own work per step; the sampler looks at every logit)

and per prefill batch of ``B`` tokens::

    seconds = fixed_batch + layers × per_layer_batch + Σ_type 2 × B × weights[type] / flops[type]
              + attention (4 × heads × head size × B × positions, at the probe's pace)

The rates are not constants: ggml's kernels unpack each weight type at their own pace, so
:mod:`localllm.daemon.speed.probe` measures them on this machine (:class:`Calibration`): bytes per
second a decode step reads, operations per second a batch does, the fixed costs of a step, a
layer and a matrix row, the runner's own work per step and the sampler's per vocabulary
entry. Nothing is fitted to a model. What the probe cannot see (another program's usual load,
the daemon's relay) is learned from the models the runner serves
(:mod:`localllm.daemon.speed.book`): seconds
added to (or taken off) each decode step and each prompt token. Added, not multiplied: what a
100 MB model teaches about a step's own costs says little about the bytes a 5 GB model reads.

Mixture-of-experts layers read only the experts a token is routed to
(``expert_used_count`` of ``expert_count``); a model whose output head is its token embedding
(tied) reads that whole matrix per token.

Layers offloaded to a GPU (llama.cpp offloads the last ``n_gpu_layers`` layers, and the output
head with all of them) are priced at the GPU's own figures (:class:`DeviceRates`: the probe
times synthetic models with every layer on the device, as it does on the CPU): its fixed cost
per step and per layer, the bytes per second its decode steps read and the operations per
second of its batches, by weight type where measured (the nearest measured type otherwise).
A split model pays both devices' fixed costs; what crosses between them (one activation row a
token) is left out. A software device (Mesa's llvmpipe) is measured like any other and named
as such beside the figures.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from localllm.gguf_info import GGUFInfo

__all__ = [
    "PREFILL_TOKENS",
    "Calibration",
    "DeviceRates",
    "ExpertRate",
    "ModelCost",
    "Prediction",
    "TypeRate",
    "corrected",
    "model_cost",
    "predict",
]

PREFILL_TOKENS = 512
"""The prompt length a predicted prefill rate is for (one batch of the runner's default size)."""
_KV_RATE_TYPE = {"f16": "F16", "bf16": "BF16", "f32": "F32", "q8_0": "Q8_0", "q4_0": "Q4_0"}
# A timing less than this share of a step left after the fixed costs is noise, not a rate.
_FLOOR = 0.2
# A GPU reads its weights in a small part of a step that launching its kernels fills (and is
# not shared with busy programs): a smaller share is still a reading there.
_DEVICE_FLOOR = 0.02


@dataclass(frozen=True)
class TypeRate:
    """How fast ggml's CPU kernels go through weights of one type."""

    decode: float
    """Bytes of weights a decode step reads per second."""
    prefill: float
    """Floating-point operations per second of a batch (two per weight per token)."""


@dataclass(frozen=True)
class ExpertRate:
    """How fast llama.cpp's expert kernel (``mul_mat_id``) goes through routed experts of one
    type in a batch: not the dense kernel's pace (with weight repacking it multiplies each
    token by itself, a matrix-vector product, where the dense kernel multiplies tiles of
    tokens), and what an expert costs is set by the tokens routed to it, not by the batch.
    An expert used by ``n`` tokens of a batch costs, per weight, ``setup + 2 n / prefill``
    seconds."""

    prefill: float
    """Floating-point operations per second of an expert's tokens (two per weight each)."""
    setup: float
    """Seconds per weight of an expert each batch that uses it, besides its tokens."""


def _step_costs(tiny: Mapping[str, Any]) -> tuple[float, float, float, float]:
    """A decode step's and a batch's fixed seconds and seconds per layer (its weights
    included), from the probe's two tiny models of different layer counts."""
    layers_a, layers_b = tiny["layers"]
    step_a, step_b = tiny["decode_s"]
    batch_a, batch_b = tiny["batch_s"]
    per_layer = max((step_b - step_a) / (layers_b - layers_a), 0.0)
    per_batch_layer = max((batch_b - batch_a) / (layers_b - layers_a), 0.0)
    fixed = max(step_a - layers_a * per_layer, 0.0)
    batch_fixed = max(batch_a - layers_a * per_batch_layer, 0.0)
    return fixed, per_layer, batch_fixed, per_batch_layer


def _expert_rates(report: Mapping[str, Any]) -> dict[str, ExpertRate]:
    """Each type's :class:`ExpertRate` from the probe's two expert models (``report["experts"]``):
    the same layers with few and with many experts, every token routed to each, timed at two
    batch sizes. What the extra experts add is their kernel's time for that many tokens per
    expert; two batch sizes part what grows with the tokens from what an expert costs once."""
    rates = {}
    for kind, entry in report.items():
        few, many = entry["experts"]
        uses = (many - few) * int(entry["layers"])
        weights = int(entry["expert_params"])
        (short, long), (few_s, many_s) = entry["tokens"], entry["batch_s"]
        # seconds per weight of one expert used by `short` and by `long` tokens (a difference
        # lost in noise is a share of its batch, as for the types' rates)
        per_short = max(many_s[0] - few_s[0], _FLOOR * many_s[0]) / uses / weights
        per_long = max(many_s[1] - few_s[1], _FLOOR * many_s[1]) / uses / weights
        # The pace per token from the two batches' difference; a busy moment in one of them
        # can make that difference anything, so it stays between the longer batch's own
        # pace (nothing paid once: no setup) and twice that (what an expert costs once a
        # batch at most what its `long` tokens cost).
        per_token = (per_long - per_short) / (long - short)
        per_token = min(max(per_token, per_long / long / 2), per_long / long)
        setup = max(per_long - long * per_token, 0.0)
        rates[kind] = ExpertRate(prefill=2 / per_token, setup=setup)
    return rates


@dataclass(frozen=True)
class DeviceRates:
    """How fast one GPU device runs layers offloaded to it, measured by the speed probe."""

    name: str
    """llama.cpp's name for it (``CUDA0``, ``Vulkan0``)."""
    description: str
    """What its driver calls it."""
    software: bool
    """A CPU pretending to be a GPU (Mesa's llvmpipe): its figures are real but slow."""
    decode_fixed: float
    """Seconds of a decode step on the device besides its layers."""
    decode_layer: float
    """Seconds each layer adds to a decode step besides reading its weights."""
    batch_fixed: float
    """Seconds of a batch besides its layers."""
    batch_layer: float
    """Seconds each layer adds to a batch besides its multiply-adds."""
    types: dict[str, TypeRate]
    """Rates per measured weight type."""

    @classmethod
    def from_probe(cls, name: str, report: Mapping[str, Any], batch: int) -> DeviceRates:
        """Rates from the probe's timings on the device (``report["devices"][name]``): the
        tiny models' two layer counts give the fixed costs, each type's model its rates."""
        fixed, per_layer, batch_fixed, per_batch_layer = _step_costs(report["tiny"])
        rates = {}
        for kind, entry in report["types"].items():
            layers = int(entry["layers"])
            step, batch_s = float(entry["decode_s"]), float(entry["batch_s"])
            spent = step - fixed - layers * per_layer
            batch_spent = batch_s - batch_fixed - layers * per_batch_layer
            work = 2 * batch * layers * int(entry["layer_params"])
            rates[kind] = TypeRate(
                decode=layers * int(entry["layer_bytes"]) / max(spent, _DEVICE_FLOOR * step),
                prefill=work / max(batch_spent, _DEVICE_FLOOR * batch_s),
            )
        return cls(
            name=name,
            description=str(report.get("description", "")),
            software=bool(report.get("software", False)),
            decode_fixed=fixed,
            decode_layer=per_layer,
            batch_fixed=batch_fixed,
            batch_layer=per_batch_layer,
            types=rates,
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DeviceRates:
        """The inverse of :func:`dataclasses.asdict` (raises KeyError/TypeError/ValueError)."""
        fields = {k: data[k] for k in cls.__dataclass_fields__ if k != "types"}
        types = {
            str(kind): TypeRate(float(rate["decode"]), float(rate["prefill"]))
            for kind, rate in data["types"].items()
        }
        return cls(**fields, types=types)

    def rate(self, kind: str) -> TypeRate:
        """``kind``'s rates, or the measured type nearest in bits per weight."""
        if kind in self.types:
            return self.types[kind]
        bits = _BITS.get(kind, 8.0)
        nearest = min(self.types, key=lambda name: abs(_BITS.get(name, 8.0) - bits))
        return self.types[nearest]

    def label(self) -> str:
        """``Vulkan0 (llvmpipe ..., a software device)`` for people."""
        said = self.description or self.name
        return (
            f"{self.name} ({said}, a software device)" if self.software else f"{self.name} ({said})"
        )


# Bits per weight of the common types: which measured GPU rate stands in for another type.
_BITS = {
    "F32": 32.0,
    "F16": 16.0,
    "BF16": 16.0,
    "Q8_0": 8.5,
    "Q6_K": 6.6,
    "Q5_K": 5.5,
    "Q5_0": 5.5,
    "Q5_1": 6.0,
    "Q4_K": 4.5,
    "Q4_0": 4.5,
    "Q4_1": 5.0,
    "Q3_K": 3.4,
    "Q2_K": 2.6,
    "IQ4_XS": 4.3,
}


@dataclass
class Calibration:
    """This machine's figures, measured by the speed probe for one thread count."""

    key: str
    """The llama.cpp build, CPU, threads and OpenMP wait policy they hold for."""
    threads: int
    """CPU threads the probe used (the runner's)."""
    repack: bool
    """Whether weight repacking was on (as the runner loads)."""
    bandwidth: float
    """Bytes per second numpy reads from memory, for reference."""
    decode_fixed: float
    """Seconds of a decode step besides its layers."""
    decode_layer: float
    """Seconds each layer adds to a decode step besides reading its weights."""
    batch_fixed: float
    """Seconds of a batch besides its layers."""
    batch_layer: float
    """Seconds each layer adds to a batch besides its multiply-adds."""
    batch: int
    """Tokens in the probe's batch."""
    types: dict[str, TypeRate]
    """Rates per ggml weight type."""
    attention: float = 0.0
    """Floating-point operations per second of a batch's attention over earlier tokens (0:
    not measured; the F16 weights' rate stands in)."""
    row: float = 0.0
    """Seconds each row of a weight matrix adds to a decode step besides its bytes (a dot
    product's setup and its result: what makes a head of many short rows, a large
    vocabulary's, slower per byte than a layer's matrices)."""
    runner_step: float = 0.0
    """Seconds of the runner's own work per decode step outside llama.cpp (the batch, the
    sampler's fixed part, detokenizing, handing the token over)."""
    sample_token: float = 0.0
    """Seconds per vocabulary entry of sampling one token with Ollama's default options
    (penalties, top-k, top-p, temperature: every logit is looked at)."""
    greedy_token: float = 0.0
    """The same for greedy sampling (the largest logit)."""
    seconds: float = 0.0
    """How long the probe took (the last part of it, when types were added later)."""
    others: float = 0.0
    """Cores other programs used on average while the probe ran."""
    measured_at: float = field(default_factory=time.time)
    """When (seconds since the epoch)."""
    devices: dict[str, DeviceRates] = field(default_factory=dict)
    """The GPUs llama.cpp offloads to, each with its own figures (empty: none measured)."""
    decode_attention: float = 0.0
    """Floating-point operations per second of a decode step's attention over the context
    (0: not measured; the KV cache's bytes are priced at its type's decode rate)."""
    cache_bytes: int | None = None
    """The last-level cache the probe read from the OS (None: not readable); its decode
    models read several times that per step."""
    rounds: int = 0
    """Rounds the probe took for its figures to agree (0: a probe before rounds)."""
    unsettled: dict[str, float] = field(default_factory=dict)
    """Figures whose best two rounds still disagreed, and by how much (a share)."""
    refused: list[str] = field(default_factory=list)
    """What the sanity bounds refused (a rate above the memory's or the cores')."""
    experts: dict[str, ExpertRate] = field(default_factory=dict)
    """Rates of routed experts per weight type, measured when a mixture-of-experts model is
    first priced (empty: none yet; the dense batch's rate stands in)."""

    @property
    def kept(self) -> bool:
        """Whether these figures may price models: every figure agreed and none was out of
        bounds."""
        return not self.unsettled and not self.refused

    def why_not_kept(self) -> str:
        """Why the figures were not kept, for people ("" when they were)."""
        parts = list(self.refused)
        if self.unsettled:
            worst = sorted(self.unsettled.items(), key=lambda item: -item[1])[:3]
            named = ", ".join(f"{name} {share:.0%}" for name, share in worst)
            parts.append(
                f"{len(self.unsettled)} figures did not agree within 10 % in "
                f"{self.rounds} rounds ({named})"
            )
        return "; ".join(parts)

    @classmethod
    def from_probe(cls, report: Mapping[str, Any], key: str, seconds: float) -> Calibration:
        """Rates from the probe child's timings (see :mod:`localllm.daemon.speed.probe`): each
        type's
        time beyond the fixed costs, divided into the bytes it read or the work it did."""
        bandwidth = float(report["bandwidth"])
        tiny = report["tiny"]
        batch = int(report["batch"])
        raw = report["types"]
        # A tiny model's step is its fixed cost and, per layer, the overhead and its weights.
        fixed, raw_layer, batch_fixed, raw_batch_layer = _step_costs(tiny)
        per_layer, per_batch_layer = raw_layer, raw_batch_layer
        head = report.get("head")
        head_s = max(float(head["logits_s"]) - float(head["plain_s"]), 0.0) if head else 0.0
        row = 0.0
        rates: dict[str, TypeRate] = {}
        # The tiny layers' own weights (Q8_0) are part of their per-layer time, and every
        # matrix's rows cost a little besides its bytes (the head model tells how much, once
        # the Q8_0 rate is known): take them out and work everything out again (a fixed
        # point; the two models' bytes per row are only a few times apart, so it converges
        # slowly: 40 rounds of arithmetic).
        for _ in range(40 if "Q8_0" in raw else 1):
            for name, entry in raw.items():
                layers = int(entry["layers"])
                # (the batch may run on a smaller model than the decode step: the batch is
                # bound by arithmetic, the step by memory, which its model must exceed)
                batch_layers = int(entry.get("batch_layers", layers))
                step = float(entry["decode_s"])
                rows = layers * int(entry.get("layer_rows", 0))
                spent = (
                    step
                    - fixed
                    - layers * per_layer
                    - rows * row
                    - entry.get("output_bytes", 0) / bandwidth
                )
                weights = layers * int(entry["layer_bytes"])
                # (its batch asks for every token's logits: its head's work is in the batch)
                work = (
                    2
                    * batch
                    * (
                        batch_layers * int(entry["layer_params"])
                        + int(entry.get("output_params", 0))
                    )
                )
                batch_spent = float(entry["batch_s"]) - batch_fixed - batch_layers * per_batch_layer
                rates[name] = TypeRate(
                    decode=weights / max(spent, _FLOOR * step),
                    prefill=work / max(batch_spent, _FLOOR * float(entry["batch_s"])),
                )
            if "Q8_0" in rates:
                q8 = rates["Q8_0"]
                if head:
                    # The head model's one layer is in both of its steps: the difference is
                    # the head's bytes and rows (and its logits: one float a row).
                    row = max(head_s - int(head["bytes"]) / q8.decode, 0.0) / int(head["vocab"])
                per_layer = max(
                    raw_layer - tiny["layer_bytes"] / q8.decode - tiny.get("layer_rows", 0) * row,
                    0.0,
                )
                per_batch_layer = max(
                    raw_batch_layer - 2 * batch * tiny["layer_params"] / q8.prefill, 0.0
                )
        attention = 0.0
        if (late := report.get("attention")) is not None:
            extra = float(late["late_batch_s"]) - float(late["batch_s"])
            work = 4 * late["width"] * batch * late["positions"] * late["layers"]
            attention = work / extra if extra > 0 else 0.0
        decode_attention = 0.0
        if late is not None and "late_decode_s" in late:
            # one token against the positions before it: a product for the scores and one
            # for the values, each of the query width, per position and layer
            extra = float(late["late_decode_s"]) - float(late["decode_s"])
            work = 4 * late["width"] * (late["decode_positions"] - 1) * late["layers"]
            decode_attention = work / extra if extra > 0 else 0.0
        vocab = int(head["vocab"]) if head else 0
        return cls(
            key=key,
            attention=attention,
            threads=int(report["threads"]),
            repack=bool(report["repack"]),
            bandwidth=bandwidth,
            decode_fixed=fixed,
            decode_layer=per_layer,
            batch_fixed=batch_fixed,
            batch_layer=per_batch_layer,
            batch=batch,
            types=rates,
            seconds=seconds,
            others=float(report.get("others", 0.0)),
            row=row,
            runner_step=float(report.get("runner_step_s", 0.0)),
            sample_token=float(head["default_s"]) / vocab if head else 0.0,
            greedy_token=float(head["greedy_s"]) / vocab if head else 0.0,
            devices={
                name: DeviceRates.from_probe(name, part, batch)
                for name, part in report.get("devices", {}).items()
            },
            decode_attention=decode_attention,
            cache_bytes=report.get("cache_bytes"),
            rounds=int(report.get("rounds", 0)),
            unsettled=dict(report.get("unsettled", {})),
            refused=list(report.get("refused", [])),
            experts=_expert_rates(report.get("experts", {})),
        )

    def merged(self, newer: Calibration, only_types: bool = False) -> Calibration:
        """These figures with ``newer``'s added (a probe of more types); the newer fixed costs
        win, having been measured closer to now. With ``only_types``, only ``newer``'s type
        rates are taken (and what did not agree or was refused among them): these figures'
        fixed costs stay."""
        if only_types:
            own = tuple(f"{name}." for name in newer.types)  # its figures: "Q4_K.decode"
            own += tuple(f"experts.{name}." for name in newer.experts)
            named = tuple(f"{name} " for name in newer.types)  # its refusals: "Q4_K decode..."
            return Calibration(
                **{
                    **asdict(self),
                    "types": {**self.types, **newer.types},
                    "experts": {**self.experts, **newer.experts},
                    "devices": self.devices,
                    "unsettled": {k: v for k, v in newer.unsettled.items() if k.startswith(own)},
                    "refused": [r for r in newer.refused if r.startswith(named)],
                    "rounds": newer.rounds,  # what the unsettled figures were measured in
                },
            )
        return Calibration(
            **{
                **asdict(newer),
                "types": {**self.types, **newer.types},
                "experts": {**self.experts, **newer.experts},
                "devices": newer.devices or self.devices,
            },
        )

    def with_experts(self, report: Mapping[str, Any], seconds: float = 0.0) -> Calibration:
        """These figures with the routed experts of an experts-only probe added
        (:func:`~localllm.daemon.speed.measure.expert_figures`, ``seconds`` long): every other
        figure stays, and what did not agree is theirs."""
        return Calibration(
            **{
                **asdict(self),
                "types": self.types,
                "devices": self.devices,
                "experts": {**self.experts, **_expert_rates(report["experts"])},
                "unsettled": dict(report.get("unsettled", {})),
                "refused": [],
                "rounds": int(report.get("rounds", 0)),
                "seconds": seconds,
            },
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the cache file, ``localllm doctor --json``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Calibration:
        """The inverse of :meth:`to_dict` (raises KeyError/TypeError/ValueError on bad data)."""
        fields = {
            k: data[k]
            for k in cls.__dataclass_fields__
            if k in data and k not in ("types", "devices", "experts")
        }
        types = {
            str(name): TypeRate(float(rate["decode"]), float(rate["prefill"]))
            for name, rate in data["types"].items()
        }
        devices = {
            str(name): DeviceRates.from_dict(part)
            for name, part in (data.get("devices") or {}).items()
        }
        # (figures cached before experts were measured have none: they load all the same)
        experts = {
            str(name): ExpertRate(float(rate["prefill"]), float(rate["setup"]))
            for name, rate in (data.get("experts") or {}).items()
        }
        return cls(**fields, types=types, devices=devices, experts=experts)

    def describe(self) -> str:
        """One line: memory bandwidth, a few types' rates, the fixed costs."""
        parts = [f"memory {self.bandwidth / 1e9:.1f} GB/s"]
        for name in ("F16", "Q8_0", "Q4_K"):
            if (rate := self.types.get(name)) is not None:
                parts.append(
                    f"{name} decode {rate.decode / 1e9:.1f} GB/s, "
                    f"prefill {rate.prefill / 1e9:.0f} GFLOP/s"
                )
        parts.append(
            f"per step {self.decode_fixed * 1e3:.2f} ms + {self.decode_layer * 1e6:.0f} us a layer"
        )
        for name, expert in self.experts.items():
            parts.append(
                f"{name} experts {expert.prefill / 1e9:.0f} GFLOP/s + "
                f"{expert.setup * 1e12:.1f} ps a weight a batch"
            )
        for device in self.devices.values():
            rates = ", ".join(
                f"{kind} decode {rate.decode / 1e9:.1f} GB/s, prefill {rate.prefill / 1e9:.0f} "
                "GFLOP/s"
                for kind, rate in device.types.items()
            )
            parts.append(
                f"{device.label()}: {rates}; per step {device.decode_fixed * 1e3:.2f} ms + "
                f"{device.decode_layer * 1e6:.0f} us a layer"
            )
        return f"{self.threads} threads: " + "; ".join(parts)


@dataclass(frozen=True)
class ModelCost:
    """What one token costs a model, by weight type: the bytes a decode step reads and the
    weights a batch multiplies, from its GGUF header."""

    n_layer: int
    """Repeating layers."""
    layer_bytes: tuple[dict[str, int], ...]
    """Per layer: bytes read per decode step, by type (routed experts only)."""
    layer_params: tuple[dict[str, int], ...]
    """Per layer: weights multiplied per token, by type (routed experts only)."""
    output_bytes: dict[str, int]
    """The output head's bytes read per decoded token, by type."""
    output_params: dict[str, int]
    """The output head's weights (multiplied for the last token of a batch only)."""
    kv_per_cell: tuple[int, ...]
    """KV bytes per cell of each layer."""
    attention_width: int
    """Query heads × head size (the attention's work per position, per layer)."""
    layer_rows: tuple[int, ...] = ()
    """Per layer: rows of the weight matrices a decode step goes through (routed experts
    only)."""
    vocab: int = 0
    """Rows of the output head: the logits a decode step makes and the sampler looks at."""
    last_skipped: dict[str, int] = field(default_factory=dict)
    """The last layer's weights after its attention (its output projection and FFN, routed
    experts only), by type: llama.cpp multiplies them in a batch only for the tokens whose
    logits are asked for (a prompt's last), not for every token."""
    expert_params: tuple[dict[str, int], ...] = ()
    """Per layer: the weights of all its routed experts, by type (empty: no experts)."""
    experts: tuple[int, int] = (0, 0)
    """Routed experts per layer and how many each token uses (``(0, 0)``: none)."""

    @property
    def types(self) -> set[str]:
        """Every weight type a token reads."""
        found = set(self.output_bytes)
        for layer in self.layer_bytes:
            found |= set(layer)
        return found

    @property
    def expert_types(self) -> set[str]:
        """The weight types of its routed experts (what :attr:`Calibration.experts` must hold
        to price its batches)."""
        return {kind for layer in self.expert_params for kind in layer}

    @property
    def main_type(self) -> str | None:
        """The weight type that holds most of the weights a batch multiplies (what decides a
        prefill's pace), None for a model without layers."""
        totals: dict[str, int] = {}
        for layer in self.layer_params:
            for kind, count in layer.items():
                totals[kind] = totals.get(kind, 0) + count
        return max(totals, key=lambda kind: totals[kind]) if totals else None

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights one decode step reads."""
        return sum(sum(layer.values()) for layer in self.layer_bytes) + sum(
            self.output_bytes.values()
        )

    def scaled(self, factor: float) -> ModelCost:
        """The same shapes at ``factor`` times the bytes (another quantization of the model,
        when only its file size is known)."""
        return ModelCost(
            n_layer=self.n_layer,
            layer_bytes=tuple(
                {t: round(b * factor) for t, b in layer.items()} for layer in self.layer_bytes
            ),
            layer_params=self.layer_params,
            output_bytes={t: round(b * factor) for t, b in self.output_bytes.items()},
            output_params=self.output_params,
            kv_per_cell=self.kv_per_cell,
            attention_width=self.attention_width,
            layer_rows=self.layer_rows,
            vocab=self.vocab,
            last_skipped=self.last_skipped,
            expert_params=self.expert_params,
            experts=self.experts,
        )

    def retyped(self, mapping: Mapping[str, str]) -> ModelCost:
        """The same model with weight types renamed (``{"Q4_K": "Q6_K"}``): another
        quantization whose header was not read, priced at the rates of its main type."""

        def rename(values: Mapping[str, int]) -> dict[str, int]:
            out: dict[str, int] = {}
            for name, value in values.items():
                target = mapping.get(name, name)
                out[target] = out.get(target, 0) + value
            return out

        return ModelCost(
            n_layer=self.n_layer,
            layer_bytes=tuple(rename(layer) for layer in self.layer_bytes),
            layer_params=tuple(rename(layer) for layer in self.layer_params),
            output_bytes=rename(self.output_bytes),
            output_params=rename(self.output_params),
            kv_per_cell=self.kv_per_cell,
            attention_width=self.attention_width,
            layer_rows=self.layer_rows,
            vocab=self.vocab,
            last_skipped=rename(self.last_skipped),
            expert_params=tuple(rename(layer) for layer in self.expert_params),
            experts=self.experts,
        )


def _add(values: dict[str, int], name: str, amount: int) -> None:
    values[name] = values.get(name, 0) + amount


def model_cost(parts: Sequence[GGUFInfo], kv_per_cell: Sequence[int]) -> ModelCost:
    """The :class:`ModelCost` of a model from its GGUF headers (one unless split) and its KV
    bytes per cell per layer (:attr:`~localllm.daemon.memory.layout.ModelLayout.kv_per_cell`)."""
    info = parts[0]
    meta = info.metadata
    arch = info.architecture
    n_layer = info.block_count or 0
    experts = meta.get(f"{arch}.expert_count")
    used = meta.get(f"{arch}.expert_used_count")
    routed = used / experts if isinstance(experts, int) and isinstance(used, int) and experts else 1
    layer_bytes: list[dict[str, int]] = [{} for _ in range(n_layer)]
    layer_params: list[dict[str, int]] = [{} for _ in range(n_layer)]
    layer_rows = [0] * n_layer
    expert_params: list[dict[str, int]] = [{} for _ in range(n_layer)]
    vocab = 0
    output_bytes: dict[str, int] = {}
    output_params: dict[str, int] = {}
    last_skipped: dict[str, int] = {}
    embedding: tuple[str, int, int] | None = None
    embedding_rows = 0
    has_output = False
    for part in parts:
        for tensor in part.tensors:
            name = tensor.name
            if name.startswith("blk."):
                index = name.split(".", 2)[1]
                if not index.isdigit() or int(index) >= n_layer:
                    continue
                share = routed if "_exps." in name else 1.0
                if "_exps." in name and len(tensor.shape) >= 2:
                    _add(expert_params[int(index)], tensor.type, tensor.n_elements)
                _add(layer_bytes[int(index)], tensor.type, round(tensor.n_bytes * share))
                if len(tensor.shape) >= 2:
                    _add(layer_params[int(index)], tensor.type, round(tensor.n_elements * share))
                    if int(index) == n_layer - 1 and not name.split(".")[2].startswith(
                        ("attn_q", "attn_k", "attn_v")
                    ):
                        _add(last_skipped, tensor.type, round(tensor.n_elements * share))
                    rows = tensor.n_elements // max(tensor.shape[0], 1)
                    layer_rows[int(index)] += round(rows * share)
            elif name.startswith(("output.", "output_norm.")):
                has_output = has_output or name == "output.weight"
                _add(output_bytes, tensor.type, tensor.n_bytes)
                if len(tensor.shape) >= 2:
                    _add(output_params, tensor.type, tensor.n_elements)
                    vocab = tensor.n_elements // max(tensor.shape[0], 1)
            elif name == "token_embd.weight":
                embedding = (tensor.type, tensor.n_bytes, tensor.n_elements)
                embedding_rows = tensor.n_elements // max(tensor.shape[0], 1)
    if not has_output and embedding is not None:
        # Tied: the token embedding is the output head, read whole for every token.
        _add(output_bytes, embedding[0], embedding[1])
        _add(output_params, embedding[0], embedding[2])
        vocab = embedding_rows
    heads = info.head_count or 0
    key_length = meta.get(f"{arch}.attention.key_length")
    head_size = (
        key_length if isinstance(key_length, int) else (info.embedding_length or 0) // max(heads, 1)
    )
    return ModelCost(
        n_layer=n_layer,
        layer_bytes=tuple(layer_bytes),
        layer_params=tuple(layer_params),
        output_bytes=output_bytes,
        output_params=output_params,
        kv_per_cell=tuple(kv_per_cell),
        attention_width=heads * head_size,
        layer_rows=tuple(layer_rows),
        vocab=vocab,
        last_skipped=last_skipped,
        expert_params=tuple(expert_params) if any(expert_params) else (),
        experts=(experts, used) if any(expert_params) else (0, 0),
    )


@dataclass(frozen=True)
class Prediction:
    """Predicted speed of one model on this machine."""

    decode: float | None
    """Tokens per second of one stream at the start of a conversation (None: not predicted)."""
    decode_full: float | None
    """Tokens per second of one stream with ``context`` tokens already in its KV cache."""
    prefill: float | None
    """Prompt tokens per second of a :data:`PREFILL_TOKENS`-token prompt."""
    context: int
    """The context ``decode_full`` is for."""
    why: str = ""
    """Why nothing is predicted, when it is not."""
    correction: tuple[float, float] = (0.0, 0.0)
    """Seconds learned from served models that were added to a decode step and to a prompt
    token ((0, 0): none)."""
    device: str = ""
    """The GPU whose figures priced the offloaded layers (``""``: the CPU alone), with
    ``a software device`` in it for one such as llvmpipe."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, rates rounded to 0.1 token/s."""
        data = asdict(self)
        for key in ("decode", "decode_full", "prefill"):
            if data[key] is not None:
                data[key] = round(data[key], 1)
        return data


def _seconds(amounts: Mapping[str, float], calibration: Calibration, prefill: bool) -> float | None:
    total = 0.0
    for name, amount in amounts.items():
        if not amount:
            continue
        rate = calibration.types.get(name)
        if rate is None:
            return None
        total += amount / (rate.prefill if prefill else rate.decode)
    return total


def _summed(parts: Sequence[Mapping[str, int]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for part in parts:
        for name, amount in part.items():
            total[name] = total.get(name, 0) + amount
    return total


def _on_device(amounts: Mapping[str, float], device: DeviceRates | None, prefill: bool) -> float:
    if device is None:
        return 0.0
    rates = {name: device.rate(name) for name in amounts}
    return sum(
        amount / (rates[name].prefill if prefill else rates[name].decode)
        for name, amount in amounts.items()
        if amount
    )


def _expert_seconds(
    cost: ModelCost,
    calibration: Calibration,
    work: dict[str, float],
    layers: int,
    prompt: int,
    n_batch: int,
) -> float:
    """Seconds the routed experts of the first ``layers`` layers take in a prompt's batches,
    at the probe's expert rates: in a batch of ``c`` tokens each expert multiplies about
    ``c × used / count`` of them (the tokens routed to it), not ``c``. Their dense pricing is
    taken out of ``work``; types the probe has no expert figures for keep it."""
    count, used = cost.experts
    if not count or not calibration.experts:
        return 0.0
    share = used / count
    batch = max(n_batch, 1)
    chunks = [batch] * (prompt // batch) + ([prompt % batch] if prompt % batch else [])
    total = 0.0
    for index, layer in enumerate(cost.expert_params[:layers]):
        # The last layer's FFN runs for the prompt's last token only (its logits).
        sizes = [1] if index == cost.n_layer - 1 else chunks
        tokens = sum(sizes)
        # Batches that use an expert (none of a batch's tokens routed to it: not used).
        batches = sum(1 - (1 - share) ** size for size in sizes)
        for kind, weights in layer.items():
            rate = calibration.experts.get(kind)
            if rate is None:
                continue
            routed = weights * share
            work[kind] = max(work.get(kind, 0) - 2 * tokens * routed, 0)
            total += weights * batches * rate.setup + 2 * tokens * routed / rate.prefill
    return total


def predict(
    cost: ModelCost,
    calibration: Calibration,
    *,
    context: int,
    gpu_layers: int = 0,
    kv_cache_type: str = "f16",
    n_batch: int = PREFILL_TOKENS,
    prompt: int = PREFILL_TOKENS,
    greedy: bool = False,
    correction: tuple[float, float] = (0.0, 0.0),
) -> Prediction:
    """Predicted decode and prefill rates of one stream (see the module docstring).

    ``gpu_layers`` is the plan's ``n_gpu_layers`` (the last layers go to the first GPU the
    probe measured; more than the model's layers puts the output head there too);
    ``context`` is the KV the full-context decode figure reads; ``prompt`` the prompt tokens
    the prefill figure is for; ``greedy`` prices the greedy sampler instead of Ollama's
    default options; ``correction`` adds seconds to each decode step and each prompt token
    (what served models taught, :class:`~localllm.daemon.speed.book.SpeedBook`), never taking off
    more than
    three quarters of either.
    """
    offloaded = min(max(gpu_layers, 0), cost.n_layer)
    device: DeviceRates | None = None
    if gpu_layers > 0:
        if not calibration.devices:
            why = "layers on a GPU: the speed probe measured no GPU (`localllm doctor` measures)"
            return Prediction(None, None, None, context, why)
        device = next(iter(calibration.devices.values()))
    head_on_device = device is not None and gpu_layers > cost.n_layer
    split = cost.n_layer - offloaded  # llama.cpp offloads the last layers
    cpu_head = {} if head_on_device else cost.output_bytes
    cpu_weights = _summed([*cost.layer_bytes[:split], cpu_head])
    missing = sorted(
        t for t, amount in cpu_weights.items() if amount and t not in calibration.types
    )
    if missing:
        return Prediction(None, None, None, context, f"no figures for {', '.join(missing)}")
    device_weights = _summed(
        [*cost.layer_bytes[split:], cost.output_bytes if head_on_device else {}]
    )
    kv_type = _KV_RATE_TYPE.get(kv_cache_type, "F16")
    # The KV cache is read through the attention's kernels at its element type's rate (the
    # memory's own pace where the probe has none for it).
    kv_rate = calibration.types.get(kv_type) or calibration.types.get("F16")
    read = (_seconds(cpu_weights, calibration, prefill=False) or 0.0) + _on_device(
        device_weights, device, prefill=False
    )
    rows = sum(cost.layer_rows[:split]) + (0 if head_on_device else cost.vocab)
    sampler = cost.vocab * (calibration.greedy_token if greedy else calibration.sample_token)
    device_step = device.decode_fixed + offloaded * device.decode_layer if device else 0.0
    step = (
        calibration.decode_fixed
        + split * calibration.decode_layer
        + device_step
        + read
        + rows * calibration.row
        + calibration.runner_step
        + sampler
    )
    cpu_kv = sum(cost.kv_per_cell[:split]) * context
    device_kv = sum(cost.kv_per_cell[split:]) * context
    if calibration.decode_attention:
        # The attention over the context at the pace the probe measured late in a context
        # (the kernel's work per position and query head, far slower than reading the KV
        # cache's bytes: 2 ms a step on the starter at 500 positions against 0.4 ms)
        cpu_attention = 4 * cost.attention_width * context * split
        cpu_context = cpu_attention / calibration.decode_attention
    else:
        cpu_context = cpu_kv / (kv_rate.decode if kv_rate is not None else calibration.bandwidth)
    step_full = step + cpu_context + _on_device({kv_type: device_kv}, device, prefill=False)

    prompt = max(prompt, 1)
    head_work = {name: 2 * amount for name, amount in cost.output_params.items()}
    cpu_work = _summed(cost.layer_params[:split])
    device_work = _summed(cost.layer_params[split:])
    for work in (cpu_work, device_work):
        for name in work:
            work[name] *= 2 * prompt
    # The last layer after its attention runs for the prompt's last token only (its logits).
    last = device_work if offloaded else cpu_work
    for name, amount in cost.last_skipped.items():
        last[name] = max(last.get(name, 0) - 2 * (prompt - 1) * amount, 0)
    for name, amount in head_work.items():  # the last token's logits only
        target = device_work if head_on_device else cpu_work
        target[name] = target.get(name, 0) + amount
    experts = _expert_seconds(cost, calibration, cpu_work, split, prompt, n_batch)
    compute = (
        experts
        + (_seconds(cpu_work, calibration, prefill=True) or 0.0)
        + _on_device(device_work, device, prefill=True)
    )
    chunks = math.ceil(prompt / max(n_batch, 1))
    stand_in = calibration.types.get("F16") or next(iter(calibration.types.values()))
    attention_rate = calibration.attention or stand_in.prefill

    # Each token attends to the positions before it: prompt²/2 pairs in all, two products
    # (scores and values) of attention_width each, per layer.
    attention = 2 * 2 * cost.attention_width * prompt**2 / 2
    device_batch = device.batch_fixed + offloaded * device.batch_layer if device else 0.0
    batch_seconds = (
        chunks * (calibration.batch_fixed + split * calibration.batch_layer + device_batch)
        + compute
        + split * attention / attention_rate
        + _on_device({"F16": offloaded * attention}, device, prefill=True)
        + calibration.runner_step
        + sampler  # the first token is sampled before the prompt's rate is known
    )
    step_extra, token_extra = correction
    per_token = batch_seconds / prompt
    return Prediction(
        decode=1 / corrected(step, step_extra),
        decode_full=1 / corrected(step_full, step_extra),
        prefill=1 / corrected(per_token, token_extra),
        context=context,
        correction=correction,
        device=device.label() if device is not None else "",
    )


def corrected(seconds: float, extra: float) -> float:
    """``seconds`` with a learned ``extra`` added, at least a quarter of what it was."""
    return max(seconds + extra, seconds / 4)
