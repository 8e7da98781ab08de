"""Speed on a busy machine: the CPU governor against fixed threads, interleaved in one run.

A desktop is never idle, and llama.cpp's OpenMP threads spin at every barrier, so one busy
program beside a runner that uses every core can take its decode from full speed to one or
two tokens per second. This script measures what localllm keeps, as ratios of runs made in
the same minutes:

* ``on``: a daemon with the CPU governor (the default);
* ``off``: a daemon with ``LOCALLLM_GOVERNOR=off`` (a fixed thread count: what localllm did
  before the governor, and what Ollama and llama-server do);
* ``llama-server`` (``--llama-server PATH``, optional): llama.cpp's own server on the same
  GGUF with ``-t/-tb`` the same threads, single-stream scenarios only.

Scenarios, each run ``--repeat`` times, the servers interleaved (the order alternating):

1. **decode**: one greedy stream of ``--tokens`` tokens, idle and beside 1 and ``cores/2`` busy
   processes (``python -c 'while True: pass'``, each in its own session); the server's own
   decode rate (``eval_rate``, llama-server's ``predicted_per_second``);
2. **prefill**: one prompt of about ``--prompt-tokens`` tokens that no cache holds (a fresh
   number leads each), idle and beside 1 busy process; the server's prompt rate;
3. **two models**: the starter and its q8_0 quantization decoding at the same time, one stream
   each, against each alone, the same repetition: ``shared`` = the sum of each model's
   together/alone (time-sharing the cores gives 1.0), ``issue`` = their summed tokens/s
   against the faster one alone (the figure issue 33 reported: 0.40);
4. **8 clients**: 8 streams at once on one model (8 slots), idle and beside 1 busy process;
   all tokens received / the wave's wall time;
5. **after activity**: decode and prefill of a request sent the moment another program's
   burst ends (``cores`` busy processes for ``--burst`` seconds, then killed): an editor or an
   agent that just used the CPU, a build or a test run that just ended, the commonest case
   on a desktop (the idle rows wait 2 s of quiet instead);
6. **a load that comes and goes** (``rhythm``, only when asked): one process busy 0.3 s and
   quiet 0.3 s over and over (another server answering in turns, a tool run in a loop), and
   ``--rhythm-requests`` short prompts (``--rhythm-tokens``, no cache) sent at random moments
   of it, the same moments for every server; the mean prompt rate. The governor's rule for a
   request's first batch beside such a load (every thread, since what still runs is most
   often the end of a burst) costs where the load has come back: this measures both.

The ratios printed: ``on/off`` idle decode (the governor must not cost on an idle machine:
target ≥ 0.97), busy/idle for each server (target ≥ 0.5 for ``on`` with one busy process on 2
cores: the one-thread speed is the limit), two models ``shared`` (target ≥ 0.9), 8 clients
busy/idle, and after activity ``on/off`` decode and prefill (target ≥ 0.95: a burst that has
ended must cost nothing). The last line is one JSON object with every figure.

``--base PYTHON`` adds a third server, ``base``: a daemon with the governor on, started by
another interpreter whose ``localllm`` is the code before a change (a venv with another
checkout installed), in every scenario but the two-models one; ``on / base`` ratios say what
the change did, measured in the same minutes.

``--model PATH`` measures another GGUF (e.g. a random-weight Llama-3.2-1B shape written by
``predict.py``) in the single-model scenarios; the two-models scenario stays on the starter.

Usage::

    python benchmarks/contention.py [--repeat 3] [--tokens 96] [--threads N] [--model PATH]
        [--llama-server PATH] [--base PYTHON] [--burst 2] [--rhythm-requests 8]
        [--rhythm-tokens 64] [--only decode,prefill,two,clients,after,rhythm | idle]

``--only idle`` measures only the idle machine (decode and prefill, each after 2 s of quiet), the
A/B that says whether the governor costs anything there; use more ``--repeat`` for it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import httpx
from _daemon import free_port, start_daemon, stop, wait_http

from localllm.daemon.devices.cpu import default_threads
from localllm.starter import starter_gguf_path

STARTER = "smollm2:135m"
QUANTIZED = "smollm2:135m-q8"
BUSY = "while True: pass"
RHYTHM = (
    "import time\n"
    "while True:\n"
    "    end = time.monotonic() + 0.3\n"
    "    while time.monotonic() < end: pass\n"
    "    time.sleep(0.3)\n"
)
RHYTHM_PERIOD_S = 0.6
IDLE_SETTLE_S = 2.0


@contextlib.contextmanager
def busy(count: int) -> Iterator[None]:
    """``count`` processes spinning a core each, in sessions of their own, while the block
    runs (given a moment to start spinning first). With none, the block starts after the
    machine has been quiet for a moment: an idle machine is one that has been idle a while,
    not one whose last busy process ended a millisecond ago (how fast the governor takes the
    cores back after that is a transition of its own, logged by the runner)."""
    spinners = [
        subprocess.Popen([sys.executable, "-c", BUSY], start_new_session=True) for _ in range(count)
    ]
    try:
        time.sleep(0.5 if spinners else IDLE_SETTLE_S)
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


@contextlib.contextmanager
def after_activity(cores: int, seconds: float) -> Iterator[None]:
    """``cores`` busy processes for ``seconds``, then killed: the block starts the moment
    they are gone (after the machine was quiet for a moment before the burst)."""
    time.sleep(IDLE_SETTLE_S)
    spinners = [
        subprocess.Popen([sys.executable, "-c", BUSY], start_new_session=True) for _ in range(cores)
    ]
    time.sleep(seconds)
    for spinner in spinners:
        spinner.kill()
    for spinner in spinners:
        spinner.wait()
    yield


@contextlib.contextmanager
def comes_and_goes() -> Iterator[None]:
    """One process busy 0.3 s and quiet 0.3 s over and over while the block runs (given a few
    periods first, so that the readings have seen it come and go)."""
    spinner = subprocess.Popen([sys.executable, "-c", RHYTHM], start_new_session=True)
    try:
        time.sleep(4 * RHYTHM_PERIOD_S)
        yield
    finally:
        spinner.kill()
        spinner.wait()


def _prompt(words: int) -> str:
    # A number no earlier request started with: nothing of it is cached.
    lead = f"{time.time_ns()} "
    return lead + " ".join(f"word{i % 97}" for i in range(words))


def _words(url: str, body: dict[str, Any], tokens: int) -> int:
    """Words of :func:`_prompt` that make about ``tokens`` tokens for the server's model
    (``body``: its /tokenize request but the text)."""
    sample = _prompt(100)
    response = httpx.post(url + "/tokenize", json={**body, "content": sample}, timeout=600)
    response.raise_for_status()
    return max(10, round(100 * tokens / max(len(response.json()["tokens"]), 1)))


class Daemon:
    """A localllm daemon on a temporary home."""

    def __init__(
        self,
        name: str,
        home: str,
        threads: int,
        governor: bool,
        model: str | None = None,
        python: str | None = None,
    ) -> None:
        self.name = name
        self.path = model
        """A GGUF to measure in the single-model scenarios (None: the starter)."""
        self.model = "bench-model" if model else STARTER
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOCALLLM_")}
        env.update(
            LOCALLLM_HOME=home,
            LOCALLLM_HOST=f"127.0.0.1:{port}",
            LOCALLLM_NUM_PARALLEL="8",
            LOCALLLM_NUM_THREADS=str(threads),
            LOCALLLM_CONTEXT_LENGTH="2048",
            LOCALLLM_MAX_LOADED_MODELS="2",
            LOCALLLM_KEEP_ALIVE="-1",
            LOCALLLM_GOVERNOR="on" if governor else "off",
        )
        self.url = f"http://127.0.0.1:{port}"
        self.env = env
        self.words: dict[int, int] = {}
        self.process = start_daemon(env, python)

    def ready(self, models: list[str]) -> None:
        wait_http(self.url, self.process, 180, "/api/version")
        if self.path:
            command = [sys.executable, "-m", "localllm", "create", self.model, "--from", self.path]
            subprocess.run(command, env=self.env, check=True, stdout=subprocess.DEVNULL)
            models = [*models, self.model]
        if QUANTIZED in models:
            body = {
                "model": QUANTIZED,
                "from": STARTER,
                "quantize": "q8_0",
                "allow_requantize": True,
                "stream": False,
            }
            response = httpx.post(self.url + "/api/create", json=body, timeout=600)
            if response.status_code != 200:
                raise RuntimeError(f"could not create {QUANTIZED}: {response.text[:300]}")
        for model in models:
            self.generate(model, "Hello", 8)

    def generate(self, model: str, prompt: str, tokens: int) -> dict[str, Any]:
        body = {
            "model": model,
            "prompt": prompt,
            "stream": False,
            "options": {"temperature": 0, "num_predict": tokens, "seed": 1},
        }
        response = httpx.post(self.url + "/api/generate", json=body, timeout=600)
        response.raise_for_status()
        final: dict[str, Any] = response.json()
        return final

    def decode_rate(self, model: str, tokens: int) -> float:
        final = self.generate(model, "Tell me a long story about a dragon and a knight.", tokens)
        return float(final["eval_rate"])

    def prefill_rate(self, tokens: int) -> float:
        if tokens not in self.words:  # asked once, not between a burst and the request
            self.words[tokens] = _words(self.url, {"model": self.model}, tokens)
        final = self.generate(self.model, _prompt(self.words[tokens]), 1)
        return float(final["prompt_eval_rate"])

    def together(self, models: list[str], tokens: int) -> list[float]:
        """Each model's decode rate while all decode at once (one stream each)."""

        async def one(client: httpx.AsyncClient, model: str) -> float:
            body = {
                "model": model,
                "prompt": "Tell me a long story about a dragon and a knight.",
                "stream": False,
                "options": {"temperature": 0, "num_predict": tokens, "seed": 1},
            }
            response = await client.post(self.url + "/api/generate", json=body, timeout=600)
            response.raise_for_status()
            return float(response.json()["eval_rate"])

        async def all_of() -> list[float]:
            async with httpx.AsyncClient() as client:
                return list(await asyncio.gather(*(one(client, m) for m in models)))

        return asyncio.run(all_of())

    def wave(self, clients: int, tokens: int) -> float:
        """Tokens per second of ``clients`` streams at once: all tokens / the wave's time."""

        async def one(client: httpx.AsyncClient, index: int) -> int:
            body = {
                "model": self.model,
                "prompt": f"Story number {index}: once upon a time",
                "stream": False,
                "options": {"temperature": 0, "num_predict": tokens, "seed": index},
            }
            response = await client.post(self.url + "/api/generate", json=body, timeout=600)
            response.raise_for_status()
            return int(response.json()["eval_count"])

        async def all_of() -> float:
            async with httpx.AsyncClient() as client:
                started = time.perf_counter()
                counts = await asyncio.gather(*(one(client, i) for i in range(clients)))
                return sum(counts) / (time.perf_counter() - started)

        return asyncio.run(all_of())

    def threads(self) -> str:
        models = httpx.get(self.url + "/api/ps", timeout=10).json().get("models", [])
        return ", ".join(
            f"{m['name']} {m['threads']['decode']}/{m['threads']['max']}"
            for m in models
            if isinstance(m.get("threads"), dict)
        )

    def close(self) -> None:
        stop(self.process)


