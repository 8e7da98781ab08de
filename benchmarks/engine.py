"""Engine benchmark: the runner against a plain llama.cpp loop, in one run, same threads.

    python benchmarks/engine.py [--model PATH] [--threads N] [--tokens 128]
                                [--batched-bench PATH]

Measures on SmolLM2-135M (the bundled starter model by default):

* single-stream decode tokens/s: raw loop vs runner;
* aggregate decode tokens/s at 4 and 8 concurrent streams: raw batched loop vs runner;
* prefill tokens/s on a 512-token prompt: raw vs runner;
* TTFT of a cold ~1,000-token prompt, of the same prefix when it is already cached, and the
  worst TTFT of 4 simultaneous cold requests that share a ~1,000-token prefix;
* decode and prefill of one stream after 20 distinct long chats went idle, relative to a
  fresh runner up at the same time, measured in turns (with a KV stream per slot, idle
  prefixes cost an active stream nothing);
* TTFT of a ~1,500-token system prompt after a runner restart (restored from the disk tier),
  next to the cold TTFT of the same prompt.

With ``--batched-bench PATH`` (a ``llama-batched-bench`` binary, e.g. built from the llama.cpp
vendored in llama-cpp-python: ``cmake -B build -DLLAMA_CURL=OFF && cmake --build build --target
llama-batched-bench``), llama.cpp's own batched decode benchmark runs at the same stream counts,
threads, context and generated tokens (32-token prompts, one KV stream per sequence, as
llama-server keeps them), interleaved with the other two sides: the real limit of this build
on this machine (``bench_*_tps`` and ``ratio_*_vs_bench``). It is never needed otherwise.

The "raw" side is the least Python one can write on llama-cpp-python's low-level API: one
batch, llama_decode, a greedy sampler, no detokenization, no IPC. The runner side goes through
the runner process and its socket protocol, as the daemon does. Each pair runs back to back
and each figure is the best of a few repetitions, because this machine is shared and noisy.
The last line printed is one JSON object with all figures and the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import llama_cpp
from _daemon import model_parser, model_path, runner_process

from localllm.daemon.engine.model import default_threads, route_llama_log
from localllm.daemon.runner import (
    GenerationRequest,
    RunnerClient,
    RunnerConfig,
    SamplingOptions,
    TokenChunk,
    cpu,
)

_WORD_TEXT = (
    "sky blue light river stone garden window music paper table winter summer mountain "
    "ocean forest city road bridge castle dragon robot planet silver golden quiet bright "
    "ancient modern gentle wild simple clever history science language number story"
)
WORDS = _WORD_TEXT.split()
STORY = "Write a long, detailed story about a traveller who crosses a great desert."


def chat_text(text: str) -> str:
    """``text`` as the user's turn of a ChatML chat, the assistant's turn opened: the same
    tokens on both sides (the runner's own rendering of SmolLM2's template adds a 21-token
    default system prompt, which would make the engine's sequences longer than the raw
    loop's and llama-batched-bench's)."""
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


def words(count: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(count))


class RawLlama:
    """A plain low-level llama.cpp loop: the baseline."""

    def __init__(self, path: str, threads: int, n_seq: int, n_ctx_per_seq: int) -> None:
        llama_cpp.llama_backend_init()
        self.model = llama_cpp.llama_model_load_from_file(path.encode(), cpu.model_params())
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_seq * n_ctx_per_seq
        params.n_batch = params.n_ubatch = 512
        params.n_seq_max = n_seq
        params.n_threads = params.n_threads_batch = threads
        params.kv_unified = False  # a KV stream per sequence, as the runner keeps them
        self.ctx = llama_cpp.llama_init_from_model(self.model, params)
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.batch = llama_cpp.llama_batch_init(512, 0, n_seq)
        self.sampler = llama_cpp.llama_sampler_chain_init(
            llama_cpp.llama_sampler_chain_default_params()
        )
        llama_cpp.llama_sampler_chain_add(self.sampler, llama_cpp.llama_sampler_init_greedy())

    def tokenize(self, text: str) -> list[int]:
        data = text.encode()
        buffer = (llama_cpp.llama_token * (len(data) + 8))()
        count = llama_cpp.llama_tokenize(
            self.vocab, data, len(data), buffer, len(buffer), True, True
        )
        return list(buffer[:count])

    def detokenize(self, tokens: list[int]) -> str:
        buffer = ctypes.create_string_buffer(256)
        pieces = []
        for token in tokens:
            count = llama_cpp.llama_token_to_piece(self.vocab, token, buffer, len(buffer), 0, False)
            pieces.append(buffer.raw[:count])
        return b"".join(pieces).decode("utf-8", errors="replace")

    def chat_tokens(self, text: str) -> list[int]:
        return self.tokenize(chat_text(text))

    def _fill(self, items: list[tuple[int, int, int, bool]]) -> None:
        b = self.batch
        for i, (token, pos, seq, logits) in enumerate(items):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, pos, 1, logits
            b.seq_id[i][0] = seq
        b.n_tokens = len(items)
        assert llama_cpp.llama_decode(self.ctx, b) == 0

    def clear(self) -> None:
        llama_cpp.llama_memory_clear(self.memory, True)

    def prefill_seconds(self, tokens: list[int]) -> float:
        self.clear()
        started = time.perf_counter()
        self._fill([(t, i, 0, i == len(tokens) - 1) for i, t in enumerate(tokens)])
        return time.perf_counter() - started

    def decode(self, prompts: list[list[int]], max_tokens: int) -> tuple[int, float]:
        """Greedy-decode all prompts as a batch; (tokens generated, seconds of decoding)."""
        self.clear()
        items = [(t, i, s, i == len(p) - 1) for s, p in enumerate(prompts) for i, t in enumerate(p)]
        self._fill(items)
        last_index = {}
        index = 0
        for s, p in enumerate(prompts):
            index += len(p)
            last_index[s] = index - 1
        positions = {s: len(p) for s, p in enumerate(prompts)}
        pending = {
            s: llama_cpp.llama_sampler_sample(self.sampler, self.ctx, last_index[s])
            for s in positions
        }
        generated = len(pending)
        started = time.perf_counter()
        for _ in range(max_tokens - 1):
            live = [
                s for s, t in pending.items() if not llama_cpp.llama_vocab_is_eog(self.vocab, t)
            ]
            if not live:
                break
            self._fill([(pending[s], positions[s], s, True) for s in live])
            for i, s in enumerate(live):
                positions[s] += 1
                pending[s] = llama_cpp.llama_sampler_sample(self.sampler, self.ctx, i)
            generated += len(live)
        return generated - len(prompts), time.perf_counter() - started


async def runner_decode(
    client: RunnerClient, texts: list[str], max_tokens: int
) -> tuple[int, float]:
    """Concurrent greedy chats, as the raw loop's prompts (:func:`chat_text`); (tokens after
    each stream's first, seconds of the decode phase)."""
    options = SamplingOptions(temperature=0, num_predict=max_tokens, repeat_penalty=1.0)
    return await timed_decode(
        client,
        [
            GenerationRequest(id="", prompt=chat_text(text), raw=True, options=options)
            for text in texts
        ],
    )


