"""Fit verdicts and the quantization a pull picks, checked against the memory plan on fixed fake
devices (a 24 GB GPU, an 8 GB one, none, too little RAM), and a Hub repository's report end to
end through a loopback Hub with fixed speed figures."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes.helpers import TinyModels
from fakes.hf_hub import FakeHub
from speed_support import make_calibration

from localllm.daemon.discover import (
    Discovery,
    NothingFits,
    QuantReport,
    fit_verdict,
    host_device,
    main_type,
    pick_quant,
)
from localllm.daemon.memory.layout import ModelLayout, estimate
from localllm.daemon.memory.plan import Device, DoesNotFit, MemoryPlan, PlanRequest, plan
from localllm.daemon.speed.model import Calibration, TypeRate
from localllm.settings import Settings
from localllm.sources.gguf_files import HubFile
from localllm.sources.hub import QuantFiles

pytest_plugins = ["fakes.fixtures"]

GIB = 1 << 30
MIB = 1 << 20
HOST = host_device(48 * GIB, 64 * GIB)
BIG_GPU = Device("CUDA0", "gpu", 23 * GIB, 24 * GIB, "a 24 GB GPU")
SMALL_GPU = Device("CUDA0", "gpu", 7 * GIB, 8 * GIB, "an 8 GB GPU")
DEVICE_SETS = {
    "big GPU": [HOST, BIG_GPU],
    "small GPU": [HOST, SMALL_GPU],
    "no GPU": [HOST],
    "little RAM": [host_device(3 * GIB, 4 * GIB)],
}


def layout(weights: int, layers: int = 32) -> ModelLayout:
    """An 8B-shaped model of ``weights`` bytes: 32 layers, GQA KV of 128 KiB a cell."""
    per_layer = weights * 9 // 10 // layers
    return ModelLayout(
        n_layer=layers,
        layer_weights=(per_layer,) * layers,
        input_weights=weights // 20,
        output_weights=weights // 20,
        kv_per_cell=(4096,) * layers,
        n_vocab=128256,
        n_embd=4096,
        n_ff=14336,
        n_head=32,
        n_ctx_train=131072,
    )


@pytest.fixture
def discovery(home: Path) -> Discovery:
    settings = Settings.from_env({"LOCALLLM_HOME": str(home), "LOCALLLM_NUM_PARALLEL": "1"})
    return Discovery(settings, lambda: [HOST])


def direct_plan(discovery: Discovery, model: ModelLayout, devices: list[Device]) -> MemoryPlan:
    """What the scheduler's planner says for the same model and devices, asked directly."""
    request = PlanRequest(
        n_slots=1,
        n_ctx_per_slot=None,
        n_gpu_layers=None,
        n_layer=model.n_layer,
        n_ctx_train=model.n_ctx_train,
        prefix_cache=discovery.settings.kv_cache_ram,
    )
    return plan(request, devices, estimate(model, devices))


@pytest.mark.parametrize(
    ("devices", "size", "fit", "verdict"),
    [
        ("big GPU", 5 * GIB, "gpu", "all 33 layers on the GPU"),
        ("small GPU", 4_900 * MIB, "gpu", "all 33 layers on the GPU"),
        ("small GPU", 16 * GIB, "partial", " of 33 layers on the GPU"),
        ("no GPU", 16 * GIB, "cpu", "CPU only"),
        ("little RAM", 16 * GIB, "none", "does not fit"),
    ],
)
def test_verdicts_follow_the_memory_plan(
    discovery: Discovery, devices: str, size: int, fit: str, verdict: str
) -> None:
    on = DEVICE_SETS[devices]
    model = layout(size)
    result = discovery.plan_layout(model, on)
    got_fit, words, refused = fit_verdict(result, on, "m")
    assert got_fit == fit and verdict in words
    if fit == "none":
        assert isinstance(result, DoesNotFit) and refused and "are free" in refused
        with pytest.raises(DoesNotFit):
            direct_plan(discovery, model, on)
        return
    expected = direct_plan(discovery, model, on)
    assert isinstance(result, MemoryPlan)
    assert (result.n_gpu_layers, result.n_ctx_per_slot) == (
        expected.n_gpu_layers,
        expected.n_ctx_per_slot,
    )
    if fit == "partial":
        assert words.startswith(f"{expected.n_gpu_layers} of 33")
        assert 0 < expected.n_gpu_layers < 33


