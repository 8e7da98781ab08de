"""Many daemons behind ``localllm gateway``: cache-aware routing against round-robin.

Three daemons (``--daemons``), each with ``--threads`` threads and ``--slots`` slots, serve
SmolLM2-135M behind the Shepherd Model Gateway. The workload is the tests' one, larger:
``--prompts`` long system prompts (``--words`` numbered words each, a few hundred tokens),
each sent ``--repeats`` times, interleaved (each round has every prompt once, the order
rotated by one each round), each with its own short question and ``--tokens`` generated
tokens; at most ``--concurrency`` requests are in flight. Streams go through the gateway's
``/v1/chat/completions``.

The same workload runs once under each policy, on fresh daemons each time (no prefix cached
from the other run). The daemons' saved-prefix tiers (host RAM, disk) are off unless
``--keep-prefixes``: a slot's own KV cache is then the only cache, which is what routing keeps
or loses; with the tiers on, a daemon also restores prefixes it saw before from RAM, so
round-robin loses less.

Reported per policy: the share of prompt tokens served from the prefix cache (the final
chunk's ``cached_tokens``), TTFT p50/p95 (client side, request sent → first token), the
aggregate generated tokens/s (all tokens / wall time) and the wall time. The last line is one
JSON object with those figures for both policies and the ratios cache-aware / round-robin.
This machine is shared: absolute times are noisy, the ratios (measured in one run) less so.

Usage::

    python benchmarks/fleet.py [--daemons 3] [--threads 1] [--slots 1] [--prompts 3]
                               [--repeats 4] [--words 150] [--tokens 16] [--concurrency 3]
                               [--keep-prefixes]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from _daemon import daemon_env, free_port, start_daemon, stop

from localllm.bench import percentile
from localllm.client import Client
from localllm.gateway import Gateway, GatewayConfig, check_workers, describe_problems
from localllm.settings import Settings

MODEL = "smollm2:135m"


@contextlib.contextmanager
def daemons(args: argparse.Namespace, root: Path) -> Iterator[list[str]]:
    """``--daemons`` daemons on fresh homes, with SmolLM2 loaded; their URLs."""
    processes, urls = [], []
    try:
        for i in range(args.daemons):
            env, url = daemon_env(
                root / f"d{i}",
                num_parallel=args.slots,
                num_threads=args.threads,
                context_length=args.ctx,
            )
            if not args.keep_prefixes:
                env.update(LOCALLLM_KV_CACHE_RAM="0", LOCALLLM_KV_CACHE_DISK="0")
            processes.append(start_daemon(env))
            urls.append(url)
        for url, process in zip(urls, processes, strict=True):
            with Client(Settings.from_env({}), base_url=url) as client:
                if not client.wait_ready(60):
                    raise RuntimeError(f"daemon {url} did not start (status {process.poll()})")
                client.load(MODEL)  # loaded before the clock starts
        yield urls
    finally:
        for process in processes:
            stop(process)


def system_prompts(args: argparse.Namespace) -> list[str]:
    """Long system prompts that differ from their first word (as real ones do)."""
    names = ["Ada", "Basil", "Cleo", "Dario", "Edith", "Farid", "Greta", "Hugo"]
    prompts = []
    for i in range(args.prompts):
        name = names[i % len(names)] + ("" if i < len(names) else str(i))
        words = " ".join(f"{name.lower()}-{n}" for n in range(args.words))
        prompts.append(f"{name} is your name. Remember these words: {words}.")
    return prompts


def workload(args: argparse.Namespace) -> list[tuple[int, str]]:
    """(prompt index, question) of each request, in order."""
    count = args.prompts
    order = [(p + r) % count for r in range(args.repeats) for p in range(count)]
    return [(which, f"Question {turn}: say a number.") for turn, which in enumerate(order)]


def one_request(url: str, system: str, question: str, tokens: int) -> dict[str, Any]:
    """A streamed chat through the gateway: TTFT, usage."""
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": tokens,
        "temperature": 0,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    ttft = None
    usage: dict[str, Any] = {}
    with Client(Settings.from_env({}), base_url=url) as client:
        for chunk in client.openai_chat_stream(body):
            if ttft is None and any(
                (c.get("delta") or {}).get("content") for c in chunk["choices"]
            ):
                ttft = (time.perf_counter() - started) * 1000
            usage = chunk.get("usage") or usage
    details = usage.get("prompt_tokens_details") or {}
    return {
        "ttft_ms": ttft if ttft is not None else (time.perf_counter() - started) * 1000,
        "prompt_tokens": int(usage.get("prompt_tokens", 0)),
        "cached_tokens": int(details.get("cached_tokens", 0)),
        "completion_tokens": int(usage.get("completion_tokens", 0)),
    }


def run_policy(args: argparse.Namespace, policy: str) -> dict[str, Any]:
    """The workload through a gateway with ``policy``, on fresh daemons."""
    with (
        tempfile.TemporaryDirectory(prefix="localllm-fleet-") as root,
        daemons(args, Path(root)) as urls,
    ):
        checks = check_workers(urls)
        if describe_problems(checks):
            raise RuntimeError(describe_problems(checks))
        config = GatewayConfig(
            workers=tuple(urls),
            port=free_port(),
            metrics_port=free_port(),
            policy=policy,
            health_interval=5,
            load_interval=2,
            shutdown_grace=1,  # stopped once every stream has ended
        )
        gateway = Gateway.start(config, Path(root) / "gateway.log")
        try:
            if gateway.wait_workers(len(urls), timeout=60) < len(urls):
                raise RuntimeError(f"not every worker registered: {gateway.log_tail()}")
            prompts = system_prompts(args)
            lock = threading.Lock()
            results: list[dict[str, Any]] = []

            def send(item: tuple[int, str]) -> None:
                result = one_request(config.url, prompts[item[0]], item[1], args.tokens)
                with lock:
                    results.append(result)

            started = time.perf_counter()
            with ThreadPoolExecutor(args.concurrency) as pool:
                list(pool.map(send, workload(args)))
            wall = time.perf_counter() - started
        finally:
            gateway.stop()
    ttfts = [r["ttft_ms"] for r in results]
    prompt_tokens = sum(r["prompt_tokens"] for r in results)
    return {
        "policy": policy,
        "requests": len(results),
        "cached_share": sum(r["cached_tokens"] for r in results) / max(prompt_tokens, 1),
        "ttft_p50_ms": statistics.median(ttfts),
        "ttft_p95_ms": percentile(ttfts, 0.95),
        "aggregate_tps": sum(r["completion_tokens"] for r in results) / wall,
        "wall_s": wall,
        "prompt_tokens": prompt_tokens,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--daemons", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--slots", type=int, default=1)
    parser.add_argument("--ctx", type=int, default=2048, help="context per slot")
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--words", type=int, default=150, help="words per system prompt")
    parser.add_argument("--tokens", type=int, default=16, help="tokens generated per request")
    parser.add_argument("--concurrency", type=int, default=3)
    parser.add_argument("--keep-prefixes", action="store_true", help="saved-prefix tiers on")
    args = parser.parse_args()

    runs = {}
    for policy in ("cache_aware", "round_robin"):
        run = runs[policy] = run_policy(args, policy)
        print(
            f"{policy:12} cached {run['cached_share']:6.1%} of {run['prompt_tokens']} prompt "
            f"tokens  TTFT p50 {run['ttft_p50_ms']:7.1f} ms  p95 {run['ttft_p95_ms']:7.1f} ms  "
            f"{run['aggregate_tps']:6.1f} tok/s  ({run['requests']} requests, "
            f"{run['wall_s']:.1f} s)",
            flush=True,
        )
    aware, rotated = runs["cache_aware"], runs["round_robin"]
    summary = {
        "daemons": args.daemons,
        "slots": args.slots,
        "threads": args.threads,
        "prompts": args.prompts,
        "repeats": args.repeats,
        "concurrency": args.concurrency,
        "keep_prefixes": args.keep_prefixes,
        **{
            f"{name}_{key}": run[key]
            for name, run in (("aware", aware), ("rr", rotated))
            for key in ("cached_share", "ttft_p50_ms", "ttft_p95_ms", "aggregate_tps")
        },
        "ttft_p50_ratio": aware["ttft_p50_ms"] / rotated["ttft_p50_ms"],
        "ttft_p95_ratio": aware["ttft_p95_ms"] / rotated["ttft_p95_ms"],
        "tps_ratio": aware["aggregate_tps"] / rotated["aggregate_tps"],
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