async def timed_decode(
    client: RunnerClient, requests: list[GenerationRequest]
) -> tuple[int, float]:
    """``requests`` all at once; (tokens after each stream's first, seconds from the last
    stream's first token to the last stream's end: the phase where all of them decode)."""
    firsts: list[float] = []
    lasts: list[float] = []
    counts: list[int] = []

    async def one(request: GenerationRequest) -> None:
        first = 0.0
        async for event in client.generate(request):
            if isinstance(event, TokenChunk):
                first = first or time.perf_counter()
            else:
                lasts.append(time.perf_counter())
                counts.append(event.timings.completion_tokens - 1)
        firsts.append(first)

    await asyncio.gather(*(one(request) for request in requests))
    return sum(counts), max(lasts) - max(firsts)


async def runner_ttft(client: RunnerClient, prompts: list[str]) -> list[float]:
    """Time to first token (ms, client side) of simultaneous raw prompts."""

    async def one(prompt: str) -> float:
        started = time.perf_counter()
        request = GenerationRequest(
            id="", prompt=prompt, raw=True, options=SamplingOptions(temperature=0, num_predict=2)
        )
        ttft = 0.0
        async for _event in client.generate(request):
            ttft = ttft or (time.perf_counter() - started) * 1000
        return ttft

    return list(await asyncio.gather(*(one(p) for p in prompts)))


