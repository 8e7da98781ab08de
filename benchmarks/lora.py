"""LoRA serving: 8 clients over two adapters on one base against 8 clients on one model, and
the memory of one shared runner against two runners of base + adapter.

One daemon serves SmolLM2-135M (the starter, ``repeat_penalty 1.0``) as three models: the base
(``bench-base``) and two models each with a LoRA adapter made here with ``gguf`` (rank 8 on the
attention and feed-forward weights, random, as ``tests/support/lora_support.py`` writes them).
Waves of 8 streaming clients on ``/api/generate``, each asking for ``--tokens`` greedy tokens
of its own prompt, in three scenarios, every scenario ``--repeat`` times, interleaved (the
order rotating):

* ``base``: 8 clients on the base model (no adapter: what one model serves);
* ``one``: 8 clients on the first adapter model (one adapter set: every step decodes all 8);
* ``two``: 4 clients on each adapter model at once (two adapter sets: llama.cpp applies
  adapters to a whole context, so the runner's steps alternate between the two sets).

Aggregate decode tokens/s of a wave: the tokens generated after each stream's first, over the
time from the wave's first token to its last. The ratios: ``two/base`` (target ≥ 0.8),
``two/one`` (the cost of alternating) and ``one/base`` (the cost of the adapter's own
matrices), each the mean of the same-repetition ratios, with their range.

Why steps alternate between sets (``--skip-raw`` to leave it out): a plain llama.cpp loop in
this process, no server, decoding 8 sequences of one token per step, the four ways interleaved
``--repeat`` times: ``raw_base`` (8 at once, no adapter), ``raw_one`` (8 at once, one adapter),
``raw_alternate`` (4 + 4, the context's adapters changed every step), ``raw_turns`` (4 + 4,
changed every 8 steps, as the runner does), ``raw_contexts`` (4 + 4, a context per adapter
set on the one model: no change ever, but a KV cache and compute buffers per set). Each is
printed as a ratio of ``raw_base``.

Memory (``--skip-memory`` to leave it out): the shared runner (8 slots) serving both adapter
models, against two daemons each serving one adapter model (4 slots each: the same KV cells in
all), i.e. two runners of base + adapter, each with the base weights. llama.cpp's
``llama-export-lora`` is not built here, so no merged GGUFs are compared: a merged model is as
large as its base, so two runners of base + adapter hold what two merged models would, plus
the adapters' few MB. Reported per runner process from ``/proc/PID/smaps_rollup``: RSS and PSS
(the latter splits pages two processes share: mapped weights of one file are shared by the
page cache, repacked ones are not), and the memory plan's size from ``/api/ps``.

Usage::

    python benchmarks/lora.py [--threads N] [--tokens 64] [--repeat 3] [--skip-memory]
        [--skip-raw] [--raw-threads 1] [--temperature 0]

``--temperature T`` makes the clients sample without a seed of their own. Under an adapter the
runner decodes each reproducible request (greedy, or with a seed) in a pass of its own, so
that its answer is the one it gives alone (``daemon/engine/batching.py``); sampling clients
stay in one pass: greedy and sampling waves measure the two paths.

The machine is shared and noisy: read the ratios (same repetition, interleaved), not the
absolute rates. The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from _daemon import daemon_env, start_daemon, stop, wait_http

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
from lora_support import write_lora_gguf

from localllm.daemon.devices.cpu import default_threads
from localllm.daemon.lora.adapters import TURN_STEPS
from localllm.starter import starter_gguf_path

TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
CLIENTS = 8


def _prompt(client: int) -> str:
    return f"Client {client} writes a long story about the number {client * 37}. Once upon a time"


async def _stream(
    http: httpx.AsyncClient, model: str, prompt: str, tokens: int, temperature: float
) -> dict[str, Any]:
    options = {"temperature": temperature, "num_predict": tokens, "repeat_penalty": 1.0}
    body = {"model": model, "prompt": prompt, "raw": True, "options": options}
    first = 0.0
    async with http.stream("POST", "/api/generate", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line:
                continue
            chunk = json.loads(line)
            if "error" in chunk:
                raise RuntimeError(chunk["error"])
            if not first and chunk.get("response"):
                first = time.perf_counter()
            if chunk.get("done"):
                return {"first": first, "end": time.perf_counter(), "tokens": chunk["eval_count"]}
    raise RuntimeError("the stream ended without its final chunk")


async def _wave(url: str, models: list[str], tokens: int, temperature: float = 0.0) -> float:
    """Aggregate decode tokens/s of one wave of clients (``models[i]`` for client i)."""
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        runs = await asyncio.gather(
            *(_stream(http, m, _prompt(i), tokens, temperature) for i, m in enumerate(models))
        )
    start = min(r["first"] for r in runs if r["first"])
    end = max(r["end"] for r in runs)
    decoded = sum(max(r["tokens"] - 1, 0) for r in runs)
    return decoded / max(end - start, 1e-9)


def _create(url: str, name: str, body: dict[str, Any]) -> None:
    response = httpx.post(f"{url}/api/create", json={"model": name, **body}, timeout=600)
    response.raise_for_status()
    if "error" in response.text:
        raise RuntimeError(response.text)


def _daemon(home: Path, threads: int, slots: int) -> tuple[Any, str]:
    env, url = daemon_env(
        home,
        num_parallel=slots,
        num_threads=threads,
        context_length=1024,
        keep_alive=-1,
        max_loaded_models=3,
        kv_cache_ram=0,
        kv_cache_disk=0,
    )
    process = start_daemon(env)
    wait_http(url, process, 180, "/api/version")
    return process, url


def _models(url: str, adapters: list[Path]) -> None:
    _create(
        url, "bench-base", {"from": str(starter_gguf_path()), "parameters": {"repeat_penalty": 1.0}}
    )
    for name, adapter in zip(("bench-a", "bench-b"), adapters, strict=True):
        _create(url, name, {"from": "bench-base", "adapters": {adapter.name: str(adapter)}})


def _process_memory(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("Rss", "Pss"):
            fields[key.lower()] = int(rest.split()[0]) * 1024
    return fields


def _runners(url: str) -> dict[int, dict[str, int]]:
    """Each runner process of a daemon: its RSS, PSS and planned size (ps' sizes added)."""
    found: dict[int, dict[str, int]] = {}
    for entry in httpx.get(f"{url}/api/ps", timeout=30).json()["models"]:
        pid = int(entry["runner_pid"])
        record = found.setdefault(pid, {"planned": 0, **_process_memory(pid)})
        record["planned"] += int(entry["size"])
    return found


def raw_loops(adapters: list[Path], threads: int, repeat: int, steps: int = 24) -> dict[str, Any]:
    """Decode tokens/s of the plain llama.cpp loops (see the module's docstring), the median
    of each, and each median as a ratio of ``raw_base``'s."""
    import ctypes

    import llama_cpp as ll

    from localllm.daemon.devices import cpu

    quiet = ll.llama_log_callback(lambda level, text, data: None)
    ll.llama_log_set(quiet, ctypes.c_void_p(0))  # its debug lines would be most of the time
    ll.llama_backend_init()
    model = ll.llama_model_load_from_file(str(starter_gguf_path()).encode(), cpu.model_params())
    loras = [ll.llama_adapter_lora_init(model, str(p).encode()) for p in adapters]

    def context(sequences: int, lora: Any = None) -> Any:
        params = ll.llama_context_default_params()
        params.n_ctx, params.n_seq_max = 1024 * sequences, sequences
        params.n_batch = params.n_ubatch = 512
        params.n_threads = params.n_threads_batch = threads
        params.kv_unified, params.no_perf = False, True
        ctx = ll.llama_init_from_model(model, params)
        use(ctx, lora)
        return ctx

    def use(ctx: Any, lora: Any) -> None:
        if lora is None:
            ll.llama_set_adapters_lora(ctx, None, 0, None)
            return
        pointers = (ll.llama_adapter_lora_p_ctypes * 1)(lora)
        ll.llama_set_adapters_lora(ctx, pointers, 1, (ctypes.c_float * 1)(1.0))

    batch = ll.llama_batch_init(512, 0, 8)

    def decode(ctx: Any, sequences: range, position: int) -> None:
        batch.n_tokens = len(sequences)
        for i, seq in enumerate(sequences):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = 100 + seq, position, 1
            batch.seq_id[i][0], batch.logits[i] = seq, True
        if ll.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")

    shared, per_set = context(8), [context(4, lora) for lora in loras]

    def together(lora: Any) -> float:
        """8 sequences in one context, every step all of them."""
        ll.llama_memory_clear(ll.llama_get_memory(shared), True)
        use(shared, lora)
        started = time.perf_counter()
        for position in range(steps):
            decode(shared, range(8), position)
        return 8 * steps / (time.perf_counter() - started)

    def alternate(turn: int) -> float:
        """4 + 4 in one context, its adapters changed every ``turn`` steps."""
        ll.llama_memory_clear(ll.llama_get_memory(shared), True)
        started = time.perf_counter()
        for first in range(0, steps, turn):
            for lora, sequences in zip(loras, (range(4), range(4, 8)), strict=True):
                use(shared, lora)
                for position in range(first, min(first + turn, steps)):
                    decode(shared, sequences, position)
        return 8 * steps / (time.perf_counter() - started)

    def contexts() -> float:
        """4 + 4, a context per adapter set: no change ever."""
        for ctx in per_set:
            ll.llama_memory_clear(ll.llama_get_memory(ctx), True)
        started = time.perf_counter()
        for position in range(steps):
            for ctx in per_set:
                decode(ctx, range(4), position)
        return 8 * steps / (time.perf_counter() - started)

    ways = {
        "raw_base": lambda: together(None),
        "raw_one": lambda: together(loras[0]),
        "raw_alternate": lambda: alternate(1),
        "raw_turns": lambda: alternate(TURN_STEPS),
        "raw_contexts": contexts,
    }
    rates: dict[str, list[float]] = {name: [] for name in ways}
    for way in ways.values():
        way()  # warm up: every graph built once
    for repetition in range(repeat):
        names = list(ways)
        for name in names[repetition % len(names) :] + names[: repetition % len(names)]:
            rates[name].append(ways[name]())
    for ctx in (shared, *per_set):
        ll.llama_free(ctx)
    ll.llama_batch_free(batch)
    ll.llama_model_free(model)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    return {
        "tps": medians,
        "vs_base": {name: value / medians["raw_base"] for name, value in medians.items()},
    }


def _ratio(pairs: list[tuple[float, float]]) -> dict[str, float]:
    values = [a / b for a, b in pairs if b > 0]
    return {"mean": statistics.mean(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=default_threads())
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--temperature", type=float, default=0.0, help="clients sample, no seed (default 0: greedy)"
    )
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-raw", action="store_true")
    parser.add_argument(
        "--raw-threads", type=int, default=1, help="threads of the plain loops (default 1)"
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="localllm-bench-lora-"))
    base = starter_gguf_path()
    adapters = [write_lora_gguf(work / f"{n}.gguf", base, seed=n, targets=TARGETS) for n in (1, 2)]
    print(f"adapters: {adapters[0].stat().st_size >> 20} MiB each, rank 8 on {', '.join(TARGETS)}")
    process, url = _daemon(work / "shared", args.threads, CLIENTS)
    scenarios = {
        "base": ["bench-base"] * CLIENTS,
        "one": ["bench-a"] * CLIENTS,
        "two": ["bench-a", "bench-b"] * (CLIENTS // 2),
    }
    rates: dict[str, list[float]] = {name: [] for name in scenarios}
    try:
        _models(url, adapters)
        asyncio.run(_wave(url, ["bench-base", "bench-a", "bench-b"], 8))  # load, warm up
        names = list(scenarios)
        for repetition in range(args.repeat):
            order = names[repetition % 3 :] + names[: repetition % 3]
            for name in order:
                rate = asyncio.run(_wave(url, scenarios[name], args.tokens, args.temperature))
                rates[name].append(rate)
                print(f"repetition {repetition + 1} {name:4}: {rate:7.1f} tok/s aggregate decode")
        switches = httpx.get(f"{url}/api/ps", timeout=30).json()
        shared = {} if args.skip_memory else _runners(url)
    finally:
        stop(process)
    result: dict[str, Any] = {
        "threads": args.threads,
        "tokens": args.tokens,
        "rates": rates,
        "two_vs_base": _ratio(list(zip(rates["two"], rates["base"], strict=True))),
        "two_vs_one": _ratio(list(zip(rates["two"], rates["one"], strict=True))),
        "one_vs_base": _ratio(list(zip(rates["one"], rates["base"], strict=True))),
        "runners_shared": len({m["runner_pid"] for m in switches["models"]}),
    }
    for key in ("two_vs_base", "two_vs_one", "one_vs_base"):
        r = result[key]
        print(f"{key}: {r['mean']:.3f} (range {r['min']:.3f}-{r['max']:.3f})")
    if not args.skip_memory:
        separate: dict[int, dict[str, int]] = {}
        daemons = []
        try:
            for name, adapter in zip(("bench-a", "bench-b"), adapters, strict=True):
                proc, other = _daemon(work / name, args.threads, CLIENTS // 2)
                daemons.append(proc)
                _models(other, [adapter, adapter])
                asyncio.run(_wave(other, [name], 4))
                separate.update(_runners(other))
        finally:
            for proc in daemons:
                stop(proc)
        one = list(shared.values())
        result["memory"] = {
            "shared_runner": one,
            "separate_runners": list(separate.values()),
        }
        for key in ("rss", "pss", "planned"):
            together = sum(r.get(key, 0) for r in one)
            apart = sum(r.get(key, 0) for r in separate.values())
            result["memory"][f"{key}_shared_vs_separate"] = together / apart if apart else None
            print(f"{key}: one shared runner {together >> 20} MiB, two runners {apart >> 20} MiB")
    if not args.skip_raw:
        result["raw"] = raw_loops(adapters, args.raw_threads, max(args.repeat, 3))
        for name, ratio in result["raw"]["vs_base"].items():
            print(f"{name:14}: {result['raw']['tps'][name]:7.1f} tok/s, {ratio:.3f} of raw_base")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
