"""llama.cpp measures the plan: ``no_alloc`` loads of real GGUFs (SmolLM2 and the tiny model)
agree with the GGUF's own sizes, and a runner whose plan finds no room refuses before it
allocates anything, with a report the daemon words.

Only the host's RAM exists here (no GPU backend): the GPU paths of the measure (llama.cpp's
device list, compute buffers per device) are covered by the planner's unit tests alone.
"""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import llama_cpp
import pytest
from runner_harness import RunnerHarness

from localllm.daemon.engine.model import route_llama_log
from localllm.daemon.memory.layout import layout_from_gguf
from localllm.daemon.memory.measure import llama_devices, plan_load
from localllm.daemon.memory.plan import MIB, DoesNotFit, MemoryPlan, NoFitReport, refusal
from localllm.daemon.memory.system import host_memory
from localllm.daemon.runner import RunnerConfig, RunnerProcess
from localllm.daemon.runner.client import DoesNotFitError, plan_only
from localllm.gguf_info import inspect_gguf

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def quiet_llama() -> None:
    route_llama_log(io.StringIO())


def _model_size(path: Path) -> int:
    """llama.cpp's own count of a model's weight bytes (a no_alloc load)."""
    params = llama_cpp.llama_model_default_params()
    params.no_alloc = True
    params.load_mode = llama_cpp.LLAMA_LOAD_MODE_NONE
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    assert model
    try:
        return int(llama_cpp.llama_model_size(model))
    finally:
        llama_cpp.llama_model_free(model)


def test_smollm2_measured_kv_and_weights_match_the_gguf(smollm2_gguf: Path) -> None:
    config = RunnerConfig(
        model_path=str(smollm2_gguf), n_slots=4, n_ctx_per_slot=8192, memory_plan=True
    )
    result = plan_load(config)
    assert result.measured and result.n_ctx_per_slot == 8192 and result.n_gpu_layers == 0
    (cpu,) = result.uses
    # 30 layers x 3 KV heads x (64 + 64) x 2 bytes per cell: 720 MiB for 4 x 8192 cells,
    # what llama.cpp logged for the example.
    assert cpu.kv == 720 * MIB
    assert cpu.weights == _model_size(smollm2_gguf)
    # The compute buffer is llama.cpp's figure: at least the logits of one 512-token batch.
    info = inspect_gguf(smollm2_gguf)
    assert cpu.compute >= 512 * (info.vocab_size or 0) * 4
    assert result.budgets["CPU"] <= host_memory().available


def test_the_gguf_layout_prices_smollm2_as_llama_cpp_does(smollm2_gguf: Path) -> None:
    layout = layout_from_gguf([inspect_gguf(smollm2_gguf)])
    assert layout.n_layer == 30 and layout.n_ctx_train == 8192
    # Without llama.cpp: the KV per cell and the weights it measured above.
    assert sum(layout.kv_per_cell) * 4 * 8192 == 720 * MIB
    assert layout.weights == _model_size(smollm2_gguf)
    # SmolLM2 ties its head to the token embedding: a copy only off the host.
    assert layout.tied_output > 0


def test_the_default_context_of_smollm2_is_its_trained_length(smollm2_gguf: Path) -> None:
    config = RunnerConfig(model_path=str(smollm2_gguf), n_slots=4, n_ctx_per_slot=0)
    result = plan_load(config)
    assert result.context_chosen and result.n_ctx_per_slot == 8192  # 8192 fits 24 GiB easily


def test_a_plan_that_does_not_fit_says_what_would(tiny_gguf: Path) -> None:
    config = RunnerConfig(
        model_path=str(tiny_gguf),
        n_slots=4,
        n_ctx_per_slot=4096,
        # Everything free is taken by (pretend) loaded models: nothing can fit.
        memory_reserved={"CPU": host_memory().available},
    )
    with pytest.raises(DoesNotFit) as refused:
        plan_load(config)
    report = refused.value.report
    assert report.trial.n_ctx_per_slot == 4096 and report.budgets == {"CPU": 0}
    assert report.short()["CPU"] == report.uses[0].total > 0
    assert report.num_ctx is None and not report.one_slot  # nothing smaller fits either
    text = refusal("tiny", report)
    assert text.startswith("tiny needs ") and "for 4 × 4,096 cells" in text
    assert "; 0 MiB are free; free memory" in text


def test_llama_cpp_lists_no_offload_device_here() -> None:
    # The build has the RPC backend (so llama.cpp "supports GPU offload"), but no GPU and no
    # RPC server is registered: the plan sees the host's RAM alone.
    assert llama_devices() == []


def test_a_runner_that_cannot_fit_refuses_before_allocating(
    tmp_path: Path, smollm2_gguf: Path
) -> None:
    config = RunnerConfig(
        model_path=str(smollm2_gguf),
        n_slots=4,
        n_ctx_per_slot=8192,
        n_threads=1,
        memory_plan=True,
        memory_reserved={"CPU": host_memory().available},
    )
    process = RunnerProcess(config, tmp_path / "r.sock", tmp_path / "r.log")
    with pytest.raises(DoesNotFitError) as refused:
        asyncio.run(process.start(timeout=120))
    assert not process.alive() and process.process is not None
    assert process.process.returncode == 3
    report = NoFitReport.from_dict(refused.value.report)
    assert report.uses[0].kv == 720 * MIB and report.budgets == {"CPU": 0}
    log = (tmp_path / "r.log").read_text()
    # llama.cpp laid the model out (no_alloc) but never loaded it for real.
    assert "no_alloc              = 1" in log and "no_alloc              = 0" not in log
    assert "does not fit" in log


