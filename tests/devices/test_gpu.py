"""Everything the CPU path does, with layers on a real GPU device.

CI runs these on llama.cpp's Vulkan backend and Mesa's lavapipe (``.ci/run``'s GPU step:
``scripts/gpu-build.sh vulkan``, then ``GGML_VK_VISIBLE_DEVICES=0``): a real Vulkan device with
its own memory, where llama.cpp offloads layers, allocates the KV cache and compute buffers,
and runs its GPU kernels. It runs on the CPU and is slow (a few tokens a second, and each
process compiles its pipelines on first use), so each test asks for a few tokens of a tiny
model; only the comparison of answers uses the starter. Without a GPU these skip, saying why
(see ``gpu_device`` in conftest.py).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from rpc_support import Worker
from runner_harness import RunnerHarness, greedy
from tiny_gguf import write_tiny_gguf
from tiny_mmproj import png_bytes, write_tiny_mmproj

from localllm.daemon.devices.gpuinfo import hidden_vulkan_devices, is_software
from localllm.daemon.devices.llamareport import system_report
from localllm.daemon.memory.plan import MemoryPlan
from localllm.daemon.runner import (
    EmbeddingRequest,
    GenerationRequest,
    GenerationResult,
    RunnerConfig,
    TokenChunk,
)
from localllm.daemon.runner.client import plan_only

pytestmark = [pytest.mark.gpu, pytest.mark.slow, pytest.mark.usefixtures("gpu_device")]

LAYERS = 3  # the tiny model's 2 layers and its output layer
TIMEOUT = 600


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gpu") / "tiny.gguf", never_ends=True)


def _config(model: Path, **fields: Any) -> RunnerConfig:
    values: dict[str, Any] = {"n_slots": 8, "n_ctx_per_slot": 256, "memory_plan": True}
    return RunnerConfig(model_path=str(model), **(values | fields))


@pytest.fixture(scope="module")
def on_gpu(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunnerHarness]:
    """The tiny model with every layer on the GPU (the memory plan's choice)."""
    harness = RunnerHarness(_config(tiny), tmp_path_factory.mktemp("on-gpu"))
    yield harness
    harness.close()


def ask(prompt: str, tokens: int = 4, **options: Any) -> GenerationRequest:
    return GenerationRequest(id="", prompt=prompt, raw=True, options=greedy(tokens, **options))


def _gpu_bytes(health: dict[str, Any]) -> int:
    return sum(size for device, size in health["allocated"].items() if device != "CPU")


# -- the device ---------------------------------------------------------------------------------


def test_doctor_lists_the_device_and_a_software_device_is_marked(
    gpu_device: dict[str, Any],
) -> None:
    assert gpu_device["memory_total"] > 0 and gpu_device["memory_free"] > 0
    assert gpu_device["software"] == is_software(str(gpu_device["description"]))
    if not gpu_device["software"] or not str(gpu_device["name"]).startswith("Vulkan"):
        return
    # llama.cpp skips a software Vulkan device unless it is named: doctor lists it as such.
    unnamed = {k: v for k, v in os.environ.items() if k != "GGML_VK_VISIBLE_DEVICES"}
    report = system_report(env=unnamed)
    assert not [d for d in report["devices"] if d["type"] in ("gpu", "igpu")]
    hidden = hidden_vulkan_devices(report, None)
    assert [(d["description"], d["software"]) for d in hidden] == [
        (gpu_device["description"], True)
    ]
    from localllm.cli.doctor import _device_lines

    lines = "\n".join(_device_lines(report | {"hidden_devices": hidden}))
    assert f"GGML_VK_VISIBLE_DEVICES={hidden[0]['index']} uses it" in lines
    assert "a software device, slower than the CPU backend" in lines


def test_every_layer_kv_and_compute_buffers_go_to_the_device(on_gpu: RunnerHarness) -> None:
    health = on_gpu.run(on_gpu.client.health())
    assert health["gpu_offload"] and health["gpu_layers"] == LAYERS
    plan = MemoryPlan.from_dict(health["memory_plan"])
    assert plan.n_gpu_layers == LAYERS and plan.size_vram > 0
    (device,) = [u for u in plan.uses if u.device != "CPU"]
    assert device.layers == LAYERS and device.kv > 0 and device.compute > 0
    # What the load really allocated there, as llama.cpp logged it.
    allocated = health["allocated"]
    assert allocated[device.device] > 0, allocated
    assert "GPU" in plan.processor()


def test_streaming_timings_batching_and_prefix_reuse_on_the_device(
    on_gpu: RunnerHarness,
) -> None:
    text, first = on_gpu.generate(ask("the quick brown fox jumps over the lazy dog"), TIMEOUT)
    timings = first.timings
    assert first.done_reason == "length" and timings.completion_tokens == 4 and text
    assert timings.ttft_ms > 0 and timings.prompt_tokens_per_s > 0
    assert timings.decode_tokens_per_s > 0
    # The same prompt again: every token from the KV cache on the device, and the first
    # token from the logits the slot kept (no step: see test_kept_logits.py).
    again_text, again = on_gpu.generate(ask("the quick brown fox jumps over the lazy dog"), TIMEOUT)
    assert again.timings.cached_tokens == again.timings.prompt_tokens
    assert again_text == text
    # Eight streams at once, decoded in shared batches, all end with their own tokens.
    results = on_gpu.generate_many([ask(f"stream {i}: " + "word " * i) for i in range(8)], TIMEOUT)
    assert [r.timings.completion_tokens for _, r in results] == [4] * 8
    assert all(r.done_reason == "length" and t for t, r in results)


def test_the_reported_prefill_time_is_the_devices(smollm2_gguf: Path, tmp_path: Path) -> None:
    # llama_decode on an asynchronous backend returns once the work is queued: a clock read
    # right after it leaves the device's time out (issue 47: a 63-token prompt reported 0.05 s
    # of prefill in a request of 8.76 s on lavapipe). One token generated, so the request is
    # its prefill: the reported prefill time is within 20 % of the wall time around it. The
    # starter, not the tiny model: its prefill on lavapipe takes seconds, far more than the
    # request's own overheads (a socket, tokenizing, one sample).
    config = _config(smollm2_gguf, n_slots=1, n_ctx_per_slot=128)
    harness = RunnerHarness(config, tmp_path)
    prompt = "Timing check: " + "the quick brown fox jumps over the lazy dog, " * 4
    try:
        assert harness.run(harness.client.health())["gpu_layers"] > 0
        harness.generate(ask("Warm up.", 1), TIMEOUT)  # shaders are built on first use
        started = time.perf_counter()
        _, result = harness.generate(ask(prompt, 1), TIMEOUT)
        wall_ms = (time.perf_counter() - started) * 1000
    finally:
        harness.close()
    timings = result.timings
    assert timings.prompt_tokens >= 40 and timings.cached_tokens == 0
    print(f"prefill {timings.prompt_ms:.0f} ms reported, {wall_ms:.0f} ms around the request")
    assert abs(wall_ms - timings.prompt_ms) <= 0.2 * wall_ms


def test_structured_output_and_embeddings_on_the_device(on_gpu: RunnerHarness) -> None:
    schema = {"type": "string", "enum": ["red", "green", "blue"]}
    text, result = on_gpu.generate(ask("colour:", 12, json_schema=schema), TIMEOUT)
    assert json.loads(text) in schema["enum"], text
    assert result.done_reason == "stop"
    vectors = on_gpu.run(
        on_gpu.client.embed(EmbeddingRequest(id="", inputs=["one", "two words"]))
    ).embeddings
    assert len(vectors) == 2 and all(math.isclose(_norm(v), 1.0, rel_tol=1e-3) for v in vectors)


def test_a_long_answer_shifts_the_context_on_the_device(tiny: Path, tmp_path: Path) -> None:
    harness = RunnerHarness(_config(tiny, n_slots=1, n_ctx_per_slot=64), tmp_path)
    try:
        _, result = harness.generate(ask("a prompt of a few tokens", 100), TIMEOUT)
    finally:
        harness.close()
    # 100 tokens through a 64-cell context: the oldest half was dropped, twice at least.
    assert result.done_reason == "length" and result.timings.completion_tokens == 100


def test_a_partial_offload_puts_n_of_m_layers_on_the_device(tiny: Path, tmp_path: Path) -> None:
    harness = RunnerHarness(_config(tiny, n_slots=1, n_gpu_layers=1), tmp_path)
    try:
        health = harness.run(harness.client.health())
        _, result = harness.generate(ask("half here, half there"), TIMEOUT)
    finally:
        harness.close()
    assert health["gpu_layers"] == 1 and result.timings.completion_tokens == 4
    plan = MemoryPlan.from_dict(health["memory_plan"])
    assert plan.n_gpu_layers == 1
    assert health["allocated"]["CPU"] > 0 and _gpu_bytes(health) > 0
    assert "CPU/GPU" in plan.processor()


def test_a_gpu_memory_cap_leaves_layers_on_the_cpu_and_says_so(tiny: Path, tmp_path: Path) -> None:
    import asyncio

    full = asyncio.run(plan_only(_config(tiny, n_slots=1), tmp_path / "full.log"))["plan"]
    on_device = MemoryPlan.from_dict(full).size_vram
    # A cap just below what every layer needs: fewer layers, said in the plan's warnings.
    capped = asyncio.run(
        plan_only(
            _config(tiny, n_slots=1, gpu_memory=on_device - 1),
            tmp_path / "capped.log",
        )
    )["plan"]
    assert full["n_gpu_layers"] == LAYERS
    assert 0 <= capped["n_gpu_layers"] < LAYERS
    (warning,) = [w for w in capped["warnings"] if "layers on the GPU" in w]
    assert f"{capped['n_gpu_layers']} of {LAYERS} layers on the GPU" in warning
    assert "LOCALLLM_GPU_MEMORY caps each GPU" in warning


# -- caches, drafts, images, workers ------------------------------------------------------------

PREFIX = "kv tiers on the device: " + "a long shared system prompt " * 10


def test_a_device_kv_cache_is_saved_to_disk_and_restored_after_a_restart(
    tiny: Path, tmp_path: Path
) -> None:
    def answer(folder: str) -> tuple[str, GenerationResult]:
        config = _config(
            tiny,
            n_slots=1,
            kv_cache_dir=str(tmp_path / "kv"),
            kv_cache_ram=64 << 20,
            kv_cache_disk=256 << 20,
        )
        harness = RunnerHarness(config, tmp_path / folder)
        try:
            return harness.generate(ask(PREFIX + "question", 6), TIMEOUT)
        finally:
            harness.close()  # saves the idle prefix

    cold_text, cold = answer("first")
    assert list((tmp_path / "kv").glob("*/*.kv"))
    warm_text, warm = answer("second")
    assert cold.timings.cached_tokens == 0
    assert warm.timings.cached_tokens >= cold.timings.prompt_tokens - 16
    assert warm_text == cold_text


def test_a_draft_model_on_the_device_drafts_and_keeps_the_greedy_answer(
    tiny: Path, tmp_path: Path
) -> None:
    # As test_speculative_draft does on the CPU: an in-process engine whose drafts are free,
    # so every step drafts; the answers must be plain decoding's.
    from speculative_runs import JOBS, DraftRun, Run

    from localllm.daemon.engine.model import LlamaModel
    from localllm.daemon.speculation.draft_model import DraftModel

    config = RunnerConfig(model_path=str(tiny), n_slots=3, n_ctx_per_slot=512, kv_cells=1535)
    model = LlamaModel(config)
    draft = DraftModel(model, str(shutil.copy(tiny, tmp_path / "same.gguf")))
    try:
        assert model.n_gpu_layers > 0 and draft.model.n_gpu_layers > 0
        # 20 tokens each are enough here (the device is slow).
        jobs = [(name, prompt, replace(options, num_predict=20)) for name, prompt, options in JOBS]
        plain = Run(model, num_draft=0).run(jobs)
        drafting = DraftRun(model, draft, num_draft=4)
        assert drafting.run(jobs) == plain
    finally:
        draft.close()
        model.close()
    timings = [r.timings for r in drafting.results.values()]
    assert sum(t.draft_tokens for t in timings) > 0
    assert sum(t.draft_accepted for t in timings) > 0
    assert {t.drafter for t in timings} == {"draft:same.gguf"}


def test_a_vision_projector_runs_on_the_device(tiny: Path, tmp_path: Path) -> None:
    import base64

    from localllm.daemon.runner.protocol import IMAGE_MARKER

    projector = write_tiny_mmproj(tmp_path / "mmproj.gguf")
    harness = RunnerHarness(_config(tiny, n_slots=1, projector=str(projector)), tmp_path)
    try:
        image = base64.b64encode(png_bytes((200, 30, 30))).decode()
        request = ask(f"look: {IMAGE_MARKER} what is it?", 3)
        request.images = [image]
        _, result = harness.generate(request, TIMEOUT)
        health = harness.run(harness.client.health())
    finally:
        harness.close()
    assert health["vision"] and result.timings.completion_tokens == 3
    log = (tmp_path / "runner.log").read_text(errors="replace")
    assert "CLIP using Vulkan" in log or "CLIP using CUDA" in log or "CLIP using Metal" in log


def test_an_rpc_worker_takes_layers_beside_the_local_gpu(tiny: Path, tmp_path: Path) -> None:
    # The worker serves its CPU (its GPUs hidden), this machine its GPU.
    worker = Worker(tmp_path / "worker", env={"GGML_VK_VISIBLE_DEVICES": ""})
    try:
        harness = RunnerHarness(
            _config(tiny, n_slots=1, rpc_workers=[worker.endpoint]), tmp_path / "runner"
        )
        try:
            health = harness.run(harness.client.health())
            _, result = harness.generate(ask("split over two machines"), TIMEOUT)
        finally:
            harness.close()
    finally:
        worker.stop()
    kinds = {d["kind"] for d in health["devices"]}
    assert {"rpc", "gpu"} <= kinds or {"rpc", "igpu"} <= kinds, health["devices"]
    assert sum(d["layers"] for d in health["devices"]) == LAYERS - 1
    assert result.timings.completion_tokens == 4


# -- the same answers as the CPU ----------------------------------------------------------------

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Water boils at a temperature of",
]
TOP = 5
TOP1_TOLERANCE = 0.08
TOP5_TOLERANCE = 0.25
"""Largest differences in nats allowed between the CPU's and the device's log probabilities:
of the most likely token, and of any of the top 5. The kernels differ by more than their last
bits: for Q4_1 weights llama.cpp's CPU backend quantizes the activations to 8 bits (Q8_1)
before its dot products, while the Vulkan shaders here multiply in F32, and which CPU kernel
runs depends on the CPU. Measured on lavapipe with the starter: top token within 0.005 nats,
the top 5 within 0.17 on the AVX2 machine of docs/gpu.md; top token 0.048 and top 5 0.18 on a
2-core AVX-512 EPYC (the same 0.048 at the commit before this round's changes: the CPU's side
moved, not the device's). The first tokens must still be equal and share the top 5."""


