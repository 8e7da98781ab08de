"""The speed model: what a token costs a model by weight type, the arithmetic of a prediction,
rates recovered from the probe's timings, the probe child itself, and the speed book learning
from served requests."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from speed_support import make_calibration, seed_calibration

from localllm.daemon.devices.synthetic import write_llama
from localllm.daemon.memory.layout import layout_from_gguf
from localllm.daemon.speed import probe as speedprobe
from localllm.daemon.speed.book import MIN_DECODED, SpeedBook
from localllm.daemon.speed.measure import agreeing, last_level_cache, working_set
from localllm.daemon.speed.model import (
    PREFILL_TOKENS,
    Calibration,
    DeviceRates,
    ExpertRate,
    TypeRate,
    model_cost,
    predict,
)
from localllm.gguf_info import GGUFInfo, TensorInfo, inspect_gguf
from localllm.settings import Settings


def test_a_token_costs_the_layers_and_the_tied_output_head(smollm2_gguf: Path) -> None:
    info = inspect_gguf(smollm2_gguf)
    layout = layout_from_gguf([info])
    cost = model_cost([info], layout.kv_per_cell)
    assert cost.n_layer == 30 and cost.types == {"Q4_1", "Q8_0", "F32"}
    blocks = sum(t.n_bytes for t in info.tensors if t.name.startswith("blk."))
    embedding = next(t for t in info.tensors if t.name == "token_embd.weight")
    norm = next(t for t in info.tensors if t.name == "output_norm.weight")
    # SmolLM2 has no output.weight: its token embedding is the head, read whole per token
    assert cost.weight_bytes == blocks + embedding.n_bytes + norm.n_bytes
    assert cost.output_params == {"Q8_0": embedding.n_elements}
    assert cost.kv_per_cell == layout.kv_per_cell and cost.attention_width == 576
    # the head's rows are the vocabulary; a layer's rows are its matrices' output rows
    assert cost.vocab == embedding.shape[1] == 49152
    assert cost.layer_rows[0] == sum(
        t.n_elements // t.shape[0]
        for t in info.tensors
        if t.name.startswith("blk.0.") and len(t.shape) >= 2
    )
    # a batch runs the last layer after its attention for the tokens with logits only
    after = ("attn_output", "ffn_gate", "ffn_up", "ffn_down")
    assert sum(cost.last_skipped.values()) == sum(
        t.n_elements for t in info.tensors if t.name.startswith(tuple(f"blk.29.{a}" for a in after))
    )
    figures = make_calibration(
        Q4_1=TypeRate(5e9, 40e9), Q8_0=TypeRate(10e9, 60e9), F32=TypeRate(20e9, 80e9)
    )
    whole = dataclasses.replace(cost, last_skipped={})
    saved = 2 * 511 * cost.last_skipped["Q4_1"] / 40e9  # every token but the last's
    assert 512 / predict(cost, figures, context=512).prefill == pytest.approx(  # type: ignore[operator]
        512 / predict(whole, figures, context=512).prefill - saved  # type: ignore[operator]
    )


def test_experts_cost_only_what_a_token_is_routed_to() -> None:
    def tensor(name: str, shape: tuple[int, ...], n_bytes: int) -> TensorInfo:
        return TensorInfo(name, shape, "Q8_0", 0, n_bytes)

    info = GGUFInfo(
        path=Path("moe.gguf"),
        file_size=0,
        version=3,
        metadata={
            "general.architecture": "qwen3moe",
            "qwen3moe.block_count": 1,
            "qwen3moe.expert_count": 8,
            "qwen3moe.expert_used_count": 2,
            "qwen3moe.attention.head_count": 4,
            "qwen3moe.embedding_length": 64,
        },
        tensors=(
            tensor("blk.0.attn_q.weight", (64, 64), 1000),
            tensor("blk.0.ffn_up_exps.weight", (64, 128, 8), 8000),
            tensor("output.weight", (64, 100), 500),
        ),
    )
    cost = model_cost([info], (0,))
    assert cost.layer_bytes == ({"Q8_0": 1000 + 2000},)
    assert cost.output_bytes == {"Q8_0": 500}


def _moe_cost(tmp_path: Path, experts: int, used: int) -> Any:
    """The ModelCost of a real 3-layer llama GGUF of ``experts`` routed experts (``used`` a
    token), F32 weights."""
    import numpy as np

    def matrix(name: str, layer: int, rows: int, cols: int) -> tuple[Any, Any]:
        return np.full((rows, cols), 0.01, dtype=np.float32), None

    path = tmp_path / f"moe-{experts}-{used}.gguf"
    write_llama(
        path,
        embd=64,
        ffn=128,
        heads=4,
        layers=3,
        vocab=300,
        matrix=matrix,
        experts=experts,
        experts_used=used,
    )
    info = inspect_gguf(path)
    return model_cost([info], layout_from_gguf([info]).kv_per_cell)


def test_routed_experts_are_priced_at_their_kernels_pace_for_the_tokens_each_gets(
    tmp_path: Path,
) -> None:
    cost = _moe_cost(tmp_path, 8, 2)
    assert cost.experts == (8, 2) and cost.expert_types == {"F32"}
    every = 3 * 8 * 64 * 128  # gate, up and down of all 8 experts, each layer
    assert cost.expert_params == ({"F32": every},) * 3
    figures = make_calibration(F32=TypeRate(20e9, 80e9))
    dense = predict(cost, figures, context=512)  # no expert figures: the dense rate stands in

    def seconds(guess: Any) -> float:
        return PREFILL_TOKENS / guess.prefill  # type: ignore[no-any-return]

    # Measured at half the dense pace, the routed experts' share of the work (2 of 8 experts
    # a token) costs twice as much: every token of the first two layers and the last
    # layer's one token with logits.
    figures.experts = {"F32": ExpertRate(prefill=40e9, setup=0.0)}
    routed = every * 2 / 8
    work = 2 * routed * (2 * PREFILL_TOKENS + 1)
    assert seconds(predict(cost, figures, context=512)) == pytest.approx(
        seconds(dense) + work / 40e9 - work / 80e9
    )
    assert predict(cost, figures, context=512).decode == dense.decode  # decode: bytes read

    # What an expert costs once per batch that uses it is paid per batch: a 512-token prompt
    # in batches of 64 pays it 8 times where one batch of 512 pays it once (8 experts, 2 a
    # token: every expert is used by some token of each batch); for the last layer's one
    # token, 2 of the 8 experts.
    setup = 1e-12
    figures.experts = {"F32": ExpertRate(prefill=80e9, setup=setup)}
    used = 1 - (1 - 2 / 8) ** 1

    def setups(batches: float) -> float:
        return every * setup * (2 * batches + used)

    assert seconds(predict(cost, figures, context=512)) == pytest.approx(
        seconds(dense) + setups(1 - (1 - 2 / 8) ** 512)
    )
    small = dataclasses.replace(figures, experts={"F32": ExpertRate(prefill=80e9, setup=0.0)})
    assert seconds(predict(cost, figures, context=512, n_batch=64)) == pytest.approx(
        seconds(predict(cost, small, context=512, n_batch=64)) + setups(8 * (1 - (1 - 2 / 8) ** 64))
    )
    # More experts, as many used: each gets fewer of a batch's tokens, the same work in all,
    # so what each costs once weighs more per token.
    many = _moe_cost(tmp_path, 32, 2)
    assert seconds(predict(many, figures, context=512)) > seconds(
        predict(many, small, context=512)
    ) + (seconds(predict(cost, figures, context=512)) - seconds(predict(cost, small, context=512)))


def test_expert_rates_come_back_from_the_probes_timings() -> None:
    """The probe's two expert models at two batch sizes give back the pace per token and the
    cost per batch they were made from."""
    per_token, setup, weights, layers = 2 / 30e9, 3e-12, 3 * 1024 * 768, 2

    def batch(experts: int, tokens: int) -> float:
        return 0.004 + tokens * 1e-5 + experts * layers * weights * (setup + tokens * per_token)

    report = {
        "Q4_K": {
            "experts": [2, 6],
            "layers": layers,
            "expert_params": weights,
            "tokens": [16, 128],
            "batch_s": [[batch(n, 16), batch(n, 128)] for n in (2, 6)],
        }
    }
    base = make_calibration(Q4_K=TypeRate(10e9, 80e9))
    figures = base.with_experts({"experts": report, "rounds": 3, "unsettled": {}})
    assert figures.experts["Q4_K"].prefill == pytest.approx(30e9)
    assert figures.experts["Q4_K"].setup == pytest.approx(setup)
    assert figures.types == base.types and figures.kept
    # cached figures from before experts were measured load, with none
    older = base.to_dict()
    del older["experts"]
    assert Calibration.from_dict(older).experts == {}
    again = Calibration.from_dict(json.loads(json.dumps(figures.to_dict())))
    assert again == figures


def test_a_prediction_adds_up_the_bytes_and_the_fixed_costs(smollm2_gguf: Path) -> None:
    info = inspect_gguf(smollm2_gguf)
    cost = model_cost([info], layout_from_gguf([info]).kv_per_cell)
    figures = make_calibration(
        Q4_1=TypeRate(5e9, 40e9), Q8_0=TypeRate(10e9, 60e9), F32=TypeRate(20e9, 80e9)
    )
    guess = predict(cost, figures, context=2048)
    per_type: dict[str, int] = {}
    for layer in (*cost.layer_bytes, cost.output_bytes):
        for name, amount in layer.items():
            per_type[name] = per_type.get(name, 0) + amount
    step = 0.5e-3 + 30 * 0.1e-3 + sum(b / figures.types[t].decode for t, b in per_type.items())
    assert guess.decode == pytest.approx(1 / step)
    # what grows with the rows and the vocabulary, and the runner's own work, add up too
    figures.row, figures.runner_step, figures.sample_token = 2e-9, 0.3e-3, 4e-9
    rows = sum(cost.layer_rows) + cost.vocab
    busier = predict(cost, figures, context=2048)
    assert busier.decode == pytest.approx(1 / (step + rows * 2e-9 + 0.3e-3 + 49152 * 4e-9))
    figures.greedy_token = 1e-9
    greedy = predict(cost, figures, context=2048, greedy=True)
    assert greedy.decode == pytest.approx(1 / (step + rows * 2e-9 + 0.3e-3 + 49152 * 1e-9))
    figures.row = figures.runner_step = figures.sample_token = figures.greedy_token = 0.0
    # a longer prompt's tokens each attend to more before them: slower per token
    assert predict(cost, figures, context=2048, prompt=2048).prefill < guess.prefill  # type: ignore[operator]
    kv = sum(cost.kv_per_cell) * 2048 / figures.bandwidth  # no F16 figure: memory's pace
    assert guess.decode_full == pytest.approx(1 / (step + kv))
    # measured, the attention's own pace over the context prices it instead of the bytes
    figures.decode_attention = 5e9
    attending = predict(cost, figures, context=2048)
    work = 4 * cost.attention_width * 2048 * cost.n_layer
    assert attending.decode_full == pytest.approx(1 / (step + work / 5e9))
    assert attending.decode == guess.decode
    figures.decode_attention = 0.0
    assert guess.prefill and guess.prefill > guess.decode  # a batch reuses its weights
    assert guess.context == 2048
    slower = predict(cost, figures, context=2048, correction=(1e-3, 1e-4))
    assert slower.decode == pytest.approx(1 / (step + 1e-3))
    assert slower.prefill == pytest.approx(1 / (1 / guess.prefill + 1e-4))
    # a correction never takes off more than three quarters of a step
    faster = predict(cost, figures, context=2048, correction=(-1.0, -1.0))
    assert faster.decode == pytest.approx(4 * guess.decode)
    assert faster.prefill == pytest.approx(4 * guess.prefill)
    missing = predict(cost, make_calibration(Q4_1=TypeRate(5e9, 40e9)), context=2048)
    assert missing.decode is None and "no figures for F32, Q8_0" in missing.why
    offloaded = predict(cost, figures, context=2048, gpu_layers=31)
    assert offloaded.decode is None and "measured no GPU" in offloaded.why
    assert guess.to_dict()["decode"] == round(guess.decode, 1)
    assert PREFILL_TOKENS == 512


def _device(software: bool = False) -> DeviceRates:
    return DeviceRates(
        name="Vulkan0",
        description="llvmpipe (LLVM 15.0.6, 256 bits)" if software else "a GPU",
        software=software,
        decode_fixed=2e-3,
        decode_layer=50e-6,
        batch_fixed=3e-3,
        batch_layer=80e-6,
        types={"Q8_0": TypeRate(400e9, 20e12), "Q4_K": TypeRate(300e9, 15e12)},
    )


def test_layers_on_a_gpu_are_priced_at_its_own_figures(smollm2_gguf: Path) -> None:
    info = inspect_gguf(smollm2_gguf)
    cost = model_cost([info], layout_from_gguf([info]).kv_per_cell)
    cpu = {"Q4_1": TypeRate(5e9, 40e9), "Q8_0": TypeRate(10e9, 60e9), "F32": TypeRate(20e9, 8e10)}
    figures = make_calibration(**cpu)
    figures.devices = {"Vulkan0": _device()}
    alone = predict(cost, figures, context=2048)
    # every layer and the head on the device: the CPU keeps its step's fixed cost only
    full = predict(cost, figures, context=2048, gpu_layers=cost.n_layer + 1)
    device = figures.devices["Vulkan0"]
    weights: dict[str, int] = {}
    for part in (*cost.layer_bytes, cost.output_bytes):
        for name, amount in part.items():
            weights[name] = weights.get(name, 0) + amount
    on_device = sum(amount / device.rate(name).decode for name, amount in weights.items())
    step = 0.5e-3 + 2e-3 + 30 * 50e-6 + on_device
    assert full.decode == pytest.approx(1 / step)
    assert full.device == "Vulkan0 (a GPU)"
    # Q4_1 and F32 were not timed on the device: the nearest type in bits stands in
    assert (
        device.rate("Q4_1") == device.types["Q4_K"] and device.rate("F32") == device.types["Q8_0"]
    )
    # N of M layers: the last N on the device, the rest and the head on the CPU
    half = predict(cost, figures, context=2048, gpu_layers=10)
    cpu_part = predict(
        dataclasses.replace(
            cost,
            n_layer=20,
            layer_bytes=cost.layer_bytes[:20],
            layer_rows=cost.layer_rows[:20],
            layer_params=cost.layer_params[:20],
            kv_per_cell=cost.kv_per_cell[:20],
        ),
        make_calibration(**cpu),
        context=2048,
    )
    device_part = (
        2e-3
        + 10 * 50e-6
        + sum(
            amount / device.rate(name).decode
            for layer in cost.layer_bytes[20:]
            for name, amount in layer.items()
        )
    )
    assert half.decode == pytest.approx(1 / (1 / cpu_part.decode + device_part))  # type: ignore[operator]
    assert alone.decode < half.decode < full.decode  # type: ignore[operator]
    assert full.prefill > alone.prefill  # type: ignore[operator]
    # a software device is named as such beside its figures
    figures.devices = {"Vulkan0": _device(software=True)}
    said = predict(cost, figures, context=2048, gpu_layers=99).device
    assert said == "Vulkan0 (llvmpipe (LLVM 15.0.6, 256 bits), a software device)"
    # the figures survive the cache file
    again = Calibration.from_dict(json.loads(json.dumps(figures.to_dict())))
    assert again.devices == figures.devices


def test_a_devices_rates_come_back_from_its_timings() -> None:
    device = _device()
    batch, tiny_bytes, tiny_params = 128, 174080, 163840

    def tiny(layers: int) -> tuple[float, float]:
        return (
            device.decode_fixed + layers * device.decode_layer,
            device.batch_fixed + layers * device.batch_layer,
        )

    types = {}
    for name, rate in device.types.items():
        layers, layer_bytes, params = 8, 13_647_872, 12_845_056
        types[name] = {
            "layers": layers,
            "layer_bytes": layer_bytes,
            "layer_params": params,
            "decode_s": device.decode_fixed
            + layers * (device.decode_layer + layer_bytes / rate.decode),
            "batch_s": device.batch_fixed
            + layers * (device.batch_layer + 2 * batch * params / rate.prefill),
        }
    report = {
        "description": "a GPU",
        "software": False,
        "tiny": {
            "layers": [2, 26],
            "layer_bytes": tiny_bytes,
            "layer_params": tiny_params,
            "decode_s": [tiny(2)[0], tiny(26)[0]],
            "batch_s": [tiny(2)[1], tiny(26)[1]],
        },
        "types": types,
    }
    back = DeviceRates.from_probe("Vulkan0", report, batch)
    assert back.decode_fixed == pytest.approx(device.decode_fixed)
    assert back.decode_layer == pytest.approx(device.decode_layer)
    for name, rate in device.types.items():
        assert back.types[name].decode == pytest.approx(rate.decode)
        assert back.types[name].prefill == pytest.approx(rate.prefill)


def test_rates_come_back_from_the_probes_timings() -> None:
    """Timings made from known rates and fixed costs give those rates back."""
    fixed, layer, batch_fixed, batch_layer, batch = 0.4e-3, 0.15e-3, 1e-3, 0.9e-3, 64
    rates = {"Q4_K": TypeRate(15e9, 80e9), "Q8_0": TypeRate(12e9, 60e9)}
    tiny_bytes, tiny_params = 174080, 163840
    q8 = rates["Q8_0"]

    def tiny(layers: int) -> tuple[float, float]:
        return (
            fixed + layers * (layer + tiny_bytes / q8.decode),
            batch_fixed + layers * (batch_layer + 2 * batch * tiny_params / q8.prefill),
        )

    types = {}
    for name, rate in rates.items():
        layers, layer_bytes, params, output = 6, 7_225_344, 12_845_056, 1_146_880
        types[name] = {
            "layers": layers,
            "layer_bytes": layer_bytes,
            "layer_params": params,
            "output_bytes": output,
            "decode_s": fixed + layers * layer + layers * layer_bytes / rate.decode + output / 20e9,
            # the batch on a smaller model than the step's (arithmetic, not memory, bounds it)
            "batch_layers": 2,
            "batch_s": batch_fixed + 2 * batch_layer + 2 * batch * 2 * params / rate.prefill,
        }
    (step_a, batch_a), (step_b, batch_b) = tiny(2), tiny(26)
    # the head model: 131,072 rows of 512 in Q8_0, 6 ns a row besides its bytes
    row, vocab, head_bytes = 6e-9, 131072, 71_303_168
    head_s = head_bytes / q8.decode + vocab * row
    report = {
        "threads": 2,
        "repack": True,
        "batch": batch,
        "bandwidth": 20e9,
        "tiny": {
            "layers": [2, 26],
            "layer_bytes": tiny_bytes,
            "layer_params": tiny_params,
            "decode_s": [step_a, step_b],
            "batch_s": [batch_a, batch_b],
        },
        "types": types,
        "head": {
            "logits_s": 0.002 + head_s,
            "plain_s": 0.002,
            "greedy_s": vocab * 1e-9,
            "default_s": vocab * 3e-9,
            "vocab": vocab,
            "bytes": head_bytes,
        },
        "runner_step_s": 0.25e-3,
        # a decode step late in a context: its attention's pace, 8 GFLOP/s
        "attention": {
            "layers": 4,
            "width": 1024,
            "positions": 448,
            "decode_positions": 577,
            "batch_s": 0.1,
            "late_batch_s": 0.1 + 4 * 1024 * batch * 448 * 4 / 50e9,
            "decode_s": 2e-3,
            "late_decode_s": 2e-3 + 4 * 1024 * 576 * 4 / 8e9,
        },
    }
    for entry in types.values():  # every row of the type models' layers costs too
        entry["layer_rows"] = 10752
        entry["decode_s"] += entry["layers"] * 10752 * row  # type: ignore[operator]
    figures = Calibration.from_probe(report, "key", 1.0)
    assert figures.row == pytest.approx(row, rel=0.02)
    assert figures.decode_attention == pytest.approx(8e9)
    assert figures.attention == pytest.approx(50e9)
    assert figures.runner_step == 0.25e-3
    assert figures.sample_token == pytest.approx(3e-9) and figures.greedy_token == pytest.approx(
        1e-9
    )
    assert figures.decode_fixed == pytest.approx(fixed, rel=0.02)
    assert figures.decode_layer == pytest.approx(layer, rel=0.02)
    for name, rate in rates.items():
        assert figures.types[name].decode == pytest.approx(rate.decode, rel=0.02)
        assert figures.types[name].prefill == pytest.approx(rate.prefill, rel=0.02)
    again = Calibration.from_dict(json.loads(json.dumps(figures.to_dict())))
    assert again == figures
    merged = figures.merged(make_calibration(IQ2_XXS=TypeRate(1e9, 10e9)))
    assert set(merged.types) == {"Q4_K", "Q8_0", "IQ2_XXS"}


def test_cached_figures_are_found_again_and_completed_per_type(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # repacking fixed by the setting: no CPU probe in a cache dir of its own
    settings = Settings.from_env({"LOCALLLM_HOME": str(tmp_path), "LOCALLLM_CPU_REPACK": "on"})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    asked: list[list[str]] = []
    base = make_calibration(**{t: TypeRate(1e9, 1e9) for t in speedprobe.BASE_TYPES})

    def child(
        threads: int,
        repack: bool,
        types: list[str],
        timeout: float,
        cancelled: object = None,
        experts: object = (),
    ) -> dict[str, object]:
        asked.append(list(types))
        return {"types": types}

    def from_probe(report: dict[str, list[str]], key: str, seconds: float) -> Calibration:
        figures = make_calibration(**{t: TypeRate(2e9, 2e9) for t in report["types"]})
        figures.key = key
        return figures

    monkeypatch.setattr(speedprobe, "_run_child", child)
    monkeypatch.setattr(Calibration, "from_probe", staticmethod(from_probe))
    assert speedprobe.cached_calibration(settings, 1) is None
    first = speedprobe.calibrate(settings, threads=1)
    assert asked == [list(speedprobe.BASE_TYPES)] and set(first.types) == set(base.types)
    assert speedprobe.cached_calibration(settings, 1) == first
    speedprobe.calibrate(settings, threads=1)
    assert len(asked) == 1  # cached
    more = speedprobe.calibrate(settings, threads=1, types=["IQ2_XXS"])
    assert asked[-1] == ["IQ2_XXS"] and "IQ2_XXS" in more.types and "Q4_K" in more.types
    speedprobe.calibrate(settings, threads=1, fresh=True)
    assert len(asked[-1]) == len(speedprobe.BASE_TYPES) + 1


def test_a_mixture_of_experts_model_adds_its_experts_figures_to_the_kept_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe child times llama.cpp's expert kernel alone (real models, real llama.cpp)
    and the figures kept before stay as they were."""
    settings = Settings.from_env({"LOCALLLM_HOME": str(tmp_path), "LOCALLLM_CPU_REPACK": "on"})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    kept = seed_calibration(tmp_path / "cache", 1)
    # (a shared machine may keep its figures from agreeing: they are what is checked here)
    figures = speedprobe.calibrate(settings, threads=1, experts=["Q8_0"], keep_unsettled=True)
    assert set(figures.experts) == {"Q8_0"}
    assert figures.experts["Q8_0"].prefill > 0 and figures.experts["Q8_0"].setup >= 0
    assert figures.types == kept.types and figures.decode_fixed == kept.decode_fixed
    assert speedprobe.cached_calibration(settings, 1) == figures
    # measured once: a second pricing asks for nothing more
    assert speedprobe.calibrate(settings, threads=1, experts=["Q8_0"]) == figures