class LlamaServer:
    """llama.cpp's own server on the starter's GGUF (single-stream scenarios)."""

    def __init__(self, binary: str, threads: int, model: str | None = None) -> None:
        self.name = "llama-server"
        self.model = "model"
        self.words: dict[int, int] = {}
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        path = model or str(starter_gguf_path())
        command = [
            binary, "-m", path, "--host", "127.0.0.1", "--port", str(port),
            "-np", "1", "-c", "2048", "-t", str(threads), "-tb", str(threads), "--no-webui",
        ]  # fmt: skip
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def ready(self, models: list[str]) -> None:
        wait_http(self.url, self.process, 180, "/health")
        self._complete("Hello", 8)

    def _complete(self, prompt: str, tokens: int) -> dict[str, Any]:
        # ignore_eos: the raw prompt (no chat template here) often ends at once, and a decode
        # rate needs the tokens the daemons make.
        body = {
            "prompt": prompt,
            "n_predict": tokens,
            "temperature": 0,
            "cache_prompt": False,
            "ignore_eos": True,
        }
        response = httpx.post(self.url + "/completion", json=body, timeout=600)
        response.raise_for_status()
        timings: dict[str, Any] = response.json()["timings"]
        return timings

    def decode_rate(self, model: str, tokens: int) -> float:
        prompt = "Tell me a long story about a dragon and a knight."
        return float(self._complete(prompt, tokens)["predicted_per_second"])

    def prefill_rate(self, tokens: int) -> float:
        if tokens not in self.words:
            self.words[tokens] = _words(self.url, {}, tokens)
        return float(self._complete(_prompt(self.words[tokens]), 1)["prompt_per_second"])

    def threads(self) -> str:
        return ""

    def close(self) -> None:
        stop(self.process)