def _first_tokens(harness: RunnerHarness, prompt: str) -> tuple[str, dict[str, float]]:
    request = ask(prompt, 1, logprobs=True, top_logprobs=TOP, repeat_penalty=1.0)

    async def collect() -> tuple[str, dict[str, float]]:
        async for event in harness.client.generate(request):
            if isinstance(event, TokenChunk) and event.logprobs:
                first = event.logprobs[0]
                return first.token, {t.token: t.logprob for t in first.top_logprobs}
        raise AssertionError("no token came")

    return harness.run(collect(), timeout=TIMEOUT)


def _norm(vector: list[float]) -> float:
    return math.sqrt(sum(v * v for v in vector))


def _cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / (_norm(a) * _norm(b))


def test_the_device_answers_as_the_cpu_does(smollm2_gguf: Path, tmp_path: Path) -> None:
    answers: dict[str, list[tuple[str, dict[str, float]]]] = {}
    vectors: dict[str, list[list[float]]] = {}
    for where, cpu_only in (("cpu", True), ("gpu", False)):
        config = _config(smollm2_gguf, n_slots=1, n_ctx_per_slot=128, cpu_only=cpu_only)
        harness = RunnerHarness(config, tmp_path / where)
        try:
            health = harness.run(harness.client.health())
            assert (health["gpu_layers"] > 0) == (where == "gpu"), health
            answers[where] = [_first_tokens(harness, p) for p in PROMPTS]
            embed = EmbeddingRequest(id="", inputs=PROMPTS)
            vectors[where] = harness.run(harness.client.embed(embed), TIMEOUT).embeddings
        finally:
            harness.close()
    top1, worst = 0.0, 0.0
    for (cpu_token, cpu_top), (gpu_token, gpu_top) in zip(
        answers["cpu"], answers["gpu"], strict=True
    ):
        assert gpu_token == cpu_token
        top1 = max(top1, abs(cpu_top[cpu_token] - gpu_top[gpu_token]))
        for token in cpu_top.keys() & gpu_top.keys():
            worst = max(worst, abs(cpu_top[token] - gpu_top[token]))
        assert len(cpu_top.keys() & gpu_top.keys()) >= TOP - 1
    print(f"CPU/device logprob differences: top token {top1:.4f}, top {TOP} {worst:.4f}")
    assert top1 <= TOP1_TOLERANCE and worst <= TOP5_TOLERANCE
    for cpu_vector, gpu_vector in zip(vectors["cpu"], vectors["gpu"], strict=True):
        assert _cosine(cpu_vector, gpu_vector) >= 0.999