def test_the_speed_book_learns_from_requests_that_ran_alone(
    tmp_path: Path, smollm2_gguf: Path
) -> None:
    book = SpeedBook(tmp_path / "observed", lambda: "key")
    paths = [str(smollm2_gguf)]

    def observe(digest: str, rate: float, alone: bool = True, decoded: int = 64) -> bool:
        return book.observe(
            digest,
            "smollm2:135m",
            paths,
            alone=alone,
            decoded=decoded,
            decode_rate=rate,
            prefilled=200,
            prefill_rate=10 * rate,
            context=300,
        )

    assert not observe("a", 50.0, alone=False)
    assert not book.observe(
        "a",
        "m",
        paths,
        alone=True,
        decoded=MIN_DECODED - 1,
        decode_rate=50.0,
        prefilled=10,
        prefill_rate=500.0,
        context=10,
    )
    for rate in (40.0, 50.0, 60.0):
        assert observe("a", rate)
    entry = book.measured("a")
    assert entry is not None and entry.measured_decode == 50.0 and entry.measured_prefill == 500.0
    again = SpeedBook(tmp_path / "observed", lambda: "key")
    assert again.measured("a") == entry  # kept on disk

    info = inspect_gguf(smollm2_gguf)
    figures = make_calibration(
        Q4_1=TypeRate(5e9, 40e9),
        Q8_0=TypeRate(10e9, 60e9),
        F32=TypeRate(20e9, 80e9),
        F16=TypeRate(20e9, 80e9),
    )
    cost = model_cost([info], layout_from_gguf([info]).kv_per_cell)
    guess = predict(cost, figures, context=300)
    assert guess.decode_full and guess.prefill
    assert cost.main_type == "Q4_1"
    step_gap, token_gap = book.correction(figures, main_type="Q4_1")
    assert step_gap == pytest.approx(1 / 50.0 - 1 / guess.decode_full)
    assert token_gap == pytest.approx(1 / 500.0 - 1 / guess.prefill)
    # a prompt token's pace is the kernels' for a weight type: another type learns only the
    # decode step's gap
    assert book.correction(figures, main_type="F16") == (pytest.approx(step_gap), 0.0)
    # left out, the only model measured teaches nothing about itself
    assert book.correction(figures, exclude="a") == (0.0, 0.0)