def test_plan_only_answers_without_loading(tmp_path: Path, tiny_gguf: Path) -> None:
    config = RunnerConfig(model_path=str(tiny_gguf), n_slots=2, n_ctx_per_slot=0, n_threads=1)
    answer = asyncio.run(plan_only(config, tmp_path / "plan.log"))
    result = MemoryPlan.from_dict(answer["plan"])
    assert result.n_slots == 2 and result.context_chosen
    assert result.n_ctx_per_slot == inspect_gguf(tiny_gguf).context_length


def test_a_planned_runner_reports_its_plan_and_runs_it(tmp_path: Path, tiny_gguf: Path) -> None:
    config = RunnerConfig(
        model_path=str(tiny_gguf),
        n_slots=2,
        n_ctx_per_slot=0,
        n_threads=1,
        memory_plan=True,
        kv_cache_ram=1 << 20,
    )
    runner = RunnerHarness(config, tmp_path)
    try:
        health = runner.run(runner.client.health())
        result = MemoryPlan.from_dict(health["memory_plan"])
        assert health["n_ctx_per_slot"] == result.n_ctx_per_slot == 4096
        assert health["n_ctx"] == result.kv_cells == 2 * 4096
        assert result.prefix_cache == 1 << 20
    finally:
        runner.close()


def test_the_log_tap_sees_what_llama_cpp_logs(tiny_gguf: Path) -> None:
    from localllm.daemon.engine.model import tap_llama_log

    with tap_llama_log() as lines:
        assert _model_size(tiny_gguf) > 0
    assert any("no_alloc              = 1" in line for line in lines)
    assert not _log_taps_left()


def _log_taps_left() -> bool:
    from localllm.daemon.engine import model

    return bool(model._log_taps)


def test_a_runner_loaded_again_keeps_its_plan_until_an_option_or_file_changes(
    tmp_path: Path, tiny_gguf: Path
) -> None:
    import dataclasses
    import os
    import shutil

    model = tmp_path / "model.gguf"
    shutil.copyfile(tiny_gguf, model)
    config = RunnerConfig(
        model_path=str(model),
        n_slots=2,
        n_ctx_per_slot=0,
        n_threads=1,
        memory_plan=True,
        kv_cache_ram=1 << 20,
        kv_cache_dir=str(tmp_path / "kv"),
    )

    def loaded(config: RunnerConfig, name: str) -> dict[str, object]:
        (tmp_path / name).mkdir()
        runner = RunnerHarness(config, tmp_path / name)
        try:
            return runner.run(runner.client.health())
        finally:
            runner.close()

    first = loaded(config, "first")
    assert first["memory_plan_kept"] is False
    again = loaded(config, "again")
    assert again["memory_plan_kept"] is True  # the same files, options and free memory
    assert again["memory_plan"] == first["memory_plan"]
    assert again["n_ctx_per_slot"] == first["n_ctx_per_slot"]
    # another option: planned anew (and the new plan says what the option changed)
    other = loaded(dataclasses.replace(config, n_slots=3), "other")
    assert other["memory_plan_kept"] is False
    assert MemoryPlan.from_dict(other["memory_plan"]).n_slots == 3  # type: ignore[arg-type]
    # the same file name with other contents (its modification time changed): planned anew
    os.utime(model, ns=(1, 1))
    assert loaded(config, "touched")["memory_plan_kept"] is False


def test_a_kept_plan_follows_free_memory_by_distance_not_by_steps(
    tmp_path: Path, tiny_gguf: Path
) -> None:
    """Free memory that drifts less than a step either way (across a step's edge, too) keeps
    the plan; a step or more plans again; so does a device that is not the same."""
    from localllm.daemon.memory.plan import Device
    from localllm.daemon.memory.plancache import FREE_STEP, PlanCache

    config = RunnerConfig(model_path=str(tiny_gguf), n_slots=1, n_threads=1)
    plan = plan_load(config)
    cache = PlanCache(tmp_path / "plans")
    edge = 40 * FREE_STEP  # planned just below a step's edge

    def host(free: int) -> list[Device]:
        return [Device(name="CPU", kind="cpu", free=free, total=64 * FREE_STEP)]

    key = cache.key(config, host(edge - 1), "build")
    assert key == cache.key(config, host(edge + FREE_STEP), "build")  # free is not in the key
    cache.put(key, plan, host(edge - 1))
    assert cache.get(key, host(edge + 1)) == plan  # across the edge, 2 bytes away
    assert cache.get(key, host(edge - FREE_STEP // 2)) == plan
    assert cache.get(key, host(edge - 1 + FREE_STEP)) is None  # a step more
    assert cache.get(key, host(edge - 1 - FREE_STEP)) is None  # a step less
    assert cache.get(key, [*host(edge), *host(edge)]) is None  # other devices
    assert cache.get(cache.key(config, host(edge), "other build"), host(edge)) is None
