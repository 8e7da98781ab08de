"""Soak: many streaming clients on both API families against one daemon, for minutes.

Starts ``python -m localllm.daemon`` on loopback with a private ``LOCALLLM_HOME`` (the bundled
SmolLM2-135M starter model is imported on first use, as in ``serve.py``), then runs
``--clients`` concurrent clients for ``--seconds``. Each client sends streaming requests one
after the other, cycling through Ollama ``/api/generate`` and ``/api/chat`` (NDJSON) and
OpenAI ``/v1/chat/completions`` and ``/v1/completions`` (SSE), alternating short and long
answers (``--short`` / ``--long`` tokens).

Counted: requests, requests that ended with their final chunk (``done: true`` /
``data: [DONE]``), errors by kind (HTTP 5xx, error events, streams cut short, exceptions,
other statuses), deliberate 503s (queue full, with ``Retry-After``) apart from errors; TTFT
measured by the client (request sent to first text) p50/p99; tokens received; and the resident
memory (VmRSS) of the daemon and its runner before the load, at its peak, and after it.

The last line printed is one JSON object with every figure. Exit status 1 when any error
was counted.

Usage::

    python benchmarks/soak.py [--clients 32] [--seconds 120] [--slots 4] [--threads N]
                              [--short 16] [--long 128] [--ctx 2048] [--max-queue 512]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from _daemon import daemon_env, free_port, start_daemon, stop, wait_http

MODEL = "smollm2:135m"


def rss_mib(pid: int | None) -> float | None:
    """VmRSS of ``pid`` in MiB (None when it is gone)."""
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


@dataclass
class Tally:
    """What all clients saw."""

    requests: int = 0
    completed: int = 0
    busy_503: int = 0
    tokens: int = 0
    ttfts_ms: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)

    def error(self, kind: str, detail: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1
        if len(self.examples) < 5:
            self.examples.append(f"{kind}: {detail[:300]}")


def _request(index: int, short: int, long: int) -> tuple[str, str, dict[str, Any]]:
    """(family, path, body) of a client's ``index``-th request."""
    tokens = long if index % 2 else short
    text = f"Request {index}: write about the sea, the sky and the mountains."
    messages = [{"role": "user", "content": text}]
    kind = index // 2 % 4
    options = {"num_predict": tokens, "temperature": 0.7, "seed": index}
    if kind == 0:
        return "ollama", "/api/generate", {"model": MODEL, "prompt": text, "options": options}
    if kind == 1:
        return "ollama", "/api/chat", {"model": MODEL, "messages": messages, "options": options}
    openai = {"max_tokens": tokens, "temperature": 0.7, "seed": index, "stream": True}
    if kind == 2:
        return "openai", "/v1/chat/completions", {"model": MODEL, "messages": messages, **openai}
    return "openai", "/v1/completions", {"model": MODEL, "prompt": text, **openai}


def _text_of(family: str, event: dict[str, Any]) -> str:
    if family == "ollama":
        return str(event.get("response") or (event.get("message") or {}).get("content") or "")
    parts = []
    for choice in event.get("choices") or []:
        parts.append((choice.get("delta") or {}).get("content") or choice.get("text") or "")
    return "".join(parts)


async def _one(
    http: httpx.AsyncClient, family: str, path: str, body: dict[str, Any], t: Tally
) -> None:
    t.requests += 1
    sent = time.perf_counter()
    first: float | None = None
    finished = False
    try:
        async with http.stream("POST", path, json=body) as response:
            if response.status_code == 503 and response.headers.get("retry-after"):
                await response.aread()
                t.busy_503 += 1
                return
            if response.status_code != 200:
                detail = (await response.aread()).decode(errors="replace")
                kind = "http_5xx" if response.status_code >= 500 else "http_other"
                t.error(kind, f"{response.status_code} {detail}")
                return
            async for line in response.aiter_lines():
                if not line.strip():
                    continue
                if family == "openai":
                    payload = line.removeprefix("data: ").strip()
                    if payload == "[DONE]":
                        finished = True
                        break
                    event = json.loads(payload)
                else:
                    event = json.loads(line)
                if "error" in event:
                    t.error("error_event", json.dumps(event))
                    return
                if _text_of(family, event):
                    t.tokens += 1
                    if first is None:
                        first = time.perf_counter()
                if family == "ollama" and event.get("done") is True:
                    finished = True
                    break
    except Exception as exc:
        t.error("exception", f"{type(exc).__name__}: {exc}")
        return
    if not finished:
        t.error("cut_short", f"{path} ended without its final chunk")
        return
    t.completed += 1
    if first is not None:
        t.ttfts_ms.append((first - sent) * 1000)


async def _client(
    url: str, number: int, deadline: float, args: argparse.Namespace, t: Tally
) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=args.request_timeout) as http:
        index = number
        while time.monotonic() < deadline:
            family, path, body = _request(index, args.short, args.long)
            await _one(http, family, path, body, t)
            index += 1