async def prefill_rates(
    raw: RawLlama, client: RunnerClient, repeat: int, seed: int
) -> tuple[list[float], list[float]]:
    """Prefill tokens/s of fresh 512-token prompts (the same for both sides): raw, runner."""
    raw_rates, engine_rates = [], []
    for attempt in range(repeat):
        tokens = raw.tokenize(words(700, seed=seed + attempt))[:512]
        raw_rates.append(len(tokens) / raw.prefill_seconds(tokens))
        request = GenerationRequest(
            id="", prompt=raw.detokenize(tokens), raw=True, options=SamplingOptions(num_predict=1)
        )
        async for event in client.generate(request):
            if not isinstance(event, TokenChunk):
                engine_rates.append(event.timings.prompt_tokens_per_s)
    return raw_rates, engine_rates


def report(label: str, raw: float, engine: float, unit: str) -> None:
    print(
        f"{label}: raw {raw:.1f} {unit}, engine {engine:.1f} {unit} ({engine / raw:.3f})",
        flush=True,
    )


def best(values: list[float]) -> float:
    return max(values)


@contextlib.asynccontextmanager
async def fresh_runner(
    model: str, threads: int, kv_dir: Path | None = None
) -> AsyncIterator[RunnerClient]:
    """A new runner process, so each measurement starts from an empty KV cache, like the raw
    side (which clears its memory before every run). With ``kv_dir`` it has the prefix
    cache's RAM and disk tiers there."""
    config = RunnerConfig(model_path=model, n_slots=8, n_ctx_per_slot=2048, n_threads=threads)
    if kv_dir is not None:
        config.kv_cache_dir = str(kv_dir)
        config.kv_cache_ram = 1 << 30
        config.kv_cache_disk = 1 << 30
    async with runner_process(config) as client:
        yield client


def batched_bench(path: str, model: str, threads: int, streams: int, tokens: int) -> float:
    """``llama-batched-bench``'s decode tokens/s (S_TG) for ``streams`` sequences of 32-token
    prompts generating ``tokens`` each, with the runner's batch and context per sequence."""
    command = [
        path,
        "-m",
        model,
        "-c",
        str(2048 * streams),
        "-b",
        "512",
        "-ub",
        "512",
        "-t",
        str(threads),
        "-tb",
        str(threads),
        "-npp",
        "32",
        "-ntg",
        str(tokens),
        "-npl",
        str(streams),
        "--output-format",
        "jsonl",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=True)
    for line in done.stdout.splitlines() + done.stderr.splitlines():
        if line.startswith("{") and '"speed_tg"' in line:
            return float(json.loads(line)["speed_tg"])
    raise RuntimeError(f"llama-batched-bench printed no result: {done.stderr[-500:]}")


async def decode_rates(
    raw: RawLlama,
    client: RunnerClient,
    streams: int,
    repeat: int,
    tokens: int,
    bench: tuple[str, str, int] | None = None,
) -> tuple[list[float], list[float], list[float]]:
    """Aggregate decode tokens/s of ``streams`` concurrent greedy stories: raw, runner and,
    when ``bench`` (binary, model, threads) is given, llama-batched-bench."""
    texts = [f"{STORY} ({i})" for i in range(streams)]
    raw_rates, engine_rates, bench_rates = [], [], []
    sides = ["raw", "engine"] + (["bench"] if bench else [])
    for attempt in range(repeat):
        # Rotate which side goes first, so none always follows another's lingering threads.
        shift = attempt % len(sides)
        for side in sides[shift:] + sides[:shift]:
            if side == "raw":
                count, seconds = raw.decode([raw.chat_tokens(t) for t in texts], tokens)
                raw_rates.append(count / seconds)
            elif side == "engine":
                count, seconds = await runner_decode(client, texts, tokens)
                engine_rates.append(count / seconds)
            else:
                assert bench is not None
                path, model, threads = bench
                bench_rates.append(
                    await asyncio.to_thread(batched_bench, path, model, threads, streams, tokens)
                )
    return raw_rates, engine_rates, bench_rates


async def engine_prefill_rate(raw: RawLlama, client: RunnerClient, seed: int) -> float:
    """The runner's prefill tokens/s on a 512-token prompt (the same for the same seed)."""
    tokens = raw.tokenize(words(700, seed=seed))[:512]
    request = GenerationRequest(
        id="", prompt=raw.detokenize(tokens), raw=True, options=SamplingOptions(num_predict=1)
    )
    rate = 0.0
    async for event in client.generate(request):
        if not isinstance(event, TokenChunk):
            rate = event.timings.prompt_tokens_per_s
    return rate


