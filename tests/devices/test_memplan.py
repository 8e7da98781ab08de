"""The memory plan's decisions with injected devices: fast, no llama.cpp.

A synthetic model (ten 500 MiB layers, 40 KiB of KV per cell) is priced by the GGUF estimate
(:func:`~localllm.daemon.memory.plan.estimate`, flash attention on so compute is fixed) against
devices made up for each case: the CPU alone, one GPU that holds it, one that holds half, two
models competing for one machine, nothing that fits. Every decision is checked against the
same measure: what the plan chose fits, and the next step up does not.
"""

from __future__ import annotations

import pytest

from localllm.daemon.memory.layout import ModelLayout, estimate, place_layers
from localllm.daemon.memory.plan import (
    AUTO_HEADROOM,
    MIB,
    Device,
    DeviceUse,
    DoesNotFit,
    MemoryPlan,
    NoFitReport,
    PlanRequest,
    Trial,
    budgets,
    context_candidates,
    margin,
    plan,
    refusal,
)

GIB = 1 << 30
LAYERS = 10
LAYOUT = ModelLayout(
    n_layer=LAYERS,
    layer_weights=(500 * MIB,) * LAYERS,
    input_weights=100 * MIB,
    output_weights=100 * MIB,
    kv_per_cell=(4096,) * LAYERS,
    n_vocab=32000,
    n_embd=1024,
    n_ff=4096,
    n_head=16,
    n_ctx_train=32768,
)
KV_PER_CELL = 4096 * LAYERS


def host(free: int, total: int | None = None) -> Device:
    return Device("CPU", "cpu", free, total or free)


def gpu(name: str, free: int) -> Device:
    return Device(name, "gpu", free, free, "test GPU")


def request(**changes: object) -> PlanRequest:
    fields: dict[str, object] = {
        "n_slots": 4,
        "n_ctx_per_slot": None,
        "n_gpu_layers": None,
        "n_layer": LAYERS,
        "n_ctx_train": LAYOUT.n_ctx_train,
    }
    fields.update(changes)
    return PlanRequest(**fields)  # type: ignore[arg-type]


def measure_for(devices: list[Device]):  # type: ignore[no-untyped-def]
    return estimate(LAYOUT, devices, n_batch=512, flash_attention="on")


def fits(uses: list[DeviceUse], devices: list[Device], share: float = 1.0) -> bool:
    budget = budgets(devices)
    return all(u.total <= budget[u.device] * share for u in uses)


def use_of(result: MemoryPlan, device: str) -> DeviceUse:
    return next(u for u in result.uses if u.device == device)


def test_context_candidates_are_the_steps_up_to_the_trained_length() -> None:
    assert context_candidates(2048) == [2048]
    assert context_candidates(8192) == [4096, 8192]
    assert context_candidates(20000) == [4096, 8192, 16384, 20000]
    assert context_candidates(131072) == [4096, 8192, 16384, 32768, 131072]


def test_cpu_only_with_plenty_of_ram_takes_the_trained_context() -> None:
    devices = [host(64 * GIB)]
    result = plan(request(), devices, measure_for(devices))
    assert result.n_ctx_per_slot == 32768 and result.context_chosen
    assert result.n_gpu_layers == 0
    assert result.processor() == "100% CPU" and result.size_vram == 0
    cpu = use_of(result, "CPU")
    assert cpu.weights == LAYOUT.weights
    assert cpu.kv == KV_PER_CELL * 4 * 32768
    assert cpu.layers == LAYERS + 1


def test_cpu_only_the_context_is_the_largest_that_fits_with_headroom() -> None:
    devices = [host(10 * GIB)]
    measure = measure_for(devices)
    result = plan(request(), devices, measure)
    chosen = result.n_ctx_per_slot
    assert chosen in (8192, 16384)  # 32768 x 4 cells need 5 GiB of KV on top of 5.2 of weights
    assert fits(result.uses, devices, AUTO_HEADROOM)
    larger = [c for c in context_candidates(32768) if c > chosen]
    assert larger and not fits(measure(Trial(larger[0], 4, 0)), devices, AUTO_HEADROOM)


