"""LoRA adapters in the runner: loaded once on the base model, applied to a step's batch by
adapter set.

Every model sharing a base GGUF is served by one runner, its weights loaded once; each request
names the adapters it runs with (:class:`~.protocol.AdapterUse`: a digest and a scale). But
llama.cpp applies adapters to a whole context (``llama_set_adapters_lora``), never to one
sequence of a batch, so requests of different adapter sets cannot share a decode. Two ways
were open: one context whose adapters change between steps, or a context per adapter set on
the shared model. This runner does the first:

* each step decodes the slots of one adapter set (a *group*), the groups with work taking
  turns (:class:`StepGroups`) of up to :data:`TURN_STEPS` steps or :data:`TURN_SECONDS`, so
  every request advances at the same pace on average and a request alone in its group is
  never starved by a crowded one;
* the KV cache, its slots, the batch and the compute buffers stay one, sized once by the
  memory plan; a context per set would need its own KV cache and compute buffers for each
  set that requests may make up (a request may rescale adapters: any set at all);
* a change of adapters makes llama.cpp reserve its scheduler again at the next decode (three
  graph builds) and lose the graph it reuses between steps of one shape: a turn of several
  steps pays that once. ``benchmarks/lora.py`` measures the turns against one model serving
  the same clients, and against a context per set in a plain llama.cpp loop.

A request's adapter set is also part of every cache key: the cells a slot holds were computed
with its set (:attr:`.slots.Slot.adapters`), and prefixes are shared between slots, restored
from the RAM and disk tiers, or waited for only within one set. The draft model of
speculative decoding runs without adapters, so its cells depend on the tokens alone; the
target verifies every draft with the request's own adapters.

Everything here runs on the engine thread; :class:`~.adapterset.AdapterSet`, the value a job
carries, is in its own module (jobs and slots need it without the engine's side).
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import llama_cpp

from ..engine.slots import Slot, SlotState
from ..runner.protocol import AdapterFile, AdapterStats
from .adapterset import NO_ADAPTERS, AdapterLoadError, AdapterSet

if TYPE_CHECKING:
    from ..engine.model import LlamaModel

__all__ = ["TURN_SECONDS", "TURN_STEPS", "Adapters", "StepGroups", "applying"]

log = logging.getLogger("localllm.runner.adapters")

TURN_STEPS = 8
"""Most steps an adapter set runs in a row while another set has work. On SmolLM2-135M (one
thread, 8 sequences over two sets, plain llama.cpp loops on a loaded 2-core machine, three
runs: noisy) switching every step kept 0.63-0.76 of one set's decode rate, turns of 8 steps
0.69-0.77, a context per set 0.80-0.86 (``benchmarks/lora.py``)."""
TURN_SECONDS = 0.2
"""Longest turn in time (a large model's steps are long: the other set waits at most this)."""


@dataclass
class _Loaded:
    file: AdapterFile
    pointer: Any  # llama.cpp's llama_adapter_lora *, freed with the model
    size: int
    alpha: float
    requests: int = 0


class Adapters:
    """The adapters loaded on a model, and the set each of its contexts runs with."""

    def __init__(self, model: LlamaModel) -> None:
        self.model = model
        self.loaded: dict[str, _Loaded] = {}
        """Adapters by digest, in load order."""
        self._applied: dict[int, AdapterSet] = {}
        self.switches = 0
        """Decodes that ran with another adapter set than their context's previous one."""

    def load(self, files: Sequence[AdapterFile]) -> list[AdapterStats]:
        """Load the adapters not loaded yet; raises :class:`AdapterLoadError` naming the one
        llama.cpp refused (those before it stay loaded)."""
        for file in files:
            if file.digest in self.loaded:
                continue
            pointer = llama_cpp.llama_adapter_lora_init(self.model.model, file.path.encode())
            if not pointer:
                raise AdapterLoadError(
                    f"llama.cpp could not load adapter {file.digest} ({file.path}); see the "
                    "runner log"
                )
            size, alpha = _describe(pointer, file.path)
            self.loaded[file.digest] = _Loaded(file, pointer, size, alpha)
            log.info("loaded adapter %s (%d bytes, alpha %g)", file.digest, size, alpha)
        return self.stats(())

    def check(self, adapters: AdapterSet) -> None:
        """Raise :class:`AdapterLoadError` unless every adapter of the set is loaded."""
        for digest, _ in adapters.uses:
            if digest not in self.loaded:
                raise AdapterLoadError(f"adapter {digest} is not loaded in this runner")

    def apply(self, ctx: llama_cpp.llama_context_p, adapters: AdapterSet) -> None:
        """Run ``ctx``'s next decodes with ``adapters`` (nothing to do when it does already)."""
        address = ctypes.cast(ctx, ctypes.c_void_p).value or 0
        if self._applied.get(address, NO_ADAPTERS) == adapters:
            return
        count = len(adapters.uses)
        pointers = (llama_cpp.llama_adapter_lora_p_ctypes * max(count, 1))()
        scales = (ctypes.c_float * max(count, 1))()
        for i, (digest, scale) in enumerate(adapters.uses):
            pointers[i] = self.loaded[digest].pointer
            scales[i] = scale
        if count:
            llama_cpp.llama_set_adapters_lora(ctx, pointers, count, scales)
        else:
            llama_cpp.llama_set_adapters_lora(ctx, None, 0, None)
        self._applied[address] = adapters
        self.switches += 1

    def started(self, adapters: AdapterSet) -> None:
        """A request with ``adapters`` got a slot (for the per-adapter request counts)."""
        for digest, _ in adapters.uses:
            self.loaded[digest].requests += 1

    def stats(self, slots: Iterable[Slot]) -> list[AdapterStats]:
        """Each loaded adapter with its size and the slots using it now."""
        using: dict[str, int] = {}
        for slot in slots:
            job = slot.job
            if job is not None:
                for digest, _ in job.adapters.uses:
                    using[digest] = using.get(digest, 0) + 1
        return [
            AdapterStats(
                digest=digest,
                size=item.size,
                alpha=item.alpha,
                slots=using.get(digest, 0),
                requests_total=item.requests,
            )
            for digest, item in self.loaded.items()
        ]


def _describe(pointer: Any, path: str) -> tuple[int, float]:
    """(bytes of tensor data, alpha) of a loaded adapter: alpha from llama.cpp's own copy of
    the metadata; the size from the file's tensor headers (what llama.cpp allocates)."""
    from localllm.gguf_info import inspect_gguf

    buffer = ctypes.create_string_buffer(64)
    alpha = 0.0
    if llama_cpp.llama_adapter_meta_val_str(pointer, b"adapter.lora.alpha", buffer, 64) > 0:
        try:
            alpha = float(buffer.value.decode())
        except ValueError:
            alpha = 0.0
    try:
        size = sum(t.n_bytes for t in inspect_gguf(path).tensors)
    except Exception:  # the size is a report: never fail a load over it
        size = 0
    return size, alpha


class StepGroups:
    """Which slots the next step decodes: all of them while one adapter set has work, else
    the slots of one set, the sets taking turns in key order (a turn: up to
    :data:`TURN_STEPS` steps and :data:`TURN_SECONDS`)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._key: str | None = None
        self._steps = 0
        self._since = 0.0

    def pick(self, slots: Sequence[Slot]) -> tuple[Sequence[Slot], AdapterSet]:
        """This step's slots and the adapter set they run with."""
        sets: dict[str, AdapterSet] = {}
        for slot in slots:
            job = slot.job
            if job is not None and (slot.decoding or slot.state is SlotState.PREFILLING):
                sets.setdefault(job.adapters.key, job.adapters)
        if len(sets) <= 1:
            self._key = None
            return slots, next(iter(sets.values()), NO_ADAPTERS)
        now = self._clock()
        turn_over = self._steps >= TURN_STEPS or now - self._since >= TURN_SECONDS
        if self._key not in sets or turn_over:
            keys = sorted(sets)
            later = [key for key in keys if self._key is not None and key > self._key]
            self._key, self._steps, self._since = (later or keys)[0], 0, now
        key = self._key
        assert key is not None
        self._steps += 1
        group = [s for s in slots if s.job is not None and s.job.adapters.key == key]
        return group, sets[key]


def applying(adapters: Adapters, aset: AdapterSet) -> Callable[[llama_cpp.llama_context_p], None]:
    """A callback that runs a context (an embedding one) with ``aset``."""
    return lambda ctx: adapters.apply(ctx, aset)
