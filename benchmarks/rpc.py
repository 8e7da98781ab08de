"""RPC benchmark: a model split across two loopback ``localllm worker`` processes vs local.

    python benchmarks/rpc.py [--model PATH] [--threads N] [--tokens 64] [--repeat 3]

Two runners serve the same model (SmolLM2-135M, the bundled starter model, by default): one on
this machine alone, one split across the local CPU and two workers on 127.0.0.1 (a third of the
layers each, by free memory). Both use the same CPU threads, and each worker as many. Measured
in one run, alternating the two sides, best of ``--repeat``:

* prefill tokens/s of a fresh ~512-token prompt (one stream);
* decode tokens/s of one greedy stream, and of 4 concurrent streams together.

Expect a loss: every step crosses two RPC hops each way (activations out, the next layer's input
back), and on one machine the workers and the runner share the same cores. Over loopback the
hop costs latency, not bandwidth; across a real network the decode loss grows with the round
trip time. The last line printed is one JSON object with the figures and the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from _daemon import free_port, model_parser, model_path, runner_process
from engine import timed_decode, words  # benchmarks/ is the script's folder, on sys.path

from localllm.daemon.devices.workers import probe
from localllm.daemon.runner import (
    GenerationRequest,
    RunnerClient,
    RunnerConfig,
    SamplingOptions,
    TokenChunk,
)


@contextlib.contextmanager
def workers(count: int, threads: int, home: Path) -> Iterator[list[str]]:
    """``count`` ``localllm worker`` processes on loopback; yields their endpoints."""
    processes: list[subprocess.Popen[bytes]] = []
    endpoints = []
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCALLLM_")}
    env["LOCALLLM_HOME"] = str(home)
    try:
        for _ in range(count):
            port = free_port()
            command = [sys.executable, "-m", "localllm", "worker", "--port", str(port)]
            processes.append(
                subprocess.Popen(
                    [*command, "--threads", str(threads)],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            endpoints.append(f"127.0.0.1:{port}")
        deadline = time.monotonic() + 120
        for endpoint, process in zip(endpoints, processes, strict=True):
            while not probe(endpoint, timeout=2).ok:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"worker {endpoint} did not start")
                time.sleep(0.1)
        yield endpoints
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            process.wait(30)


@contextlib.asynccontextmanager
async def runner(model: str, threads: int, rpc_workers: list[str]) -> AsyncIterator[RunnerClient]:
    """A runner process for ``model``, split onto ``rpc_workers`` when any."""
    config = RunnerConfig(
        model_path=model, n_slots=4, n_ctx_per_slot=2048, n_threads=threads, rpc_workers=rpc_workers
    )
    async with runner_process(config) as client:
        yield client


async def prefill_rate(client: RunnerClient, seed: int) -> float:
    """Prompt tokens/s of one fresh ~512-token prompt."""
    request = GenerationRequest(
        id="", prompt=words(400, seed), raw=True, options=SamplingOptions(num_predict=1)
    )
    rate = 0.0
    async for event in client.generate(request):
        if not isinstance(event, TokenChunk):
            rate = event.timings.prompt_tokens_per_s
    return rate


async def decode_rate(client: RunnerClient, streams: int, tokens: int, seed: int) -> float:
    """Generated tokens/s of ``streams`` concurrent greedy stories, all together."""
    options = SamplingOptions(temperature=0, num_predict=tokens, repeat_penalty=1.0)
    requests = [
        GenerationRequest(
            id="",
            prompt=f"Story {seed}-{index}: {words(8, seed * 100 + index)}",
            raw=True,
            options=options,
        )
        for index in range(streams)
    ]
    count, seconds = await timed_decode(client, requests)
    return count / seconds


async def measure(args: argparse.Namespace, model: str) -> dict[str, float]:
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="localllm-bench-rpc-") as folder:
        scratch = Path(folder)
        with workers(2, args.threads, scratch / "home") as endpoints:
            async with (
                runner(model, args.threads, []) as local,
                runner(model, args.threads, endpoints) as split,
            ):
                for attempt in range(args.repeat):
                    sides = [("local", local), ("split", split)]
                    for name, client in sides if attempt % 2 == 0 else sides[::-1]:
                        seed = attempt * 10
                        figures = {
                            "prefill_tok_s": await prefill_rate(client, seed),
                            "decode_1_tok_s": await decode_rate(client, 1, args.tokens, seed),
                            "decode_4_tok_s": await decode_rate(client, 4, args.tokens, seed),
                        }
                        for key, value in figures.items():
                            results.setdefault(f"{name}_{key}", []).append(value)
    best = {key: max(values) for key, values in results.items()}
    for key in ("prefill_tok_s", "decode_1_tok_s", "decode_4_tok_s"):
        best[f"ratio_{key}"] = best[f"split_{key}"] / best[f"local_{key}"]
    return best


def main() -> int:
    parser = model_parser(
        __doc__, threads=1, threads_help="threads per process (default 1)", tokens=64, repeat=3
    )
    args = parser.parse_args()
    model = model_path(parser, args)
    results = asyncio.run(measure(args, model))
    for key in ("prefill_tok_s", "decode_1_tok_s", "decode_4_tok_s"):
        local, split = results[f"local_{key}"], results[f"split_{key}"]
        ratio = results[f"ratio_{key}"]
        print(f"{key}: local {local:.1f}, two loopback workers {split:.1f} ({ratio:.3f})")
    print(json.dumps({k: round(v, 3) for k, v in results.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