def test_a_given_context_is_kept_even_above_the_trained_length_with_a_warning() -> None:
    devices = [host(64 * GIB)]
    result = plan(request(n_ctx_per_slot=65536), devices, measure_for(devices))
    assert result.n_ctx_per_slot == 65536 and not result.context_chosen
    assert any("above the 32,768 tokens" in w for w in result.warnings)
    plain = plan(request(n_ctx_per_slot=2048), devices, measure_for(devices))
    assert plain.n_ctx_per_slot == 2048 and plain.warnings == []


def test_one_gpu_that_holds_everything_gets_every_layer() -> None:
    devices = [host(32 * GIB), gpu("CUDA0", 24 * GIB)]
    result = plan(request(), devices, measure_for(devices))
    assert result.n_gpu_layers == LAYERS + 1
    card = use_of(result, "CUDA0")
    assert card.layers == LAYERS + 1 and card.weights == 10 * 500 * MIB + 100 * MIB
    assert card.total <= budgets(devices)["CUDA0"] * AUTO_HEADROOM
    # The host keeps the token embeddings and a little compute.
    cpu = use_of(result, "CPU")
    assert cpu.weights == LAYOUT.input_weights and cpu.kv == 0
    assert result.size_vram == card.total and result.processor().endswith("CPU/GPU")


def test_one_gpu_that_holds_half_gets_the_most_layers_it_can() -> None:
    devices = [host(32 * GIB), gpu("CUDA0", 3 * GIB)]
    measure = measure_for(devices)
    result = plan(request(), devices, measure)
    layers = result.n_gpu_layers
    assert 0 < layers < LAYERS + 1
    budget = budgets(devices)
    assert use_of(result, "CUDA0").total <= budget["CUDA0"]
    # One layer more would not fit on the card at this context.
    more = next(u for u in measure(Trial(4096, 4, layers + 1)) if u.device == "CUDA0")
    assert more.total > budget["CUDA0"]
    # The longer context chosen keeps the layers that the shortest one had.
    assert result.n_ctx_per_slot >= 4096
    short = plan(request(n_ctx_per_slot=4096), devices, measure)
    assert short.n_gpu_layers == layers
    # The rest runs on the CPU.
    assert use_of(result, "CPU").layers == LAYERS + 1 - layers
    cpu_share = int(result.processor().split("%")[0])
    assert 0 < cpu_share < 100


def test_a_given_num_gpu_is_kept_and_a_too_large_one_is_refused_with_what_fits() -> None:
    devices = [host(32 * GIB), gpu("CUDA0", 3 * GIB)]
    measure = measure_for(devices)
    fixed = plan(request(n_gpu_layers=2, n_ctx_per_slot=4096), devices, measure)
    assert fixed.n_gpu_layers == 2
    with pytest.raises(DoesNotFit) as refused:
        plan(request(n_gpu_layers=LAYERS + 1, n_ctx_per_slot=4096), devices, measure)
    report = refused.value.report
    best = plan(request(n_ctx_per_slot=4096), devices, measure).n_gpu_layers
    assert report.num_gpu == best
    assert f"try num_gpu {best}" in refusal("big", report)
    assert "on CUDA0" in refusal("big", report)


def test_two_gpus_share_the_layers_in_proportion_to_their_free_memory() -> None:
    cards = [gpu("CUDA0", 8 * GIB), gpu("CUDA1", 24 * GIB)]
    placed = place_layers(LAYERS, LAYERS + 1, cards, "CPU")
    assert placed.count("CUDA0") == 3 and placed.count("CUDA1") == 8
    assert placed[-1] == "CUDA1"  # the output layer goes last, to the last device
    # Offloading one layer offloads the output layer, as llama.cpp counts them.
    assert place_layers(LAYERS, 1, cards, "CPU") == ["CPU"] * LAYERS + ["CUDA0"]
    devices = [host(32 * GIB), *cards]
    result = plan(request(), devices, measure_for(devices))
    assert result.n_gpu_layers == LAYERS + 1
    assert {u.device: u.layers for u in result.uses} == {"CPU": 0, "CUDA0": 3, "CUDA1": 8}


