"""The GPU paths' decisions that need no device: reading what a load allocated, naming a GPU
fault from a runner's log, and when a model moves to the CPU after its GPU failed.
(The same paths on a real device: test_gpu.py and test_gpu_daemon.py, marked gpu.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from hooks.localllm_test_hooks import FaultHook, decode_fault

from localllm import testhooks
from localllm._exceptions import SettingsError
from localllm.daemon.devices.allocations import allocated
from localllm.daemon.devices.faults import decode_failure, gpu_cause, injected_fault
from localllm.daemon.devices.gpuhealth import FAILURES_BEFORE_CPU, WINDOW_S, GpuHealth
from localllm.daemon.devices.gpuinfo import HIDDEN_GPUS, is_software
from localllm.daemon.runner.protocol import RunnerConfig
from localllm.settings import Settings

LOAD_LOG = """\
load_tensors: offloaded 31/31 layers to GPU
load_tensors:   CPU_Mapped model buffer size =    28.12 MiB
load_tensors:      Vulkan0 model buffer size =    92.10 MiB
llama_context: Vulkan_Host  output buffer size =     0.75 MiB
llama_kv_cache:    Vulkan0 KV buffer size =   360.00 MiB
llama_kv_cache: size =  360.00 MiB (  8192 cells,  30 layers,  4/4 seqs)
sched_reserve:    Vulkan0 compute buffer size =    97.12 MiB
sched_reserve: Vulkan_Host compute buffer size =     6.26 MiB
"""
MIB = 1 << 20


def test_what_a_load_allocated_is_read_per_device_with_host_buffers_on_the_cpu() -> None:
    found = allocated(LOAD_LOG)
    assert found == {
        "CPU": round((28.12 + 0.75 + 6.26) * MIB),
        "Vulkan0": round((92.10 + 360.00 + 97.12) * MIB),
    }
    assert allocated("nothing logged") == {}


def test_a_gpu_fault_is_found_in_the_runners_log_and_named(tmp_path: Path) -> None:
    log = tmp_path / "runner.log"
    log.write_text("load_tensors: loaded\nINFO serving\n")
    assert gpu_cause(log) is None
    with log.open("a") as handle:
        handle.write("ggml_vulkan: Device lost (vk::DeviceLostError)\n")
        handle.write("Fatal Python error: Aborted\n")
    assert gpu_cause(log) == "ggml_vulkan: Device lost (vk::DeviceLostError)"
    # Only what was logged after the runner's start counts.
    assert gpu_cause(log, since=log.stat().st_size) is None
    assert gpu_cause(tmp_path / "missing.log") is None
    log.write_text("CUDA error: out of memory\n  current device: 0\n")
    assert gpu_cause(log) == "CUDA error: out of memory"
    assert "ran out of memory" in decode_failure(-2, "CUDA0")
    assert "failed to compute the batch" in decode_failure(-3, "Vulkan0")
    assert "Vulkan0: llama_decode status -3" in decode_failure(-3, "Vulkan0")


def test_the_test_fault_is_checked_and_fires_once_and_only_where_the_hooks_are(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The test tree's hook reads the variable, checks it and fires at the n-th decode once.
    monkeypatch.setenv("LOCALLLM_TEST_FAULT", "decode-failed@3")
    hook = decode_fault()
    assert hook is not None and [hook.before_decode() for _ in range(4)] == [None, None, -3, None]
    for bad in ("decode-failed", "melted@1", "out-of-memory@0", "device-lost@x"):
        monkeypatch.setenv("LOCALLLM_TEST_FAULT", bad)
        with pytest.raises(SettingsError, match="LOCALLLM_TEST_FAULT"):
            decode_fault()
    hook = FaultHook("out-of-memory@2")
    assert [hook.before_decode() for _ in range(4)] == [None, -2, None, None]
    # Outside the fixtures (this process has no hooks module on its path) the variable is no
    # setting and reaches no runner, whatever it says.
    monkeypatch.setenv("LOCALLLM_TEST_FAULT", "decode-failed@1")
    assert testhooks.location() is None and testhooks.decode_fault() is None
    assert injected_fault(on_gpu=True) is None
    assert not hasattr(Settings.from_env({"LOCALLLM_TEST_FAULT": "melted"}), "test_fault")


def test_a_second_gpu_failure_in_the_window_moves_the_model_to_the_cpu() -> None:
    now = [1000.0]
    health = GpuHealth(clock=lambda: now[0])
    config = RunnerConfig(model_path="m.gguf", n_gpu_layers=-1)
    health.failed("m", "CUDA error: an illegal memory access", runner=11)
    health.failed("m", "CUDA error: an illegal memory access", runner=11)  # the same runner
    assert health.fallback("m") is None and health.follow("m", config) is config
    health.failed("m", None, runner=12)  # a runner that ended for another reason
    assert health.fallback("m") is None
    now[0] += WINDOW_S + 1  # an old failure no longer counts
    health.failed("m", "ggml_vulkan: Device lost", runner=13)
    assert health.fallback("m") is None
    now[0] += 60
    health.failed("m", "ggml_vulkan: Device lost", runner=14)
    reason = health.fallback("m")
    assert reason is not None and f"failed {FAILURES_BEFORE_CPU} times" in reason
    assert "ggml_vulkan: Device lost" in reason
    moved = health.follow("m", config)
    assert moved.cpu_only and moved.n_gpu_layers == 0
    assert health.follow("m", moved) is moved
    assert health.fallback("other") is None


def test_a_load_that_dies_of_the_gpu_moves_the_model_to_the_cpu_at_once() -> None:
    health = GpuHealth()
    health.failed("m", "CUDA error: out of memory", loading=True)
    reason = health.fallback("m")
    assert reason is not None and "while loading" in reason


def test_a_cpu_only_runner_starts_with_every_gpu_hidden() -> None:
    from localllm.daemon.runner.client import runner_environment

    assert runner_environment(RunnerConfig(model_path="m.gguf")) is None
    hidden = runner_environment(RunnerConfig(model_path="m.gguf", cpu_only=True))
    assert hidden is not None and all(hidden[name] == "" for name in HIDDEN_GPUS)
    assert is_software("llvmpipe (LLVM 15.0.6, 256 bits)") and not is_software("NVIDIA H100")