async def _sample_rss(pids: list[int | None], peaks: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        for i, pid in enumerate(pids):
            value = rss_mib(pid)
            if value is not None:
                peaks[i] = max(peaks[i], value)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)


async def _soak(
    url: str, args: argparse.Namespace, pids: list[int | None]
) -> tuple[Tally, list[float], float]:
    tally = Tally()
    peaks = [0.0 for _ in pids]
    stop = asyncio.Event()
    sampler = asyncio.create_task(_sample_rss(pids, peaks, stop))
    started = time.monotonic()
    deadline = started + args.seconds
    await asyncio.gather(*(_client(url, n, deadline, args, tally) for n in range(args.clients)))
    wall = time.monotonic() - started
    stop.set()
    await sampler
    return tally, peaks, wall


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _runner_pid(url: str) -> int | None:
    models = httpx.get(f"{url}/api/ps", timeout=10).json()["models"]
    return next((m.get("runner_pid") for m in models), None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--slots", type=int, default=4, help="LOCALLLM_NUM_PARALLEL")
    parser.add_argument("--threads", type=int, default=0, help="LOCALLLM_NUM_THREADS (0: cores)")
    parser.add_argument("--short", type=int, default=16, help="tokens of a short answer")
    parser.add_argument("--long", type=int, default=128, help="tokens of a long answer")
    parser.add_argument("--ctx", type=int, default=2048, help="LOCALLLM_CONTEXT_LENGTH")
    parser.add_argument("--max-queue", type=int, default=512, help="LOCALLLM_MAX_QUEUE")
    parser.add_argument("--request-timeout", type=float, default=600.0)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="localllm-soak-") as home:
        env, url = daemon_env(
            home,
            num_parallel=args.slots,
            num_threads=args.threads,
            context_length=args.ctx,
            max_queue=args.max_queue,
            # nothing of a soak may leave this machine
            registry=f"http://127.0.0.1:{free_port()}",
        )
        env["HF_ENDPOINT"] = f"http://127.0.0.1:{free_port()}"
        process = start_daemon(env)
        try:
            wait_http(url, process)
            warm = httpx.post(
                f"{url}/api/generate",
                json={
                    "model": MODEL,
                    "prompt": "Hi",
                    "stream": False,
                    "options": {"num_predict": 4},
                },
                timeout=600,
            )
            warm.raise_for_status()
            runner = _runner_pid(url)
            pids = [process.pid, runner]
            before = [rss_mib(pid) for pid in pids]
            print(
                f"soak: {args.clients} clients x {args.seconds:.0f}s on {MODEL}, "
                f"{args.slots} slots, daemon pid {process.pid}, runner pid {runner}",
                flush=True,
            )
            tally, peaks, wall = asyncio.run(_soak(url, args, pids))
            after = [rss_mib(pid) for pid in pids]
            runner_after = _runner_pid(url)
            alive = process.poll() is None
        finally:
            stop(process, timeout=60)
    status = process.returncode

    errors = sum(tally.errors.values())
    p50 = _percentile(tally.ttfts_ms, 0.5)
    p99 = _percentile(tally.ttfts_ms, 0.99)
    for example in tally.examples:
        print(f"  error {example}")
    print(
        f"requests {tally.requests}, completed {tally.completed}, errors {errors} "
        f"{tally.errors or ''}, deliberate 503s {tally.busy_503}"
    )
    if p50 is not None and p99 is not None:
        print(f"TTFT p50 {p50:.0f} ms, p99 {p99:.0f} ms; {tally.tokens / wall:.1f} chunks/s")
    print(
        f"daemon RSS {before[0]:.1f} MiB before, {peaks[0]:.1f} peak, {after[0]:.1f} after; "
        f"runner RSS {before[1] or 0:.1f} before, {peaks[1]:.1f} peak, {after[1] or 0:.1f} after"
    )
    summary = {
        "clients": args.clients,
        "seconds": round(wall, 1),
        "slots": args.slots,
        "requests": tally.requests,
        "completed": tally.completed,
        "errors": errors,
        "errors_by_kind": tally.errors,
        "busy_503": tally.busy_503,
        "ttft_p50_ms": round(p50, 1) if p50 is not None else None,
        "ttft_p99_ms": round(p99, 1) if p99 is not None else None,
        "chunks": tally.tokens,
        "chunks_per_s": round(tally.tokens / wall, 1),
        "daemon_rss_before_mib": round(before[0] or 0, 1),
        "daemon_rss_peak_mib": round(peaks[0], 1),
        "daemon_rss_after_mib": round(after[0] or 0, 1),
        "runner_rss_before_mib": round(before[1] or 0, 1),
        "runner_rss_peak_mib": round(peaks[1], 1),
        "runner_rss_after_mib": round(after[1] or 0, 1),
        "runner_restarted": runner_after != runner,
        "daemon_alive_at_end": alive,
        "daemon_exit_status": status,
    }
    print(json.dumps(summary))
    return 1 if errors or not alive or status != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
