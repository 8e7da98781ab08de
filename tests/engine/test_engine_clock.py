"""The engine's timings stay true on an asynchronous backend: llama_decode there returns once
the work is queued, so every clock the engine reads after a decode must come after
llama_synchronize (issue 47: on lavapipe a 63-token prompt reported 0.05 s of prefill in a
request of 8.76 s). The CPU backend finishes inside llama_decode, so here llama.cpp's two
calls are watched instead: a decode leaves work outstanding until a synchronize, and no
engine clock may be read in between. The same check on a real device is in test_gpu.py."""

from __future__ import annotations

import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import llama_cpp
import pytest
from runner_harness import greedy
from tiny_gguf import write_tiny_gguf

from localllm.daemon.engine import loop
from localllm.daemon.engine.jobs import GenerationJob
from localllm.daemon.engine.loop import Engine
from localllm.daemon.engine.model import LlamaModel
from localllm.daemon.runner.protocol import DoneEvent, ErrorEvent, Event, RunnerConfig


def test_no_engine_clock_is_read_while_a_decode_may_still_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_tiny_gguf(tmp_path / "tiny.gguf", never_ends=True)
    model = LlamaModel(
        RunnerConfig(model_path=str(path), n_slots=2, n_ctx_per_slot=256, n_threads=1)
    )
    outstanding = [False]  # a decode the device may still be running
    decodes: list[int] = []
    early_reads: list[str] = []
    real_decode, real_synchronize = llama_cpp.llama_decode, llama_cpp.llama_synchronize

    def decode(ctx: Any, batch: Any) -> int:
        status = real_decode(ctx, batch)
        outstanding[0] = True
        decodes.append(batch.n_tokens)
        return status

    def synchronize(ctx: Any) -> None:
        real_synchronize(ctx)
        outstanding[0] = False

    def perf_counter() -> float:
        if outstanding[0]:
            frame = sys._getframe(1)
            early_reads.append(f"{frame.f_code.co_name}:{frame.f_lineno}")
        return time.perf_counter()

    monkeypatch.setattr(llama_cpp, "llama_decode", decode)
    monkeypatch.setattr(llama_cpp, "llama_synchronize", synchronize)
    monkeypatch.setattr(loop, "time", types.SimpleNamespace(perf_counter=perf_counter))
    engine = Engine(model)
    done: list[Event] = []
    finished = threading.Semaphore(0)

    def emit(event: Event) -> None:
        if isinstance(event, DoneEvent | ErrorEvent):
            done.append(event)
            finished.release()

    prompt = model.tokenize("a prompt of a few dozen tokens, " * 6, add_special=True)
    engine.start()
    try:
        # Two at once (a prefill beside a decode), then one alone.
        for n in range(2):
            engine.submit(GenerationJob(f"j{n}", prompt[n:], greedy(num_predict=6), None, emit))
        assert finished.acquire(timeout=120) and finished.acquire(timeout=120)
        engine.submit(GenerationJob("j2", prompt[:9], greedy(num_predict=3), None, emit))
        assert finished.acquire(timeout=120)
    finally:
        engine.stop()
    assert all(isinstance(event, DoneEvent) for event in done)
    assert len(decodes) >= 8 and max(decodes) > 1  # prefills and decodes were watched
    assert not early_reads, f"clock read before the device finished, at {early_reads}"
