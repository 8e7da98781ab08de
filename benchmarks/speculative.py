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

``--api`` measures through ``/api/generate`` instead (two daemons, speculation on and off,
requests interleaved: the issue's 60-line rename and a story, 300 tokens). For the n-gram
tasks it also prints what n-gram drafting could give at most on this machine: the drafter
replayed over the real answer (the final chunk's ``context``), each step verifying exactly
the drafts that will be accepted when that beats a plain step at the batch costs measured
after as many tokens as the prompt holds. Where a k-token batch costs nearly k single
decodes (a small model on few cores), no policy can do much; the ratio against this bound
shows what the policy leaves.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import llama_cpp
from _daemon import daemon_env, model_parser, model_path, runner_process, start_daemon, stop

from localllm.daemon.engine.model import default_threads, route_llama_log
from localllm.daemon.runner import (
    GenerationRequest,
    RunnerClient,
    RunnerConfig,
    SamplingOptions,
    cpu,
)
from localllm.daemon.speculation.policy import BatchCost, NgramDrafter
from localllm.settings import Settings
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
    config = RunnerConfig(model_path=model, n_slots=8, n_ctx_per_slot=2048, n_threads=threads)
    config.num_draft = num_draft
    if num_draft and draft_model:
        config.draft_model = draft_model
    async with runner_process(config) as client:
        yield client


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


def batch_cost(model: str, threads: int, context: int = 0) -> dict[int, float]:
    """Seconds to decode k tokens of one sequence, relative to one token (plain llama.cpp),
    after ``context`` tokens already in the sequence (attention grows with it)."""
    llama_cpp.llama_backend_init()
    params = cpu.model_params()
    llama = llama_cpp.llama_model_load_from_file(model.encode(), params)
    context_params = llama_cpp.llama_context_default_params()
    context_params.n_ctx = context + 512
    context_params.n_batch = context_params.n_ubatch = 64
    context_params.n_threads = context_params.n_threads_batch = threads
    ctx = llama_cpp.llama_init_from_model(llama, context_params)
    batch = llama_cpp.llama_batch_init(64, 0, 1)
    memory = llama_cpp.llama_get_memory(ctx)

    def decode(start: int, count: int) -> float:
        for index in range(count):
            batch.token[index] = 1
            batch.pos[index] = start + index
            batch.n_seq_id[index] = 1
            batch.seq_id[index][0] = 0
            batch.logits[index] = True
        batch.n_tokens = count
        started = time.perf_counter()
        llama_cpp.llama_decode(ctx, batch)
        return time.perf_counter() - started

    for start in range(0, context, 64):
        decode(start, min(64, context - start))
    seconds: dict[int, float] = {}
    for k in (1, 1, 2, 4, 8, 16):  # the first run warms up
        runs = []
        for _ in range(5):
            llama_cpp.llama_memory_seq_rm(memory, 0, context, -1)
            runs.append(decode(context, k))
        seconds[k] = min(runs)
    llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(llama)
    return {k: round(t / seconds[1], 3) for k, t in seconds.items()}


def ngram_bound(
    prompt: list[int], answer: list[int], cost: dict[int, float], max_draft: int
) -> float:
    """The speed-up n-gram drafting could give ``answer`` at best on this machine: replaying
    the drafter over the real tokens, each step verifies exactly the drafts that will be
    accepted, when that beats a plain step at the measured batch costs (an oracle no policy
    can beat step by step; only the drafter and the cost curve limit it)."""
    if len(answer) < 2:
        return 1.0
    curve = BatchCost(dict(cost))
    drafter = NgramDrafter(prompt + answer[:1])
    position, seconds = 0, 0.0  # answer[position] is the pending token
    while position < len(answer):
        proposal = drafter.propose(min(max_draft, len(answer) - position - 1))
        accepted = 0
        for guess, actual in zip(proposal, answer[position + 1 :], strict=False):
            if guess != actual:
                break
            accepted += 1
        if accepted and (accepted + 1) / curve(accepted + 1) <= 1.0:
            accepted = 0  # verifying them would cost more than it gives
        seconds += curve(1 + accepted)
        drafter.extend(answer[position + 1 : position + 2 + accepted])
        position += 1 + accepted
    return len(answer) / seconds


async def main_async(args: argparse.Namespace) -> dict[str, object]:
    model = args.model
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


class ApiDaemon:
    """A daemon on a temporary home with speculation set as ``LOCALLLM_SPECULATIVE`` says."""

    def __init__(self, home: str, threads: int, speculative: str) -> None:
        self.speculative = speculative
        env, self.url = daemon_env(home, num_threads=threads, speculative=speculative)
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

    async def generate(self, model: str, prompt: str, tokens: int) -> dict[str, Any]:
        """One streamed greedy ``/api/generate``: client decode rate (tokens after the first
        over first → last chunk), the server's eval rate, drafts verified and accepted, and
        the prompt's and answer's token ids (the final chunk's ``context``)."""
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
        context = list(final.get("context") or [])  # type: ignore[call-overload]
        prompt_count = int(final.get("prompt_eval_count") or 0)  # type: ignore[call-overload]
        return {
            "prompt_ids": context[:prompt_count],
            "answer_ids": context[prompt_count:],
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
                runs: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
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
                bound = ""
                if model == STARTER and args.speculative in ("auto", "ngram"):
                    # Greedy answers differ from run to run (a batch of drafts rounds the
                    # logits differently from one token, and near-ties tip): each pair's own
                    # answer bounds what its ratio could be.
                    prompt_ids = runs["on"][0]["prompt_ids"]
                    # The daemons run with the default LOCALLLM_NUM_DRAFT (their environment
                    # has no LOCALLLM_ variables but their homes).
                    cost = batch_cost(str(starter_gguf_path()), threads, len(prompt_ids))
                    num_draft = Settings.from_env({}).num_draft
                    bounds = [
                        ngram_bound(r["prompt_ids"], r["answer_ids"], cost, num_draft)
                        for r in runs["on"]
                    ]
                    results[f"{key}_batch_cost"] = cost
                    results[f"{key}_ngram_bound"] = round(statistics.mean(bounds), 3)
                    results[f"{key}_ngram_bounds"] = [round(b, 3) for b in bounds]
                    bound = (
                        f"; at most {', '.join(f'{b:.2f}' for b in bounds)}x (each pair's answer) "
                        f"with n-gram drafts on this machine (batch costs after "
                        f"{len(prompt_ids)} tokens: {cost})"
                    )
                acceptance = ", ".join(
                    f"{run['accepted']:.0f}/{run['drafted']:.0f}" for run in runs["on"]
                )
                print(
                    f"{key} ({model}): on {results[f'{key}_tps_on']} tok/s, off "
                    f"{results[f'{key}_tps_off']} tok/s; ratio per pair "
                    f"{', '.join(f'{r:.3f}' for r in ratios)}; drafts accepted {accepted:.0f} "
                    f"of {drafted:.0f} ({acceptance}){bound}",
                    flush=True,
                )
        finally:
            on.stop()
            off.stop()
    return results


def main() -> int:
    parser = model_parser(
        __doc__, threads=0, threads_help="threads (default: cores)", tokens=256, repeat=3
    )
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
    args.model = model_path(parser, args)
    if args.api and args.tokens == parser.get_default("tokens"):
        args.tokens = 300  # the request
    with open("/dev/null", "w") as quiet:
        route_llama_log(quiet)  # llama.cpp's loading chatter would bury the figures
        results = asyncio.run(api_main(args) if args.api else main_async(args))
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