async def idle_chats(
    raw: RawLlama, model: str, threads: int, kv_dir: Path, args: argparse.Namespace
) -> dict[str, float]:
    """One stream's decode and prefill after 20 long chats went idle, over a fresh runner's:
    both runners are up at once and measured in turns, so the machine's drift hits both."""
    # Each runner gets its own cache folder: the idle runner must not find the fresh runner's
    # prompts saved on disk, or its "prefill" would be a restore.
    async with (
        fresh_runner(model, threads, kv_dir / "fresh") as fresh,
        fresh_runner(model, threads, kv_dir / "idle") as idle,
    ):
        for batch in range(5):  # 20 chats of ~600 tokens, 4 at a time
            await runner_ttft(idle, [words(500, seed=1000 + batch * 4 + i) for i in range(4)])
        # In a unified cache the engine moves cells of slots idle for a while to the RAM tier
        # once others work.
        await asyncio.sleep(2.5)
        await runner_ttft(idle, [words(50, seed=1999)])
        rates: dict[str, dict[str, list[float]]] = {
            "fresh": {"prefill": [], "decode": []},
            "idle": {"prefill": [], "decode": []},
        }
        for attempt in range(args.repeat):
            order = [("fresh", fresh), ("idle", idle)]
            for name, client in order if attempt % 2 == 0 else order[::-1]:
                rates[name]["prefill"].append(
                    await engine_prefill_rate(raw, client, seed=900 + attempt)
                )
                count, seconds = await runner_decode(client, [STORY], args.tokens)
                rates[name]["decode"].append(count / seconds)
    figures = {
        f"idle20_{what}_ratio": best(rates["idle"][what]) / best(rates["fresh"][what])
        for what in ("decode", "prefill")
    }
    print(
        f"after 20 idle chats: decode {figures['idle20_decode_ratio']:.3f}, "
        f"prefill {figures['idle20_prefill_ratio']:.3f} of a fresh runner"
    )
    return figures


async def restart_ttft(model: str, threads: int, kv_dir: Path) -> dict[str, float]:
    """TTFT of a ~1,500-token system prompt: cold, then after a runner restart."""
    system = words(1230, seed=77)
    async with fresh_runner(model, threads, kv_dir) as client:
        cold = (await runner_ttft(client, [system + " first question: why?"]))[0]
    # The first runner saved its idle prefix to disk when it stopped.
    async with fresh_runner(model, threads, kv_dir) as client:
        restored = (await runner_ttft(client, [system + " second question: how?"]))[0]
    print(f"1,500-token system prompt ttft ms: cold {cold:.0f}, after a restart {restored:.0f}")
    return {
        "restart_cold_ttft_ms": cold,
        "restart_cached_ttft_ms": restored,
        "ratio_restart_cached_ttft": restored / cold,
    }


SECTIONS = ("prefill", "decode", "ttft", "idle", "restart")


async def main_async(args: argparse.Namespace) -> dict[str, float]:
    model = args.model
    threads = args.threads or default_threads()
    raw = RawLlama(model, threads, n_seq=8, n_ctx_per_seq=2048)
    results: dict[str, float] = {"threads": threads, "tokens": args.tokens}
    sections = set(args.only.split(",")) if args.only else set(SECTIONS)

    if sections & {"prefill", "decode"}:
        async with fresh_runner(model, threads) as client:
            raw_rates, engine_rates = await prefill_rates(raw, client, args.repeat, seed=100)
        results["raw_prefill_tps"] = best(raw_rates)
        results["engine_prefill_tps"] = best(engine_rates)
        results["ratio_prefill"] = results["engine_prefill_tps"] / results["raw_prefill_tps"]
        report("prefill", results["raw_prefill_tps"], results["engine_prefill_tps"], "tok/s")
    if "decode" in sections:
        results.update(await decode_section(raw, model, threads, args))
    if "ttft" in sections:
        results.update(await ttft_section(model, threads))
    if "idle" in sections:
        with tempfile.TemporaryDirectory(prefix="localllm-bench-kv-") as kv:
            results.update(await idle_chats(raw, model, threads, Path(kv), args))
    if "restart" in sections:
        with tempfile.TemporaryDirectory(prefix="localllm-bench-kv-") as kv:
            results.update(await restart_ttft(model, threads, Path(kv)))
    return results