def report(
    discovery: Discovery, label: str, size: int, devices: list[Device], bits: float = 5.0
) -> QuantReport:
    """A quantization of the 8B-shaped model, planned on ``devices``."""
    result = discovery.plan_layout(layout(size), devices)
    fit, verdict, refused = fit_verdict(result, devices)
    files = (HubFile(f"m-{label}.gguf", size, None),)
    return QuantReport(
        quant=QuantFiles(label, files),
        shapes="header",
        fit=fit,
        verdict=verdict,
        plan=result if isinstance(result, MemoryPlan) else None,
        refusal=refused,
        bits_per_weight=bits,
    )


LADDER = [
    ("Q2_K", 3.2, 2.6),
    ("Q4_K_M", 4.9, 4.8),
    ("Q6_K", 6.6, 6.6),
    ("Q8_0", 8.5, 8.5),
    ("F16", 16.1, 16),
]


def reports_on(discovery: Discovery, devices: list[Device]) -> list[QuantReport]:
    return [report(discovery, label, int(gb * GIB), devices, bits) for label, gb, bits in LADDER]


def test_the_pick_is_the_largest_that_runs_wholly_on_the_fastest_device(
    discovery: Discovery,
) -> None:
    # A 24 GB GPU holds every quantization but F16 is left out: Q8_0.
    best, why = pick_quant(reports_on(discovery, DEVICE_SETS["big GPU"]), has_gpu=True)
    assert best.quant.label == "Q8_0" and "wholly on the GPU" in why and "F16" in why
    # Without a GPU, the largest the RAM takes.
    best, why = pick_quant(reports_on(discovery, DEVICE_SETS["no GPU"]), has_gpu=False)
    assert best.quant.label == "Q8_0" and "wholly on the CPU" in why
    # An 8 GB GPU holds Q4_K_M whole, not Q6_K.
    best, _ = pick_quant(reports_on(discovery, DEVICE_SETS["small GPU"]), has_gpu=True)
    assert best.quant.label == "Q4_K_M"


def test_without_a_whole_fit_the_most_layers_on_the_gpu_at_4_bits_or_more(
    discovery: Discovery,
) -> None:
    devices = [HOST, Device("CUDA0", "gpu", 2 * GIB, 3 * GIB)]
    reports = reports_on(discovery, devices)
    assert not any(r.fit == "gpu" for r in reports)
    best, why = pick_quant(reports, has_gpu=True)
    assert best.quant.label == "Q4_K_M"  # Q2_K would put more layers there, at 2.6 bits
    assert "puts the most layers there" in why and "4 bits" in why
    assert best.plan is not None and best.plan.n_gpu_layers > 0


def test_when_nothing_fits_the_smallest_says_what_it_needs(discovery: Discovery) -> None:
    reports = reports_on(discovery, [host_device(1 * GIB, 2 * GIB)])
    with pytest.raises(NothingFits, match=r"the smallest, Q2_K: .* needs .* are free"):
        pick_quant(reports, has_gpu=False)


@pytest.mark.parametrize(
    ("label", "expected"),
    [
        ("Q4_K_M", "Q4_K"),
        ("UD-Q4_K_XL", "Q4_K"),
        ("Q5_K_S", "Q5_K"),
        ("Q8_0", "Q8_0"),
        ("IQ3_M", "IQ3_S"),
        ("BF16", "BF16"),
        ("tiny.gguf", None),
    ],
)
def test_main_types_of_quant_labels(label: str, expected: str | None) -> None:
    assert main_type(label) == expected


# -- a repository end to end ---------------------------------------------------------------------


def flat_calibration() -> Calibration:
    """Made-up figures: every type at 10 GB/s decode and 100 GFLOP/s, 1 ms a step."""
    rate = TypeRate(decode=10e9, prefill=100e9)
    figures = make_calibration(**dict.fromkeys(("F32", "F16", "BF16", "Q8_0", "Q4_K"), rate))
    figures.decode_fixed, figures.decode_layer = 1e-3, 0.0
    return figures