def _ratio(values: list[float], bases: list[float]) -> tuple[float, list[float]]:
    pairs = [v / b for v, b in zip(values, bases, strict=True) if b > 0]
    return (statistics.fmean(pairs) if pairs else float("nan")), pairs


def _show(label: str, pairs: tuple[float, list[float]], target: str = "") -> None:
    mean, each = pairs
    detail = ", ".join(f"{p:.3f}" for p in each)
    goal = f"   target {target}" if target else ""
    print(f"{label:<46} {mean:6.3f}  ({detail}){goal}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--prompt-tokens", type=int, default=400)
    parser.add_argument("--threads", type=int, default=0, help="0: the physical cores")
    parser.add_argument("--llama-server", help="a llama-server binary to measure as a peer")
    parser.add_argument("--only", default="decode,prefill,two,clients,after")
    parser.add_argument("--model", help="a GGUF for the single-model scenarios (the starter)")
    parser.add_argument("--burst", type=float, default=2.0, help="seconds of the burst before")
    parser.add_argument(
        "--base", help="a Python whose localllm is the code to compare with (a third server)"
    )
    parser.add_argument("--rhythm-requests", type=int, default=8)
    parser.add_argument("--rhythm-tokens", type=int, default=64)
    args = parser.parse_args()
    # A SIGTERM unwinds like Ctrl-C, so that no busy process or server outlives the script.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    threads = args.threads or default_threads()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else threads
    only = set(args.only.split(","))
    if "idle" in only:
        only |= {"decode", "prefill"}
    levels = [0] if "idle" in only else sorted({0, 1, max(1, cores // 2)})
    prefill_levels = (0,) if "idle" in only else (0, 1)
    models = [STARTER, QUANTIZED] if "two" in only else [STARTER]

    with contextlib.ExitStack() as homes:

        def home() -> str:
            return homes.enter_context(tempfile.TemporaryDirectory())

        servers: list[Any] = [
            Daemon("on", home(), threads, governor=True, model=args.model),
            Daemon("off", home(), threads, governor=False, model=args.model),
        ]
        if args.base:
            servers.append(Daemon("base", home(), threads, True, args.model, python=args.base))
        if args.llama_server:
            servers.append(LlamaServer(args.llama_server, threads, args.model))
        results: dict[str, Any] = {
            "threads": threads,
            "cores": cores,
            "repeat": args.repeat,
            "tokens": args.tokens,
        }
        try:
            for server in servers:
                server.ready(models)
                server.prefill_rate(args.prompt_tokens)  # sizes its prompt (a tokenize call)
                if "rhythm" in only:
                    server.prefill_rate(args.rhythm_tokens)
            runs: dict[str, list[float]] = {}

            def record(key: str, value: float) -> None:
                runs.setdefault(key, []).append(value)

            for repetition in range(args.repeat):
                order = servers if repetition % 2 == 0 else servers[::-1]
                for level in levels if "decode" in only else []:
                    for server in order:
                        with busy(level):
                            rate = server.decode_rate(server.model, args.tokens)
                            seen = server.threads()
                        record(f"{server.name}_decode_busy{level}", rate)
                        print(
                            f"[{repetition}] {server.name} decode, {level} busy: {rate:.1f} tok/s"
                            + (f" (threads {seen})" if seen else ""),
                            flush=True,
                        )
                for level in prefill_levels if "prefill" in only else ():
                    for server in order:
                        with busy(level):
                            rate = server.prefill_rate(args.prompt_tokens)
                        record(f"{server.name}_prefill_busy{level}", rate)
                        print(
                            f"[{repetition}] {server.name} prefill, {level} busy: {rate:.1f} tok/s",
                            flush=True,
                        )
                for server in order if "after" in only else ():
                    for kind in ("decode", "prefill"):
                        with after_activity(cores, args.burst):
                            if kind == "decode":
                                rate = server.decode_rate(server.model, args.tokens)
                            else:
                                rate = server.prefill_rate(args.prompt_tokens)
                            seen = server.threads()
                        record(f"{server.name}_{kind}_after", rate)
                        print(
                            f"[{repetition}] {server.name} {kind} after activity: {rate:.1f} "
                            f"tok/s" + (f" (threads {seen})" if seen else ""),
                            flush=True,
                        )
                for server in order if "rhythm" in only else ():
                    moments = random.Random(repetition)
                    with comes_and_goes():
                        rates = []
                        for _ in range(args.rhythm_requests):
                            time.sleep(moments.uniform(0, RHYTHM_PERIOD_S))
                            rates.append(server.prefill_rate(args.rhythm_tokens))
                    rate = statistics.fmean(rates)
                    record(f"{server.name}_prefill_rhythm", rate)
                    print(
                        f"[{repetition}] {server.name} prefill beside a load that comes and "
                        f"goes: {rate:.1f} tok/s (each: {', '.join(f'{r:.0f}' for r in rates)})",
                        flush=True,
                    )
                daemons = [s for s in order if isinstance(s, Daemon)]
                if "two" in only:
                    for server in (s for s in daemons if s.name != "base"):
                        alone = [server.decode_rate(m, args.tokens) for m in models]
                        both = server.together(models, args.tokens)
                        shared = sum(b / a for b, a in zip(both, alone, strict=True))
                        issue = sum(both) / max(alone)
                        record(f"{server.name}_two_shared", shared)
                        record(f"{server.name}_two_issue", issue)
                        print(
                            f"[{repetition}] {server.name} two models: alone "
                            f"{alone[0]:.1f} / {alone[1]:.1f}, together {both[0]:.1f} + "
                            f"{both[1]:.1f} tok/s: shared {shared:.3f}, issue's {issue:.3f}",
                            flush=True,
                        )
                for level in (0, 1) if "clients" in only else ():
                    for server in daemons:
                        with busy(level):
                            rate = server.wave(8, args.tokens)
                        record(f"{server.name}_clients8_busy{level}", rate)
                        print(
                            f"[{repetition}] {server.name} 8 clients, {level} busy: "
                            f"{rate:.1f} tok/s",
                            flush=True,
                        )
        finally:
            for server in servers:
                server.close()

    print()
    names = [s.name for s in servers]
    for key, values in runs.items():
        results[key] = statistics.median(values)
    if "decode" in only:
        _show(
            "idle decode, governor on / off",
            _ratio(runs["on_decode_busy0"], runs["off_decode_busy0"]),
            "≥ 0.97",
        )
        for name in names:
            for level in levels[1:]:
                pairs = _ratio(runs[f"{name}_decode_busy{level}"], runs[f"{name}_decode_busy0"])
                results[f"{name}_decode_busy{level}_vs_idle"] = pairs[0]
                goal = "≥ 0.5" if name == "on" and level == 1 else ""
                _show(f"{name}: decode beside {level} busy / idle", pairs, goal)
    if "prefill" in only and "idle" in only:
        _show(
            "idle prefill, governor on / off",
            _ratio(runs["on_prefill_busy0"], runs["off_prefill_busy0"]),
        )
    elif "prefill" in only:
        for name in names:
            pairs = _ratio(runs[f"{name}_prefill_busy1"], runs[f"{name}_prefill_busy0"])
            results[f"{name}_prefill_busy1_vs_idle"] = pairs[0]
            _show(f"{name}: prefill beside 1 busy / idle", pairs)
    if "two" in only:
        for name in ("on", "off"):
            shared, issue = runs[f"{name}_two_shared"], runs[f"{name}_two_issue"]
            mean = statistics.fmean(shared)
            _show(f"{name}: two models together, shared", (mean, shared), "≥ 0.9")
            _show(f"{name}: two models together, issue's measure", (statistics.fmean(issue), issue))
    if "after" in only:
        for kind in ("decode", "prefill"):
            pairs = _ratio(runs[f"on_{kind}_after"], runs[f"off_{kind}_after"])
            results[f"{kind}_after_on_vs_off"] = pairs[0]
            _show(f"{kind} after activity, governor on / off", pairs, "≥ 0.95")
            if "llama-server" in names:
                pairs = _ratio(runs[f"on_{kind}_after"], runs[f"llama-server_{kind}_after"])
                results[f"{kind}_after_on_vs_llama_server"] = pairs[0]
                _show(f"{kind} after activity, governor on / llama-server", pairs)
    if "rhythm" in only:
        pairs = _ratio(runs["on_prefill_rhythm"], runs["off_prefill_rhythm"])
        results["prefill_rhythm_on_vs_off"] = pairs[0]
        _show("prefill beside a load that comes and goes, on / off", pairs)
    # Every scenario the base ran (all but two models): what the change did.
    for key in [k for k in runs if k.startswith("on_") and "base_" + k[3:] in runs]:
        pairs = _ratio(runs[key], runs["base_" + key[3:]])
        results[f"{key[3:]}_on_vs_base"] = pairs[0]
        _show(f"{key[3:]}, on / base", pairs)
    if "clients" in only:
        for name in ("on", "off"):
            pairs = _ratio(runs[f"{name}_clients8_busy1"], runs[f"{name}_clients8_busy0"])
            results[f"{name}_clients8_busy1_vs_idle"] = pairs[0]
            _show(f"{name}: 8 clients beside 1 busy / idle", pairs)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