def test_two_models_compete_for_the_ram_the_first_one_leaves() -> None:
    devices = [host(20 * GIB)]
    alone = plan(request(), devices, measure_for(devices))
    first = plan(request(n_ctx_per_slot=4096), devices, measure_for(devices))
    # What the first may still grow into is not free for the second.
    reserved = {"CPU": first.host_bytes}
    second = plan(request(), devices, measure_for(devices), reserved)
    assert second.n_ctx_per_slot < alone.n_ctx_per_slot
    assert use_of(second, "CPU").total <= budgets(devices, reserved)["CPU"]
    with pytest.raises(DoesNotFit):
        plan(request(), devices, measure_for(devices), {"CPU": first.host_bytes + second.size})


def test_nothing_fits_names_the_need_the_room_and_what_would_fit() -> None:
    devices = [host(7 * GIB)]
    measure = measure_for(devices)
    with pytest.raises(DoesNotFit) as refused:
        plan(request(n_ctx_per_slot=32768), devices, measure)
    report = refused.value.report
    assert report.trial == Trial(32768, 4, 0)
    assert report.short() == {"CPU": report.uses[0].total - budgets(devices)["CPU"]}
    # The suggested context fits, the next power of two up does not.
    assert report.num_ctx is not None
    assert fits(measure(Trial(report.num_ctx, 4, 0)), devices)
    assert not fits(measure(Trial(report.num_ctx * 2, 4, 0)), devices)
    assert report.one_slot == fits(measure(Trial(32768, 1, 0)), devices)
    sentence = refusal("big:7b", report)
    assert sentence.startswith("big:7b needs ")
    assert "for 4 × 32,768 cells" in sentence and f"try num_ctx {report.num_ctx}" in sentence
    assert f"{budgets(devices)['CPU'] // MIB:,} MiB are free" in sentence


def test_weights_alone_too_large_advise_freeing_memory() -> None:
    devices = [host(2 * GIB)]
    with pytest.raises(DoesNotFit) as refused:
        plan(request(n_slots=1), devices, measure_for(devices))
    report = refused.value.report
    assert report.num_ctx is None and not report.one_slot
    assert "free memory" in refusal("big:7b", report)


def test_the_refusal_reads_as_the_issue_asks() -> None:
    report = NoFitReport(
        trial=Trial(8192, 4, 0),
        uses=[DeviceUse("CPU", weights=95 * MIB, kv=720 * MIB, compute=98 * MIB)],
        devices=[host(700 * MIB)],
        budgets={"CPU": 612 * MIB},
        num_ctx=2048,
        one_slot=True,
    )
    assert refusal("smollm2:135m", report) == (
        "smollm2:135m needs 913 MiB (weights 95, KV 720 for 4 × 8,192 cells, compute 98); "
        "612 MiB are free; try num_ctx 2048 or LOCALLLM_NUM_PARALLEL=1"
    )
    assert NoFitReport.from_dict(report.to_dict()) == report


def test_the_prefix_cache_gets_at_most_half_of_what_is_left() -> None:
    devices = [host(8 * GIB)]
    result = plan(
        request(n_ctx_per_slot=4096, prefix_cache=64 * GIB), devices, measure_for(devices)
    )
    left = budgets(devices)["CPU"] - use_of(result, "CPU").total
    assert result.prefix_cache == left // 2
    assert any("prompt-prefix cache" in w for w in result.warnings)
    small = plan(request(n_ctx_per_slot=4096, prefix_cache=64 * MIB), devices, measure_for(devices))
    assert small.prefix_cache == 64 * MIB and small.warnings == []


def test_margins_leave_room_on_every_device() -> None:
    assert margin(host(700 * MIB)) == 64 * MIB
    assert margin(host(24 * GIB)) == 1024 * MIB
    assert margin(gpu("CUDA0", 4 * GIB)) == 256 * MIB
    assert budgets([host(50 * MIB)]) == {"CPU": 0}


def test_a_plan_survives_its_json_form() -> None:
    devices = [host(32 * GIB), gpu("CUDA0", 3 * GIB)]
    result = plan(request(), devices, measure_for(devices))
    again = MemoryPlan.from_dict(result.to_dict())
    assert again == result
    assert result.to_dict()["processor"] == result.processor()
