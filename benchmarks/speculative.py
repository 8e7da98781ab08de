"""Speculative decoding benchmark: the runner with drafts on and off, in one run.

    python benchmarks/speculative.py [--model PATH] [--threads N] [--repeat 3]
        [--drafter ngram|draft] [--draft-model PATH]

``--drafter draft`` drafts with a draft model instead of n-gram lookup: ``--draft-model``, by
default the target itself. SmolLM2-135M drafting for itself is the only compatible pair at
hand; it measures what the mechanism costs (a second context, its catching up and per-position
decodes, verification), not the speedup of a real small-for-large pair, which needs a draft
several times cheaper than its target.

On SmolLM2-135M (the bundled starter model by default), greedy, side by side:

* single-stream decode tokens/s on a copy-heavy task (rewrite a ~300-token code block with one
  identifier renamed), where prompt-lookup drafts should be accepted often;
* single-stream decode tokens/s on free text (a story), where they mostly are not and the
  adaptive policy should stop drafting;
* aggregate decode tokens/s of 8 simultaneous copy tasks;
* the cost of decoding a batch of k tokens of one sequence relative to one token, measured
  with a plain llama.cpp loop (what makes speculation pay or not on this machine).

Each pair alternates which side runs first and keeps the best of ``--repeat`` runs, since
this machine is shared and noisy. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import llama_cpp
from _daemon import start_daemon, stop

from localllm.daemon.runner import (
    GenerationRequest,
    RunnerClient,
    RunnerConfig,
    RunnerProcess,
    SamplingOptions,
    cpu,
)
from localllm.daemon.runner.model import default_threads, route_llama_log
from localllm.starter import STARTER_NAME as STARTER
from localllm.starter import starter_gguf_path


def code_block(names: tuple[str, ...] = ("load", "save", "count", "clean")) -> str:
    """Python whose identifiers repeat (as real code's do): 7 lines and about 75 tokens per
    name (4 by default: about 300 tokens)."""
    functions = []
    for name in (f"{n}_items" for n in names):
        functions.append(
            f"def {name}(store, limit=10):\n"
            f'    """Work on the items of the store, at most limit of them."""\n'
            f"    result = []\n"
            f"    for item in store.items[:limit]:\n"
            f"        if item.ready:\n"
            f"            result.append(item.value)\n"
            f"    return result\n"
        )
    return "\n".join(functions)


COPY_PROMPT = (
    "Rewrite this code exactly, renaming the parameter `store` to `repository` everywhere. "
    "Output only the code.\n\n" + code_block()
)
FREE_PROMPT = "Write a long, imaginative story about a lighthouse keeper and a storm."
# The request through the public API: a 60-line code block, one rename.
API_COPY_PROMPT = (
    "Rewrite this code exactly, renaming the parameter `store` to `repository` everywhere. "
    "Output only the code.\n\n"
    + code_block(("load", "save", "count", "clean", "sort", "merge", "split", "check"))
)


@contextlib.asynccontextmanager
async def runner(
    model: str, threads: int, num_draft: int, draft_model: str | None = None
) -> AsyncIterator[RunnerClient]:
    """A fresh runner process with speculation on (``num_draft`` > 0) or off, drafting with
    ``draft_model`` when given (n-gram lookup otherwise)."""
    with tempfile.TemporaryDirectory(prefix="localllm-spec-") as scratch:
        config = RunnerConfig(model_path=model, n_slots=8, n_ctx_per_slot=2048, n_threads=threads)
        config.num_draft = num_draft
        if num_draft and draft_model:
            config.draft_model = draft_model
        process = RunnerProcess(config, Path(scratch) / "r.sock", Path(scratch) / "r.log")
        client = await process.start()
        try:
            yield client
        finally:
            await client.close()
            await process.stop()


async def decode_rate(
    client: RunnerClient, prompt: str, streams: int, tokens: int, drafts: list[int] | None = None
) -> float:
    """Aggregate decode tokens/s of ``streams`` simultaneous greedy chats of ``prompt``;
    ``drafts`` (when given) gains the draft tokens verified and accepted."""
    firsts: list[float] = []
    lasts: list[float] = []
    counts: list[int] = []

    async def one(index: int) -> None:
        request = GenerationRequest(
            id="",
            messages=[{"role": "user", "content": prompt + ("" if index == 0 else " " * index)}],
            options=SamplingOptions(temperature=0, num_predict=tokens, repeat_penalty=1.0),
        )
        first = 0.0
        async for event in client.generate(request):
            if hasattr(event, "timings"):
                lasts.append(time.perf_counter())
                counts.append(event.timings.completion_tokens - 1)
                if drafts is not None:
                    drafts[0] += event.timings.draft_tokens
                    drafts[1] += event.timings.draft_accepted
            else:
                first = first or time.perf_counter()
        firsts.append(first)

    await asyncio.gather(*(one(i) for i in range(streams)))
    return sum(counts) / max(max(lasts) - max(firsts), 1e-9)


async def pair(
    model: str,
    threads: int,
    prompt: str,
    streams: int,
    tokens: int,
    repeat: int,
    draft_model: str | None = None,
    drafts: list[int] | None = None,
) -> tuple[float, float]:
    """Best decode rate with speculation off and on (``drafts`` gains the "on" runs' draft
    tokens verified and accepted)."""
    off: list[float] = []
    on: list[float] = []
    for attempt in range(repeat):
        for num_draft in (0, 8) if attempt % 2 == 0 else (8, 0):
            async with runner(model, threads, num_draft, draft_model) as client:
                rate = await decode_rate(
                    client, prompt, streams, tokens, drafts if num_draft else None
                )
            (on if num_draft else off).append(rate)
    return max(off), max(on)


def batch_cost(model: str, threads: int) -> dict[int, float]:
    """Seconds to decode k tokens of one sequence, relative to one token (plain llama.cpp)."""
    llama_cpp.llama_backend_init()
    params = cpu.model_params()
    llama = llama_cpp.llama_model_load_from_file(model.encode(), params)
    context_params = llama_cpp.llama_context_default_params()
    context_params.n_ctx = 512
    context_params.n_batch = context_params.n_ubatch = 64
    context_params.n_threads = context_params.n_threads_batch = threads
    ctx = llama_cpp.llama_init_from_model(llama, context_params)
    batch = llama_cpp.llama_batch_init(64, 0, 1)
    memory = llama_cpp.llama_get_memory(ctx)
    seconds: dict[int, float] = {}
    for k in (1, 1, 2, 4, 8, 16):  # the first run warms up
        runs = []
        for _ in range(5):
            llama_cpp.llama_memory_clear(memory, True)
            batch.n_tokens = 0
            for position in range(k):
                batch.token[position] = 1
                batch.pos[position] = position
                batch.n_seq_id[position] = 1
                batch.seq_id[position][0] = 0
                batch.logits[position] = True
            batch.n_tokens = k
            started = time.perf_counter()
            llama_cpp.llama_decode(ctx, batch)
            runs.append(time.perf_counter() - started)
        seconds[k] = min(runs)
    llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(llama)
    return {k: round(t / seconds[1], 3) for k, t in seconds.items()}


async def main_async(args: argparse.Namespace) -> dict[str, object]:
    model = args.model or str(starter_gguf_path())
    threads = args.threads or default_threads()
    draft_model = (args.draft_model or model) if args.drafter == "draft" else None
    results: dict[str, object] = {
        "threads": threads,
        "tokens": args.tokens,
        "drafter": "ngram" if draft_model is None else f"draft:{Path(draft_model).name}",
    }
    if draft_model is not None and Path(draft_model).resolve() == Path(model).resolve():
        print(
            "draft model = the target itself: this measures the draft mechanism's cost, "
            "not the speedup of a real (smaller) draft model",
            flush=True,
        )
    cost = batch_cost(model, threads)
    results["batch_cost"] = cost
    print(f"decode cost of k tokens relative to 1: {cost}", flush=True)
    for key, prompt, streams in (
        ("copy", COPY_PROMPT, 1),
        ("free", FREE_PROMPT, 1),
        ("copy8", COPY_PROMPT, 8),
    ):
        drafts = [0, 0]
        off, on = await pair(
            model, threads, prompt, streams, args.tokens, args.repeat, draft_model, drafts
        )
        results[f"{key}_tps_off"] = round(off, 2)
        results[f"{key}_tps_on"] = round(on, 2)
        results[f"{key}_ratio"] = round(on / off, 3)
        results[f"{key}_drafts"] = {"verified": drafts[0], "accepted": drafts[1]}
        print(
            f"{key}: off {off:.1f} tok/s, on {on:.1f} tok/s ({on / off:.3f}); "
            f"drafts accepted {drafts[1]} of {drafts[0]}",
            flush=True,
        )
    return results


# -- through the public API ------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ApiDaemon:
    """A daemon on a temporary home with speculation set as ``LOCALLLM_SPECULATIVE`` says."""

    def __init__(self, home: str, threads: int, speculative: str) -> None:
        self.speculative = speculative
        port = _free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOCALLLM_")}
        env.update(
            LOCALLLM_HOME=home,
            LOCALLLM_HOST=f"127.0.0.1:{port}",
            LOCALLLM_NUM_THREADS=str(threads),
            LOCALLLM_SPECULATIVE=speculative,
        )
        self.url = f"http://127.0.0.1:{port}"
        self.process = start_daemon(env)

    async def ready(self) -> None:
        """Wait until it answers."""
        async with httpx.AsyncClient(base_url=self.url, timeout=5) as http:
            for _ in range(600):
                if self.process.poll() is not None:
                    raise RuntimeError(f"the daemon exited with {self.process.returncode}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get("/api/version")).status_code == 200:
                        return
                await asyncio.sleep(0.2)
        raise RuntimeError("the daemon did not answer")

    async def create(self, name: str, **fields: object) -> None:
        """``/api/create`` (what ``localllm create`` sends), to the end."""
        body = {"model": name, "stream": False, **fields}
        async with httpx.AsyncClient(base_url=self.url, timeout=600) as http:
            response = await http.post("/api/create", json=body)
            if response.status_code != 200 or "error" in response.text:
                raise RuntimeError(f"create {name}: {response.text[:300]}")

    async def generate(self, model: str, prompt: str, tokens: int) -> dict[str, float]:
        """One streamed greedy ``/api/generate``: client decode rate (tokens after the first
        over first → last chunk), the server's eval rate, drafts verified and accepted."""
        body = {
            "model": model,
            "prompt": prompt,
            "stream": True,
            "options": {"temperature": 0, "num_predict": tokens},
        }
        first = last = 0.0
        final: dict[str, object] = {}
        async with (
            httpx.AsyncClient(base_url=self.url, timeout=httpx.Timeout(600)) as http,
            http.stream("POST", "/api/generate", json=body) as response,
        ):
            if response.status_code != 200:
                await response.aread()
                raise RuntimeError(f"generate: {response.status_code} {response.text[:300]}")
            async for line in response.aiter_lines():
                if not line:
                    continue
                chunk = json.loads(line)
                if chunk.get("response"):
                    last = time.perf_counter()
                    first = first or last
                if chunk.get("done"):
                    final = chunk
        count = int(final.get("eval_count") or 0)  # type: ignore[call-overload]
        duration = float(final.get("eval_duration") or 0) / 1e9  # type: ignore[arg-type]
        return {
            "tokens": count,
            "client_tps": (count - 1) / (last - first) if last > first else 0.0,
            "server_tps": count / duration if duration else 0.0,
            "drafted": float(final.get("draft_count") or 0),  # type: ignore[arg-type]
            "accepted": float(final.get("draft_accepted_count") or 0),  # type: ignore[arg-type]
        }

    def stop(self) -> None:
        """Stop it."""
        stop(self.process)


async def api_main(args: argparse.Namespace) -> dict[str, object]:
    """Speculation through ``/api/generate``: one daemon with it, one with it off, both up,
    requests interleaved; with ``--draft-pair`` also a q8_0 target drafted for by a q4_0
    quantization of the same model (``/api/create``, as ``localllm create`` does)."""
    threads = args.threads or default_threads()
    results: dict[str, object] = {"threads": threads, "tokens": args.tokens, "api": True}
    with (
        tempfile.TemporaryDirectory(prefix="localllm-spec-on-") as home_on,
        tempfile.TemporaryDirectory(prefix="localllm-spec-off-") as home_off,
    ):
        on = ApiDaemon(home_on, threads, args.speculative)
        off = ApiDaemon(home_off, threads, "off")
        try:
            await asyncio.gather(on.ready(), off.ready())
            tasks = [("copy", STARTER, API_COPY_PROMPT), ("free", STARTER, FREE_PROMPT)]
            if args.draft_pair:
                for daemon in (on, off):
                    await daemon.create(
                        "smollm2-q4", **{"from": STARTER, "quantize": "q4_0"}, allow_requantize=True
                    )
                    await daemon.create(
                        "smollm2-q8", **{"from": STARTER, "quantize": "q8_0"}, allow_requantize=True
                    )
                    await daemon.create(
                        "smollm2-q8-drafted", **{"from": "smollm2-q8"}, draft="smollm2-q4"
                    )
                tasks += [
                    ("draft_copy", "smollm2-q8-drafted", API_COPY_PROMPT),
                    ("draft_free", "smollm2-q8-drafted", FREE_PROMPT),
                ]
            for _, model, prompt in tasks:  # load the models, fill the prefix caches
                for daemon in (on, off):
                    await daemon.generate(model, prompt, 4)
            for key, model, prompt in tasks:
                runs: dict[str, list[dict[str, float]]] = {"on": [], "off": []}
                for attempt in range(args.repeat):
                    order = (on, off) if attempt % 2 == 0 else (off, on)
                    for daemon in order:
                        side = "off" if daemon is off else "on"
                        runs[side].append(await daemon.generate(model, prompt, args.tokens))
                ratios = [
                    a["client_tps"] / b["client_tps"]
                    for a, b in zip(runs["on"], runs["off"], strict=True)
                    if b["client_tps"]
                ]
                drafted = sum(r["drafted"] for r in runs["on"])
                accepted = sum(r["accepted"] for r in runs["on"])
                results[f"{key}_tps_on"] = round(
                    statistics.median(r["client_tps"] for r in runs["on"]), 2
                )
                results[f"{key}_tps_off"] = round(
                    statistics.median(r["client_tps"] for r in runs["off"]), 2
                )
                results[f"{key}_ratio"] = round(statistics.mean(ratios), 3)
                results[f"{key}_ratio_min"] = round(min(ratios), 3)
                results[f"{key}_tokens"] = runs["on"][0]["tokens"]
                results[f"{key}_drafts"] = {"verified": drafted, "accepted": accepted}
                print(
                    f"{key} ({model}): on {results[f'{key}_tps_on']} tok/s, off "
                    f"{results[f'{key}_tps_off']} tok/s; ratio per pair "
                    f"{', '.join(f'{r:.3f}' for r in ratios)}; drafts accepted {accepted:.0f} "
                    f"of {drafted:.0f}",
                    flush=True,
                )
        finally:
            on.stop()
            off.stop()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", help="GGUF to use (default: the bundled SmolLM2-135M)")
    parser.add_argument("--threads", type=int, default=0, help="threads (default: cores)")
    parser.add_argument("--tokens", type=int, default=256, help="tokens generated per stream")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions; the best is kept")
    parser.add_argument(
        "--drafter",
        choices=["ngram", "draft"],
        default="ngram",
        help="what drafts when speculation is on: n-gram lookup or a draft model",
    )
    parser.add_argument(
        "--draft-model", help="the draft model's GGUF for --drafter draft (default: the target)"
    )
    parser.add_argument(
        "--api",
        action="store_true",
        help="through /api/generate: a daemon with speculation against one with it off",
    )
    parser.add_argument(
        "--speculative",
        default="auto",
        help="LOCALLLM_SPECULATIVE of the speculating daemon with --api (default auto: the "
        "draft model of --draft-pair's target, n-gram lookup for the others)",
    )
    parser.add_argument(
        "--draft-pair",
        action="store_true",
        help="with --api: also a q8_0 target drafted for by its own q4_0 quantization",
    )
    args = parser.parse_args()
    if args.api:
        if args.tokens == parser.get_default("tokens"):
            args.tokens = 300  # the request
        results = asyncio.run(api_main(args))
        print(json.dumps(results))
        return 0
    with open("/dev/null", "w") as quiet:
        route_llama_log(quiet)  # llama.cpp's loading chatter would bury the figures
        results = asyncio.run(main_async(args))
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