async def decode_section(
    raw: RawLlama, model: str, threads: int, args: argparse.Namespace
) -> dict[str, float]:
    """Decode at 1, 4 and 8 streams (and llama-batched-bench's, when given), then prefill and
    decode with the cache full of idle prefixes."""
    results: dict[str, float] = {}
    bench = (args.batched_bench, model, threads) if args.batched_bench else None
    for streams, key in ((1, "decode"), (4, "batched4"), (8, "batched8")):
        async with fresh_runner(model, threads) as client:
            raw_rates, engine_rates, bench_rates = await decode_rates(
                raw, client, streams, args.repeat, args.tokens, bench
            )
            if streams == 8:
                # With other sequences' idle prefixes in the cache (8 stories and 4 prompts
                # here), does prefill or decode of one more stream slow down?
                await prefill_rates(raw, client, 4, seed=300)
                raw_prefill_then, busy_prefill = await prefill_rates(raw, client, 2, seed=500)
                # Against raw decodes interleaved with these, not the ones minutes ago: this
                # machine's speed drifts by 10 % and more between minutes.
                raw_then, busy_decode, _ = await decode_rates(raw, client, 1, 2, args.tokens)
        results[f"raw_{key}_tps"] = best(raw_rates)
        results[f"engine_{key}_tps"] = best(engine_rates)
        results[f"ratio_{key}"] = best(engine_rates) / best(raw_rates)
        report(key, results[f"raw_{key}_tps"], results[f"engine_{key}_tps"], "tok/s")
        if bench_rates:
            results[f"bench_{key}_tps"] = best(bench_rates)
            results[f"ratio_{key}_vs_bench"] = best(engine_rates) / best(bench_rates)
            report(f"{key} vs llama-batched-bench", best(bench_rates), best(engine_rates), "tok/s")
    results["engine_prefill_busy_cache_tps"] = best(busy_prefill)
    results["ratio_prefill_busy_cache"] = best(busy_prefill) / best(raw_prefill_then)
    results["engine_decode_busy_cache_tps"] = best(busy_decode)
    results["ratio_decode_busy_cache"] = best(busy_decode) / best(raw_then)
    report("decode, cache full of idle prefixes", best(raw_then), best(busy_decode), "tok/s")
    return results


async def ttft_section(model: str, threads: int) -> dict[str, float]:
    """TTFT of a cold ~1,000-token prompt, of the same prefix cached, and the worst of 4
    simultaneous cold requests sharing a ~1,000-token prefix."""
    async with fresh_runner(model, threads) as client:
        prefix = words(820, seed=7)  # ~1,000 tokens
        cold = (await runner_ttft(client, [prefix + " first question: why?"]))[0]
        cached = (await runner_ttft(client, [prefix + " second question: how?"]))[0]
        shared_prefix = words(820, seed=8)
        shared = await runner_ttft(
            client, [f"{shared_prefix} question {i}: what?" for i in range(4)]
        )
    print(f"ttft ms: cold {cold:.0f}, cached prefix {cached:.0f}, 4 sharing max {max(shared):.0f}")
    return {
        "cold_ttft_ms": cold,
        "cached_prefix_ttft_ms": cached,
        "shared4_max_ttft_ms": max(shared),
        "ratio_cached_ttft": cached / cold,
        "ratio_shared4_ttft": max(shared) / cold,
    }


def main() -> int:
    parser = model_parser(
        __doc__,
        threads=0,
        threads_help="threads for both sides (default: physical cores)",
        tokens=128,
        repeat=4,
    )
    parser.add_argument(
        "--batched-bench",
        metavar="PATH",
        help="a llama-batched-bench binary to measure llama.cpp's own batched decode with",
    )
    parser.add_argument(
        "--only",
        metavar="SECTIONS",
        help=f"comma-separated sections to run (default all: {','.join(SECTIONS)})",
    )
    args = parser.parse_args()
    args.model = model_path(parser, args)
    with open(os.devnull, "w") as quiet:
        route_llama_log(quiet)  # the raw side's loading chatter would bury the figures
        results = asyncio.run(main_async(args))
    print(json.dumps({k: round(v, 3) for k, v in results.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