@pytest.fixture
def hub(tiny_models: TinyModels) -> Iterator[FakeHub]:
    with FakeHub() as server:
        server.add_repo(
            "tester/tiny-GGUF",
            {"tiny-F32.gguf": tiny_models.f32, "tiny.Q4_K_M.gguf": tiny_models.f16},
        )
        yield server


def test_a_repository_report_plans_each_quantization_and_predicts_its_speed(
    home: Path, hub: FakeHub
) -> None:
    settings = Settings.from_env({"LOCALLLM_HOME": str(home), "HF_ENDPOINT": hub.url})
    asked: list[list[str]] = []

    def calibration(types: list[str]) -> Calibration:
        asked.append(list(types))
        return flat_calibration()

    discovery = Discovery(settings, lambda: [HOST, BIG_GPU], calibration=calibration)
    result = discovery.report("tester/tiny-GGUF", devices=[HOST])
    assert result.header == "Q4_K_M"  # the default quantization's header was read
    by_label = {q.quant.label: q for q in result.quants}
    assert by_label["Q4_K_M"].shapes == "header"
    assert by_label["F32"].shapes == "scaled from Q4_K_M"
    assert {q.verdict for q in result.quants} == {"CPU only"}
    assert asked and {"F16", "F32"} <= set(asked[0])
    for quant in result.quants:
        prediction = quant.prediction
        assert prediction is not None and prediction.decode and prediction.prefill
        # at most one step's fixed millisecond: the bytes read at 10 GB/s are the rest
        assert prediction.decode <= 1000
        assert prediction.decode_full is not None and prediction.decode_full <= prediction.decode
    # the bigger file is read more slowly at the same rate
    assert by_label["F32"].prediction.decode < by_label["Q4_K_M"].prediction.decode  # type: ignore[union-attr]
    on_gpu = discovery.report("tester/tiny-GGUF", "F32")
    (only,) = on_gpu.quants
    assert only.shapes == "header" and only.fit == "gpu"
    assert only.prediction is not None and only.prediction.decode is None
    # the figures hold no GPU's (the probe measures one only where llama.cpp lists it)
    assert "measured no GPU" in only.prediction.why
    data = result.to_dict()
    assert data["quants"][0]["predicted"]["decode"] > 0
    assert data["devices"][0]["name"] == "CPU"


def test_types_whose_probe_was_not_kept_leave_the_others_predicted(
    home: Path, hub: FakeHub
) -> None:
    # What a busy machine gives: the probe of the types not measured yet ran, but its figures
    # did not agree from round to round, so they were not kept. The figures kept before
    # (here F32's alone) still predict what is made of them.
    from localllm.daemon.speed.probe import ProbeUnsettled

    settings = Settings.from_env({"LOCALLLM_HOME": str(home), "HF_ENDPOINT": hub.url})
    kept = make_calibration(F32=TypeRate(decode=10e9, prefill=100e9))
    unsettled = make_calibration(F16=TypeRate(decode=10e9, prefill=100e9))
    unsettled.unsettled, unsettled.rounds = {"F16.decode": 0.13}, 8

    def calibration(types: list[str]) -> Calibration:
        raise ProbeUnsettled(unsettled)

    discovery = Discovery(settings, lambda: [HOST], calibration=calibration, cached=lambda: kept)
    (f32,) = discovery.report("tester/tiny-GGUF", "F32", devices=[HOST]).quants
    assert f32.prediction is not None and f32.prediction.decode and f32.prediction.prefill
    result = discovery.report("tester/tiny-GGUF", "Q4_K_M", devices=[HOST])
    assert result.speed_error is None
    (f16,) = result.quants  # its tensors are F16 (the header says so)
    assert f16.prediction is not None and f16.prediction.decode is None
    assert f16.prediction.why.startswith("no figures for F16: measured, not kept: ")
    assert "did not agree within 10 % in 8 rounds (F16.decode 13%)" in f16.prediction.why
    without = Discovery(settings, lambda: [HOST], calibration=calibration, cached=lambda: None)
    nothing = without.report("tester/tiny-GGUF", "F32", devices=[HOST])
    assert nothing.speed_error is not None and "measured, not kept" in nothing.speed_error
    assert nothing.quants[0].prediction is None