def test_the_last_level_cache_is_read_from_the_os(tmp_path: Path) -> None:
    """The largest data cache level the kernel lists for the first CPU (instruction caches
    left out), its size in the kernel's notation; None where none is listed."""
    caches = [("1", "Data", "48K"), ("1", "Instruction", "32K"), ("2", "Unified", "1024K")]
    caches.append(("3", "Unified", "32768K"))
    for number, (level, kind, size) in enumerate(caches):
        folder = tmp_path / f"index{number}"
        folder.mkdir()
        (folder / "level").write_text(level + "\n")
        (folder / "type").write_text(kind + "\n")
        (folder / "size").write_text(size + "\n")
    assert last_level_cache(tmp_path) == 32 << 20
    assert working_set(32 << 20) == 128 << 20  # the decode models read 4x as much a step
    (tmp_path / "index3" / "size").write_text("64M\n")
    assert last_level_cache(tmp_path) == 64 << 20
    assert last_level_cache(tmp_path / "none") is None
    assert working_set(None) == 256 << 20  # not readable: a size beyond most caches
    assert working_set(1 << 20) == 64 << 20


def test_a_figure_agrees_when_its_best_two_rounds_do() -> None:
    assert agreeing([1.0, 1.08, 3.0])  # a busy round is only ever slower: left out
    assert not agreeing([1.0, 1.2, 1.25])
    assert agreeing([100e-6, 115e-6])  # 15 us apart: too short for a share to mean much
    assert not agreeing([1.0])


def test_figures_that_disagree_or_break_a_bound_are_not_kept() -> None:
    figures = make_calibration(Q4_K=TypeRate(15e9, 80e9))
    assert figures.kept and figures.why_not_kept() == ""
    figures.rounds, figures.unsettled = 8, {"Q4_K.decode": 0.25, "memory": 0.12}
    assert not figures.kept
    assert figures.why_not_kept() == (
        "2 figures did not agree within 10 % in 8 rounds (Q4_K.decode 25%, memory 12%)"
    )
    figures.unsettled = {}
    figures.refused = ["Q4_K decode read 61.0 GB/s, above the memory's 35.0 GB/s"]
    assert not figures.kept and "above the memory's" in figures.why_not_kept()
    back = Calibration.from_dict(json.loads(json.dumps(figures.to_dict())))
    assert back.refused == figures.refused and not back.kept
