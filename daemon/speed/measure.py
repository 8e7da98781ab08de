"""The speed probe's child (``python -m localllm.daemon.speed.measure``): llama.cpp
timed on synthetic models, one JSON report printed for :mod:`.speedprobe` to turn into rates
(:meth:`~localllm.daemon.speed.model.Calibration.from_probe`).

On the CPU, :func:`cpu_figures` loads every model once and reads each figure once a round,
the models interleaved, until the best two rounds of every figure agree (a busy moment spoils
one round of each, not all of one):

* two tiny models of 2 and 26 layers (a step's and a layer's cost besides the weights), and
  the runner's own engine generating on the smaller one (its work per step outside llama.cpp);
* per weight type, a decode step on a model that reads several times the last-level cache
  (:func:`last_level_cache`, read from the OS) and a batch on a model of a layer or two;
* a model of wide attention: its batch and decode step early and late in a context (the
  attention's pace);
* a one-layer model whose large head (itself beyond the cache) is decoded with logits and
  without, and the runner's samplers on its logits;
* the memory's bandwidth, read by as many numpy readers as decode threads; then the sanity
  bounds (no decode step reading faster than that, no batch above the cores' arithmetic,
  :func:`peak_operations`), and what other programs used meanwhile.

* :func:`gpu_device` — when llama.cpp lists a GPU, the tiny models and a few weight types'
  models again with every layer on the first one (``report["devices"][name]``, read into
  :class:`~localllm.daemon.speed.model.DeviceRates`); a software device (llvmpipe) is flagged.

The GPU part times each model once (:func:`fixed_costs`, :func:`weight_types`). The CPU
parts keep every operation on the CPU (no layers offloaded, and no large batch sent to
a GPU for its multiplications, which llama.cpp does by default when one exists).

The weights are real ggml blocks: a few rows quantized by ggml itself
(``ggml_quantize_chunk``), repeated to fill each matrix (the values do not change the speed).
Each figure is the best of several steps: a shared machine only ever makes a step slower.
Only this child imports llama.cpp.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from localllm import testhooks

from . import experts as expert_models
from .probe import BASE_TYPES

__all__ = [
    "agreeing",
    "cpu_figures",
    "fixed_costs",
    "gpu_device",
    "last_level_cache",
    "main",
    "peak_operations",
    "weight_types",
    "working_set",
]

# The per-type models: 1024 wide, FFN 2816 (multiples of the 256-weight K-quant blocks), as
# many layers as make ~48 MB (beyond a 32 MB last-level cache) up to 6.
_EMBD, _FFN, _HEADS, _VOCAB = 1024, 2816, 8, 320
_TARGET_BYTES = 48 << 20
_MAX_LAYERS = 6
# The fixed-cost models: 128 wide, FFN 256, Q8_0, 2 and 26 layers.
_TINY_EMBD, _TINY_FFN, _TINY_HEADS, _TINY_LAYERS = 128, 256, 4, (2, 26)
_BATCH = 128
_DECODE_STEPS = 16
_BATCHES = 1
_TINY_TURNS = 3
# The attention's pace: a batch at this position against one at the start, on this type.
_LATE = 449
_ATTENTION_TYPE = "Q8_0"
_ATTENTION_FFN, _ATTENTION_LAYERS = 256, 4
# The output head and the sampler: a one-layer model with a large vocabulary and narrow rows
# (Q8_0, 512 wide, 131,072 tokens: 71 MB, beyond the last-level cache, like a real head),
# decoded with logits and without; then the runner's samplers on its logits.
_HEAD_EMBD, _HEAD_VOCAB, _HEAD_TYPE = 512, 131072, "Q8_0"
# The runner's own work per step: the engine on the 2-layer tiny model for this many tokens.
_ENGINE_TOKENS = 48
# A GPU's part: the weight types timed on it (others are priced at the nearest in bits), and
# the turns of its tiny models (a GPU is not shared with busy programs as a CPU is).
_GPU_TYPES = ("Q8_0", "Q4_K")
_GPU_TURNS = 1
_GPU_DECODE_STEPS = 4
# A GPU reads 48 MB in microseconds: its models are larger (up to 256 MB, 32 layers), but a
# software device reads ~100 MB/s, so its are one or two layers.
_GPU_TARGET_BYTES, _GPU_MAX_LAYERS, _SOFTWARE_TARGET_BYTES = 256 << 20, 32, 16 << 20


def _ggml() -> Any:
    import ctypes

    from llama_cpp._ggml import libggml

    libggml.ggml_quantize_chunk.restype = ctypes.c_size_t
    libggml.ggml_quantize_chunk.argtypes = [
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_void_p,
    ]
    libggml.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
    libggml.ggml_quantize_requires_imatrix.argtypes = [ctypes.c_int]
    return libggml


class _Weights:
    """Matrices of one ggml type: a few rows quantized by ggml, repeated."""

    _ROWS = 8

    def __init__(self, type_name: str) -> None:
        import gguf
        import numpy as np

        self.kind = gguf.GGMLQuantizationType[type_name]
        self._np = np
        self._rng = np.random.default_rng(0)
        self._rows: dict[int, Any] = {}
        self._matrices: dict[tuple[int, int], Any] = {}

    def _base(self, cols: int) -> Any:
        import gguf

        np = self._np
        if cols not in self._rows:
            src = (self._rng.standard_normal((self._ROWS, cols)) * 0.05).astype(np.float32)
            kind = self.kind
            if kind == gguf.GGMLQuantizationType.F32:
                self._rows[cols] = src
            elif kind == gguf.GGMLQuantizationType.F16:
                self._rows[cols] = src.astype(np.float16)
            else:
                libggml = _ggml()
                block, size = gguf.GGML_QUANT_SIZES[kind]
                out = np.zeros((self._ROWS, cols // block * size), dtype=np.uint8)
                # Types that need an importance matrix get a flat one: the speed is the same.
                flat = np.ones(cols, dtype=np.float32)
                imatrix = flat.ctypes.data if libggml.ggml_quantize_requires_imatrix(kind) else None
                libggml.ggml_quantize_chunk(
                    int(kind), src.ctypes.data, out.ctypes.data, 0, self._ROWS, cols, imatrix
                )
                self._rows[cols] = out
        return self._rows[cols]

    def matrix(self, rows: int, cols: int) -> Any:
        """A ``rows`` × ``cols`` matrix (raw bytes for quantized types): one array for every
        matrix of that shape (each layer's is the same; the writer only reads them)."""
        if (rows, cols) not in self._matrices:
            base = self._base(cols)
            self._matrices[rows, cols] = self._np.tile(base, (-(-rows // self._ROWS), 1))[:rows]
        return self._matrices[rows, cols]

    def layer_bytes_of(self, rows: int, cols: int) -> int:
        """Bytes of one ``rows`` x ``cols`` matrix."""
        return self._base(cols).nbytes // self._ROWS * rows

    def layer_bytes(self, embd: int, ffn: int) -> int:
        """Bytes of one layer's seven matrices."""
        rows = {embd: 4 * embd + ffn * 2, ffn: embd}
        return sum(self._base(cols).nbytes // self._ROWS * count for cols, count in rows.items())


def _write_model(
    path: Path,
    type_name: str,
    embd: int,
    ffn: int,
    heads: int,
    layers: int,
    vocab: int = _VOCAB,
    head_type: str | None = None,
    experts: int = 0,
) -> None:
    """A probe model whose layers are all ``type_name``; its output head is F32 (its bytes
    counted apart), or ``head_type``. The control tokens' head rows are zero, so that sampling
    never ends a generation (their logit 0 is below the top 40 of random ones)."""
    import numpy as np

    from ..devices.synthetic import write_llama

    weights = _Weights(type_name)
    quantized = weights.kind.name not in ("F32", "F16")
    if head_type is None:
        head = (np.random.default_rng(1).standard_normal((vocab, embd)) * 0.05).astype(np.float32)
        head[:3] = 0
        head_matrix: tuple[Any, Any] = (head, None)
    else:
        header = _Weights(head_type)
        rows = header.matrix(vocab, embd)
        rows[:3] = 0  # zero blocks: scale 0, so logit 0 in any ggml type
        head_matrix = (rows, header.kind)

    def matrix(name: str, layer: int, rows: int, cols: int) -> tuple[Any, Any]:
        if layer < 0:
            return head_matrix
        return weights.matrix(rows, cols), weights.kind if quantized else None

    write_llama(
        path,
        embd=embd,
        ffn=ffn,
        heads=heads,
        layers=layers,
        vocab=vocab,
        matrix=matrix,
        experts=experts,
    )


class _Runner:
    """Loads a probe model and times its batch and its decode steps."""

    def __init__(self, threads: int, repack: bool, gpu: bool = False) -> None:
        import ctypes

        import llama_cpp

        self.llama = llama_cpp
        self.threads = threads
        self.repack = repack
        self.gpu = gpu
        """Every layer on the first GPU (else everything, batches included, on the CPU)."""
        self.decode_steps = _GPU_DECODE_STEPS if gpu else _DECODE_STEPS
        self._quiet = llama_cpp.llama_log_callback(lambda *_: None)
        llama_cpp.llama_log_set(self._quiet, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()

    def _load(self, path: Path) -> Any:
        llama = self.llama
        params = llama.llama_model_default_params()
        params.n_gpu_layers = 999 if self.gpu else 0
        params.use_extra_bufts = self.repack
        params.use_mmap = False  # weights in memory before the clock starts, no page faults
        model = llama.llama_model_load_from_file(str(path).encode(), params)
        if not model:
            raise RuntimeError(f"llama.cpp could not load {path.name}")
        return model

    def _context_params(self) -> Any:
        params = self.llama.llama_context_default_params()
        # On the CPU, batches stay on the CPU too (a GPU build sends large ones to the GPU).
        params.op_offload = params.offload_kqv = self.gpu
        return params

    def time(self, path: Path, late: int = 0) -> dict[str, float]:
        """Seconds of the best decode step (``decode_s``) and of the best batch of
        :data:`_BATCH` tokens (``batch_s``); with ``late``, also of a batch that starts at
        that position (``late_batch_s``: the attention over the tokens before it)."""
        from ..devices.synthetic import fill_batch

        llama = self.llama
        model = self._load(path)
        ctx_params = self._context_params()
        # (a GPU's first batch builds its pipelines: it runs one batch before the clock)
        warm = _BATCH if self.gpu else 0
        ctx_params.n_ctx = max(1 + warm + _BATCH * _BATCHES + self.decode_steps, late + _BATCH)
        ctx_params.n_batch = ctx_params.n_ubatch = _BATCH
        ctx_params.n_threads = ctx_params.n_threads_batch = self.threads
        ctx = llama.llama_init_from_model(model, ctx_params)
        if not ctx:
            llama.llama_model_free(model)
            raise RuntimeError("llama.cpp could not create the probe's context")
        batch = llama.llama_batch_init(_BATCH, 0, 1)

        def decode(start: int, count: int) -> float:
            fill_batch(batch, start, count)
            began = time.perf_counter()
            if llama.llama_decode(ctx, batch) != 0:
                raise RuntimeError("llama_decode failed in the speed probe")
            return time.perf_counter() - began

        try:
            decode(0, 1)  # the first step sets up the graph and touches every weight
            position = 1
            if warm:
                decode(position, warm)
                position += warm
            batches = []
            for _ in range(_BATCHES):
                batches.append(decode(position, _BATCH))
                position += _BATCH
            steps = []
            for _ in range(self.decode_steps):
                steps.append(decode(position, 1))
                position += 1
            timings = {"decode_s": min(steps), "batch_s": min(batches)}
            if late:
                while position < late:
                    count = min(_BATCH, late - position)
                    decode(position, count)
                    position += count
                timings["late_batch_s"] = decode(late, _BATCH)
            return timings
        finally:
            llama.llama_batch_free(batch)
            llama.llama_free(ctx)
            llama.llama_model_free(model)


def _runner_step(path: Path, threads: int, repack: bool) -> float:
    """Seconds the runner's engine spends per step outside ``llama_decode`` (planning and
    filling the batch, sampling with Ollama's default options, detokenizing, stop checks,
    handing the token over), generating on the tiny model ``path`` (its vocabulary is tiny:
    the sampler's share that grows with the vocabulary is measured by :meth:`_Runner.time_head`)."""
    import threading as threads_module

    from ..engine.jobs import GenerationJob
    from ..engine.loop import Engine
    from ..engine.model import LlamaModel
    from ..runner.protocol import DoneEvent, ErrorEvent, Event, RunnerConfig, SamplingOptions

    config = RunnerConfig(
        model_path=str(path),
        n_slots=1,
        n_ctx_per_slot=2 * _ENGINE_TOKENS + 64,
        n_threads=threads,
        fixed_threads=True,
        n_gpu_layers=0,
        cpu_repack=repack,
    )
    model = LlamaModel(config)
    engine = Engine(model)
    engine.start()
    done = threads_module.Event()

    def emit(event: Event) -> None:
        if isinstance(event, DoneEvent | ErrorEvent):
            done.set()

    best = float("inf")
    try:
        for turn in range(3):  # the first turn warms up
            clock = engine.time
            steps, decode, decodes = clock.steps, clock.decode, clock.decodes
            done.clear()
            options = SamplingOptions(num_predict=_ENGINE_TOKENS, seed=turn)
            engine.submit(GenerationJob(f"probe-{turn}", [1, 3 + turn, 4], options, None, emit))
            if not done.wait(60):
                raise RuntimeError("the engine did not finish the speed probe's generation")
            count = clock.decodes - decodes
            if turn and count:
                best = min(best, ((clock.steps - steps) - (clock.decode - decode)) / count)
    finally:
        engine.stop()
    return best


def _others_since(first: Any) -> float:
    """Cores other processes used on average since the reading ``first`` (0 when the
    readings cannot be taken)."""
    from ..devices.procfs import allowed_cpus, read_cpu

    last = read_cpu(allowed_cpus())
    if first is None or last is None or last.at <= first.at:
        return 0.0
    return max(0.0, ((last.busy - first.busy) - (last.own - first.own)) / (last.at - first.at))


def fixed_costs(runner: _Runner, workdir: Path, turns: int = _TINY_TURNS) -> dict[str, Any]:
    """The tiny models' best decode steps and batches (``tiny``), and on the CPU the runner's
    own work per step (``runner_step_s``)."""
    paths = []
    for layers in _TINY_LAYERS:
        paths.append(workdir / f"tiny-{layers}.gguf")
        _write_model(paths[-1], "Q8_0", _TINY_EMBD, _TINY_FFN, _TINY_HEADS, layers)
    # The two tiny models in turns, best of each: a busy moment hits one turn, not all.
    tiny = [{"decode_s": float("inf"), "batch_s": float("inf")} for _ in paths]
    for _ in range(turns):
        for best, path in zip(tiny, paths, strict=True):
            for key, value in runner.time(path).items():
                best[key] = min(best[key], value)
    report: dict[str, Any] = {}
    if not runner.gpu:  # the runner's own work per step, on the smaller tiny model
        report["runner_step_s"] = _runner_step(paths[0], runner.threads, runner.repack)
    for path in paths:
        path.unlink()
    return {
        **report,
        "tiny": {
            "layers": list(_TINY_LAYERS),
            "layer_bytes": _Weights("Q8_0").layer_bytes(_TINY_EMBD, _TINY_FFN),
            "layer_params": 4 * _TINY_EMBD**2 + 3 * _TINY_EMBD * _TINY_FFN,
            "layer_rows": 5 * _TINY_EMBD + 2 * _TINY_FFN,
            "decode_s": [t["decode_s"] for t in tiny],
            "batch_s": [t["batch_s"] for t in tiny],
        },
    }


def weight_types(
    runner: _Runner,
    workdir: Path,
    types: Sequence[str],
    target_bytes: int = _TARGET_BYTES,
    max_layers: int = _MAX_LAYERS,
) -> dict[str, Any]:
    """Each weight type's model: its best decode step and batch (``types``); one of them also
    a batch late in its context (``attention``)."""
    report: dict[str, Any] = {}
    measured: dict[str, Any] = {}
    for type_name in types:
        weights = _Weights(type_name)
        layer_bytes = weights.layer_bytes(_EMBD, _FFN)
        layers = max(1, min(max_layers, round(target_bytes / layer_bytes)))
        path = workdir / f"{type_name}.gguf"
        _write_model(path, type_name, _EMBD, _FFN, _HEADS, layers)
        # One type's model also times a batch late in its context: the attention's pace.
        late = _LATE if type_name == _ATTENTION_TYPE and not runner.gpu else 0
        timings = runner.time(path, late=late)
        path.unlink()
        if "late_batch_s" in timings:
            report["attention"] = {
                "layers": layers,
                "width": _EMBD,
                "batch_s": timings["batch_s"],
                "late_batch_s": timings["late_batch_s"],
                "positions": _LATE - 1,
            }
        measured[type_name] = {
            "layers": layers,
            "layer_bytes": layer_bytes,
            "layer_params": 4 * _EMBD**2 + 3 * _EMBD * _FFN,
            "layer_rows": 5 * _EMBD + 2 * _FFN,
            "decode_s": timings["decode_s"],
            "batch_s": timings["batch_s"],
            # its output head is wider than the tiny models' (whose is in the fixed cost)
            "output_bytes": _VOCAB * (_EMBD - _TINY_EMBD) * 4,
        }
    report["types"] = measured
    return report


def gpu_device(threads: int, workdir: Path) -> dict[str, Any]:
    """The first GPU llama.cpp lists, with every layer on it: the tiny models' steps and a few
    weight types' (``devices``: its name, description and whether it is a software device);
    nothing when there is none."""
    from ..devices.gpuinfo import is_software
    from ..memory.measure import llama_devices

    devices = llama_devices()
    if not devices:
        return {}
    device = devices[0]
    runner = _Runner(threads, repack=False, gpu=True)
    part: dict[str, Any] = {
        "description": device.description,
        "software": is_software(device.description),
    }
    part.update(fixed_costs(runner, workdir, turns=_GPU_TURNS))
    target = _SOFTWARE_TARGET_BYTES if part["software"] else _GPU_TARGET_BYTES
    part["types"] = weight_types(runner, workdir, _GPU_TYPES, target, _GPU_MAX_LAYERS)["types"]
    return {"devices": {device.name: part}}


# -- the CPU part: every figure read in interleaved rounds until they agree -----------------

# The decode models read at least this many times the last-level cache per step (a model that
# fits in it, or half fits, measures the cache: 23-127 GB/s for one type on a machine whose
# memory gives 30); when the cache size cannot be read, _UNREAD_WORKING_SET.
_CACHE_FACTOR = 4
_MIN_WORKING_SET, _UNREAD_WORKING_SET = 64 << 20, 256 << 20
_MAX_DECODE_LAYERS = 64
# Rounds: every figure once a round, the models interleaved, so that a busy moment spoils one
# round of each rather than all of one; at least _MIN_ROUNDS, until the best two rounds of
# every figure agree within _AGREE (or _AGREE_S, for timings too short for a share to mean
# anything), at most _MAX_ROUNDS or _ROUNDS_BUDGET_S seconds.
_MIN_ROUNDS, _MAX_ROUNDS, _ROUNDS_BUDGET_S = 3, 8, 25.0
_AGREE, _AGREE_S = 0.10, 20e-6
_ROUND_STEPS = 6
"""Decode steps a round times per model (its best counts)."""
_BANDWIDTH_PASSES = 8
# A batch is bound by arithmetic, not memory: its model is small (a round's batches are most
# of the probe's time), a layer or two of about this many bytes.
_BATCH_BYTES, _BATCH_LAYERS = 16 << 20, 2
# The sanity bounds, raw against raw: a decode step cannot read its weights faster than the
# memory gives (numpy's readers, as many as the decode threads), with this much room for the
# two readers' differences; a batch cannot multiply faster than the cores' arithmetic. One
# thread of llama.cpp's F32 decode streams 1.15-1.16x what one numpy reader does (AVX-512 EPYC,
# every probe): at 1.15 that refused true figures half the time; a step served from the cache
# reads several times the memory's figure, which 1.35 still refuses.
_BOUND_ROOM = 1.35


def last_level_cache(root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int | None:
    """Bytes of the largest data cache level of the first CPU, as the kernel lists it
    (``index*/level``, ``type``, ``size`` such as ``32768K``); None when it cannot be read."""
    found: tuple[int, int] | None = None
    for index in sorted(root.glob("index*")):
        try:
            if (index / "type").read_text().strip() == "Instruction":
                continue
            level = int((index / "level").read_text())
            text = (index / "size").read_text().strip().upper()
        except (OSError, ValueError):
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMGB")
        if not digits.isdigit():
            continue
        size = int(digits) * scale
        if found is None or (level, size) > found:
            found = (level, size)
    return found[1] if found is not None else None


def working_set(cache: int | None) -> int:
    """Bytes a decode model reads per step: several times the last-level cache."""
    if cache is None:
        return _UNREAD_WORKING_SET
    return max(_CACHE_FACTOR * cache, _MIN_WORKING_SET)


def peak_operations(threads: int, cpuinfo: Path = Path("/proc/cpuinfo")) -> float | None:
    """An upper bound on the operations per second ``threads`` cores can do (None: unknown):
    the clock (the highest ``cpu MHz`` listed, half as much again for a boost the kernel does
    not show) times the widest vector's int8 multiply-adds, two fused units, two operations
    each (ggml's quantized kernels multiply int8; floats do fewer)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    clocks = [float(line.split(":")[1]) for line in text.splitlines() if line.startswith("cpu MHz")]
    flags = next((line for line in text.splitlines() if line.startswith("flags")), "").split()
    if not clocks:
        return None
    lanes = 64 if "avx512f" in flags else 32 if "avx2" in flags else 16
    return threads * max(clocks) * 1e6 * 1.5 * lanes * 2 * 2


def agreeing(rounds: Sequence[float]) -> bool:
    """Whether the best two of a figure's rounds (seconds) agree: within :data:`_AGREE` of
    each other, or :data:`_AGREE_S` apart."""
    if len(rounds) < 2:
        return False
    first, second = sorted(rounds)[:2]
    return second <= first * (1 + _AGREE) or second - first <= _AGREE_S


class _Context:
    """A loaded model's llama.cpp context, timed again and again: each timing first keeps the
    KV cache to the position it starts at (dropping what is beyond, filling what is short)."""

    def __init__(self, runner: _Runner, model: Any, n_ctx: int) -> None:
        llama = runner.llama
        params = runner._context_params()
        params.n_ctx = n_ctx
        params.n_batch = params.n_ubatch = _BATCH
        params.n_threads = params.n_threads_batch = runner.threads
        self.llama = llama
        self.ctx = llama.llama_init_from_model(model, params)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create the probe's context")
        self.memory = llama.llama_get_memory(self.ctx)
        self.batch = llama.llama_batch_init(_BATCH, 0, 1)
        self.filled = 0

    def _decode(self, start: int, count: int, logits: bool = True, every: bool = False) -> float:
        from ..devices.synthetic import fill_batch

        fill_batch(self.batch, start, count)
        self.batch.logits[count - 1] = logits
        for index in range(count - 1 if every else 0):
            self.batch.logits[index] = True
        began = time.perf_counter()
        if self.llama.llama_decode(self.ctx, self.batch) != 0:
            raise RuntimeError("llama_decode failed in the speed probe")
        spent = time.perf_counter() - began
        self.filled = start + count
        return spent

    def at(self, position: int) -> None:
        """The KV cache holds exactly the positions before ``position``."""
        if self.filled > position:
            self.llama.llama_memory_seq_rm(self.memory, 0, position, -1)
            self.filled = position
        while self.filled < position:
            self._decode(self.filled, min(_BATCH, position - self.filled))

    def steps(self, count: int = _ROUND_STEPS, position: int = 0, logits: bool = True) -> float:
        """The median of ``count`` decode steps from ``position`` on (after one untimed step:
        the graph of a step is built and the weights touched): a generation runs at its
        steps' typical time, not at its fastest (the starter: 6.5 ms best, 7.0 ms median)."""
        self.at(position)
        self._decode(self.filled, 1, logits)
        return statistics.median(self._decode(self.filled, 1, logits) for _ in range(count))

    def prefill(self, position: int = 0, tokens: int = _BATCH) -> float:
        """One batch of ``tokens`` tokens from ``position`` on, with logits for every
        token: llama.cpp runs the last layer after its attention only for the tokens whose
        logits are asked for, which would leave out most of a small model's work."""
        self.at(position)
        return self._decode(position, tokens, every=True)

    def close(self) -> None:
        """Free the context (the model is its owner's)."""
        self.llama.llama_batch_free(self.batch)
        self.llama.llama_free(self.ctx)


class _Rounds:
    """The CPU figures: models loaded once, each figure read once a round (see
    :func:`cpu_figures`)."""

    def __init__(self, runner: _Runner) -> None:
        self.runner = runner
        self.models: list[Any] = []
        self.contexts: list[_Context] = []
        self.figures: dict[str, list[float]] = {}
        self.readers: list[tuple[str, Callable[[], float]]] = []

    def load(self, path: Path, n_ctx: int, contexts: int = 1) -> list[_Context]:
        """``path`` loaded (then deleted: its weights are in memory) with ``contexts``
        contexts."""
        model = self.runner._load(path)
        path.unlink()
        self.models.append(model)
        made = [_Context(self.runner, model, n_ctx) for _ in range(contexts)]
        self.contexts.extend(made)
        return made

    def read(self, name: str, reader: Callable[[], float]) -> None:
        """Time ``reader`` (seconds) once a round as the figure ``name``."""
        self.readers.append((name, reader))
        self.figures[name] = []

    def run(self) -> int:
        """Rounds until every figure agrees (or the limits); the number of rounds."""
        began = time.monotonic()
        budget = testhooks.probe_budget()
        budget = _ROUNDS_BUDGET_S if budget is None else budget
        done = 0
        while done < _MAX_ROUNDS:
            for name, reader in self.readers:
                self.figures[name].append(reader())
            done += 1
            settled = all(agreeing(values) for values in self.figures.values())
            if done >= _MIN_ROUNDS and (settled or time.monotonic() - began > budget):
                break
        return done

    def best(self, name: str) -> float:
        """A figure's fastest round."""
        return min(self.figures[name])

    def unsettled(self) -> dict[str, float]:
        """The figures whose best two rounds disagree: how far apart (a share)."""
        spread = {}
        for name, values in self.figures.items():
            if not agreeing(values):
                first, second = sorted(values)[:2]
                spread[name] = round(second / first - 1, 3)
        return spread

    def close(self) -> None:
        """Free every context and model."""
        for context in self.contexts:
            context.close()
        for model in self.models:
            self.runner.llama.llama_model_free(model)


def _memory_reader(threads: int, size: int) -> tuple[Callable[[], float], Callable[[], None]]:
    """A reader of ``size`` bytes of memory by ``threads`` threads at once (numpy's ``max``:
    ~70 GB/s a core from L2, so it waits for memory, not for its own arithmetic), the best of
    :data:`_BANDWIDTH_PASSES` passes in seconds; and what stops its threads."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    data = np.ones(size // 8, dtype=np.float64)
    parts = np.array_split(data, threads)
    pool = ThreadPoolExecutor(threads)

    def read() -> float:
        best = float("inf")
        for _ in range(_BANDWIDTH_PASSES):
            began = time.perf_counter()
            list(pool.map(np.max, parts))
            best = min(best, time.perf_counter() - began)
        return best

    return read, pool.shutdown


def cpu_figures(
    runner: _Runner, workdir: Path, types: Sequence[str], experts: Sequence[str] = ()
) -> dict[str, Any]:
    """Every CPU figure, read in interleaved rounds until they agree (see the constants
    above): the tiny models' steps and batches, each type's decode step (on a model several
    times the last-level cache) and batch, the attention's pace in a batch and in a decode
    step late in a context, the head model's steps and samplers, the memory's bandwidth, and
    the routed experts of ``experts``' types (:mod:`.experts`). The report says how many
    rounds it took, which figures did not agree, and what the sanity bounds refused."""
    began = time.monotonic()
    cache = last_level_cache()
    reads = working_set(cache)
    rounds = _Rounds(runner)
    report: dict[str, Any] = {"cache_bytes": cache, "working_set": reads}
    stop_reader = None
    try:
        tiny_paths = []
        for layers in _TINY_LAYERS:
            tiny_paths.append(workdir / f"tiny-{layers}.gguf")
            _write_model(tiny_paths[-1], "Q8_0", _TINY_EMBD, _TINY_FFN, _TINY_HEADS, layers)
        # the runner's own work per step, on the smaller tiny model (before it is loaded)
        report["runner_step_s"] = _runner_step(tiny_paths[0], runner.threads, runner.repack)
        for layers, path in zip(_TINY_LAYERS, tiny_paths, strict=True):
            (tiny,) = rounds.load(path, _BATCH + _ROUND_STEPS + 2)
            rounds.read(f"tiny{layers}.decode", tiny.steps)
            rounds.read(f"tiny{layers}.batch", tiny.prefill)
        shapes: dict[str, dict[str, int]] = {}
        for type_name in types:
            weights = _Weights(type_name)
            layer_bytes = weights.layer_bytes(_EMBD, _FFN)
            layers = max(1, min(_MAX_DECODE_LAYERS, -(-reads // layer_bytes)))
            batch_layers = max(1, min(_BATCH_LAYERS, round(_BATCH_BYTES / layer_bytes)))
            shapes[type_name] = {
                "layers": layers,
                "batch_layers": batch_layers,
                "layer_bytes": layer_bytes,
            }
            path = workdir / f"{type_name}-decode.gguf"
            _write_model(path, type_name, _EMBD, _FFN, _HEADS, layers)
            (decode,) = rounds.load(path, 2 * _ROUND_STEPS + 2)
            rounds.read(f"{type_name}.decode", decode.steps)
            path = workdir / f"{type_name}-batch.gguf"
            _write_model(path, type_name, _EMBD, _FFN, _HEADS, batch_layers)
            (batch,) = rounds.load(path, _BATCH + 2)
            rounds.read(f"{type_name}.batch", batch.prefill)
        # The attention's pace: a model of wide attention and a narrow FFN (its weights are
        # not what is timed), its batch and its steps early and late in a context (a context
        # of its own keeps the late positions from round to round).
        path = workdir / "attention.gguf"
        _write_model(path, _ATTENTION_TYPE, _EMBD, _ATTENTION_FFN, _HEADS, _ATTENTION_LAYERS)
        early, late = rounds.load(path, _LATE + _BATCH + 2 * _ROUND_STEPS + 2, contexts=2)
        rounds.read("attention.batch", early.prefill)
        rounds.read("attention.decode", early.steps)
        rounds.read("attention.late_batch", lambda: late.prefill(_LATE))
        rounds.read("attention.late_decode", lambda: late.steps(position=_LATE + _BATCH))
        vocab = _head_vocab(reads)
        path = workdir / "head.gguf"
        _write_model(path, "Q8_0", _HEAD_EMBD, 2 * _HEAD_EMBD, 4, 1, vocab, _HEAD_TYPE)
        (head,) = rounds.load(path, 4 * _ROUND_STEPS + 8)
        rounds.read("head.logits", lambda: head.steps(logits=True))
        rounds.read("head.plain", lambda: head.steps(logits=False))
        sampling = _Sampling(runner, rounds.models[-1], head, vocab)
        rounds.read("head.greedy", sampling.greedy)
        rounds.read("head.default", sampling.default)
        memory, stop_reader = _memory_reader(runner.threads, reads)
        rounds.read("memory", memory)
        expert_models.read_experts(rounds, workdir, experts, _write_experts)

        report["setup_s"] = round(time.monotonic() - began, 2)
        report["rounds"] = rounds.run()
        report["rounds_s"] = round(time.monotonic() - began - report["setup_s"], 2)
        sampling.close()
        best = rounds.best
        report["tiny"] = {
            "layers": list(_TINY_LAYERS),
            "layer_bytes": _Weights("Q8_0").layer_bytes(_TINY_EMBD, _TINY_FFN),
            "layer_params": 4 * _TINY_EMBD**2 + 3 * _TINY_EMBD * _TINY_FFN,
            "layer_rows": 5 * _TINY_EMBD + 2 * _TINY_FFN,
            "decode_s": [best(f"tiny{n}.decode") for n in _TINY_LAYERS],
            "batch_s": [best(f"tiny{n}.batch") for n in _TINY_LAYERS],
        }
        report["types"] = {
            name: {
                **shape,
                "layer_params": 4 * _EMBD**2 + 3 * _EMBD * _FFN,
                "layer_rows": 5 * _EMBD + 2 * _FFN,
                "decode_s": best(f"{name}.decode"),
                "batch_s": best(f"{name}.batch"),
                "output_bytes": _VOCAB * (_EMBD - _TINY_EMBD) * 4,
                # every token's logits in a batch: the head's work beyond the tiny models'
                "output_params": _VOCAB * (_EMBD - _TINY_EMBD),
            }
            for name, shape in shapes.items()
        }
        report["attention"] = {
            "layers": _ATTENTION_LAYERS,
            "width": _EMBD,
            "positions": _LATE - 1,
            "decode_positions": _LATE + _BATCH,
            "batch_s": best("attention.batch"),
            "late_batch_s": best("attention.late_batch"),
            "decode_s": best("attention.decode"),
            "late_decode_s": best("attention.late_decode"),
        }
        report["head"] = {
            "logits_s": best("head.logits"),
            "plain_s": best("head.plain"),
            "greedy_s": best("head.greedy"),
            "default_s": best("head.default"),
            "vocab": vocab,
            "embd": _HEAD_EMBD,
            "type": _HEAD_TYPE,
            "bytes": _Weights(_HEAD_TYPE).layer_bytes_of(vocab, _HEAD_EMBD),
        }
        report["bandwidth"] = reads / best("memory")
        report.update(_settled(rounds))
        report["experts"] = expert_models.expert_report(best, experts)
        report["peak_operations"] = peak_operations(runner.threads)
        report["refused"] = _bounds(report)
        return report
    finally:
        rounds.close()
        if stop_reader is not None:
            stop_reader()


def _settled(rounds: _Rounds) -> dict[str, Any]:
    """What did not agree, and every figure's spread (its best two rounds)."""
    return {
        "unsettled": rounds.unsettled(),
        "spreads": {
            name: round(sorted(values)[1] / sorted(values)[0] - 1, 3)
            for name, values in rounds.figures.items()
            if len(values) > 1
        },
    }


def _write_experts(path: Path, type_name: str, experts: int) -> None:
    embd, ffn = expert_models.EMBD, expert_models.FFN
    _write_model(
        path, type_name, embd, ffn, expert_models.HEADS, expert_models.LAYERS, experts=experts
    )


def expert_figures(runner: _Runner, workdir: Path, types: Sequence[str]) -> dict[str, Any]:
    """The routed experts of ``types`` alone, in rounds until they agree (a mixture-of-experts
    model priced after the first probe: the figures kept stay, these are added to them)."""
    rounds = _Rounds(runner)
    try:
        expert_models.read_experts(rounds, workdir, types, _write_experts)
        report: dict[str, Any] = {"rounds": rounds.run()}
        report.update(_settled(rounds))
        report["experts"] = expert_models.expert_report(rounds.best, types)
        return report
    finally:
        rounds.close()


def _head_vocab(reads: int) -> int:
    """Rows of the head model: its Q8_0 head reads at least ``reads`` bytes (a power of two,
    at least :data:`_HEAD_VOCAB`)."""
    row = _Weights(_HEAD_TYPE).layer_bytes_of(1, _HEAD_EMBD)
    vocab = _HEAD_VOCAB
    while vocab * row < reads:
        vocab *= 2
    return vocab


def _bounds(report: Mapping[str, Any]) -> list[str]:
    """The figures the sanity bounds refuse, raw against raw: a decode step that read its
    weights faster than the memory gives, a batch that multiplied faster than the cores can."""
    refused = []
    memory = float(report["bandwidth"]) * _BOUND_ROOM
    peak = report.get("peak_operations")
    batch = _BATCH
    for name, entry in report["types"].items():
        read = entry["layers"] * entry["layer_bytes"] / entry["decode_s"]
        if read > memory:
            refused.append(
                f"{name} decode read {read / 1e9:.1f} GB/s, above the memory's "
                f"{report['bandwidth'] / 1e9:.1f} GB/s"
            )
        work = 2 * batch * entry["batch_layers"] * entry["layer_params"] / entry["batch_s"]
        if peak and work > peak:
            refused.append(
                f"{name} prefill did {work / 1e9:.0f} GFLOP/s, above the cores' "
                f"{peak / 1e9:.0f} GFLOP/s"
            )
    return refused


class _Sampling:
    """The runner's samplers on the head model's logits: greedy (the largest logit) and
    Ollama's default options (penalties, top-k, top-p, temperature, a draw)."""

    def __init__(self, runner: _Runner, model: Any, head: _Context, vocab: int) -> None:
        from ..engine.sampling import Sampler
        from ..runner.protocol import SamplingOptions

        llama = runner.llama
        self.head = head
        chain = llama.llama_model_get_vocab(model)
        self._greedy = Sampler(chain, vocab, SamplingOptions(temperature=0), None, 64)
        self._default = Sampler(chain, vocab, SamplingOptions(seed=1), None, 64)

    def _time(self, sampler: Any) -> float:
        self.head.steps(count=1, logits=True)  # fresh logits
        best = float("inf")
        for _ in range(_ROUND_STEPS):
            began = time.perf_counter()
            sampler.sample(self.head.ctx, 0)
            best = min(best, time.perf_counter() - began)
        return best

    def greedy(self) -> float:
        """Seconds of the greedy sampler, best of a round."""
        return self._time(self._greedy)

    def default(self) -> float:
        """Seconds of the default sampler, best of a round."""
        return self._time(self._default)

    def close(self) -> None:
        """Free the samplers."""
        self._greedy.close()
        self._default.close()


def _probe(
    threads: int, repack: bool, workdir: Path, types: Sequence[str], experts: Sequence[str]
) -> dict[str, Any]:
    from ..devices.procfs import allowed_cpus, read_cpu

    began = read_cpu(allowed_cpus())
    runner = _Runner(threads, repack)
    report: dict[str, Any] = {"threads": threads, "repack": repack, "batch": _BATCH}
    if types:
        report.update(cpu_figures(runner, workdir, types, experts))
        report.update(gpu_device(threads, workdir))
    else:  # experts added to kept figures: nothing else is measured again
        report.update(expert_figures(runner, workdir, experts))
    # What else ran meanwhile: figures measured beside a busy program are not this machine's.
    report["others"] = round(_others_since(began), 3)
    return report


def main(argv: list[str] | None = None) -> int:
    """The child: ``--threads N --workdir DIR --types Q4_K,F16 [--experts Q4_K]
    [--no-repack]`` (``--types ''`` with ``--experts``: the experts alone)."""
    parser = argparse.ArgumentParser(prog="python -m localllm.daemon.speed.measure")
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--types", default=",".join(BASE_TYPES))
    parser.add_argument("--experts", default="", help="types of routed experts to time")
    parser.add_argument("--no-repack", action="store_true")
    args = parser.parse_args(argv)
    types = [t for t in args.types.split(",") if t]
    experts = [t for t in args.experts.split(",") if t]
    import gguf

    unknown = [t for t in {*types, *experts} if t not in gguf.GGMLQuantizationType.__members__]
    if unknown:
        print(f"unknown ggml types: {', '.join(unknown)}", file=sys.stderr)
        return 2
    report = _probe(max(1, args.threads), not args.no_repack, args.workdir, types, experts)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
