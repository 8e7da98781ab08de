"""How fast does the CLI answer? ``localllm --version`` and ``localllm list`` against the bare
interpreter's start (``python -c pass``), as ratios measured in the same run.

A daemon serves a temporary home (its TCP port a free one); the commands reach it through its
Unix socket, as a user's commands do (``--tcp``: through its TCP address). Each round runs the
three commands once, in an order that rotates from round to round, so that the machine's other
work falls on all three alike; ``--rounds`` rounds (default 30) after one warm-up round. Every
command runs as a user's does: the installed ``localllm`` script (``python -m localllm`` where
there is none), with byte-code caching on (``PYTHONDONTWRITEBYTECODE`` removed, the caches in a
temporary ``PYTHONPYCACHEPREFIX``, written by the warm-up round), stdout to /dev/null.

Printed: each command's median and best wall time, and each median's ratio to the interpreter's
(the target for ``list``: at most 4). The last line is one JSON object.

Usage::

    python benchmarks/cli_start.py [--rounds 30] [--tcp]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _daemon import daemon_env, start_daemon, stop

from localllm.client import Client
from localllm.settings import Settings


def _localllm() -> list[str]:
    script = Path(sys.executable).with_name("localllm")
    return [str(script)] if script.exists() else [sys.executable, "-m", "localllm"]


def _wall(command: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(
        command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=True
    )
    return time.perf_counter() - started


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--tcp", action="store_true", help="reach the daemon over TCP")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="localllm-cli-start-") as tmp:
        served, _ = daemon_env(Path(tmp) / "home")
        served.update(PYTHONPYCACHEPREFIX=str(Path(tmp) / "pycache"))
        served.pop("PYTHONDONTWRITEBYTECODE", None)
        env = dict(served)
        if not args.tcp:
            del env["LOCALLLM_HOST"]  # then the commands look for this home's socket only
        daemon = start_daemon(served)
        try:
            with Client(Settings.from_env(served), use_tcp=True) as client:
                if not client.wait_ready(60):
                    raise SystemExit("the daemon did not start")
            commands = {
                "python -c pass": [sys.executable, "-c", "pass"],
                "localllm --version": [*_localllm(), "--version"],
                "localllm list": [*_localllm(), "list"],
            }
            names = list(commands)
            times: dict[str, list[float]] = {name: [] for name in names}
            for number in range(args.rounds + 1):
                order = names[number % 3 :] + names[: number % 3]
                for name in order:
                    elapsed = _wall(commands[name], env)
                    if number:  # the first round writes the byte-code caches
                        times[name].append(elapsed)
        finally:
            stop(daemon)

    baseline = statistics.median(times[names[0]])
    result: dict[str, float] = {"rounds": args.rounds}
    for name in names:
        median = statistics.median(times[name])
        ratio = median / baseline
        print(
            f"{name:20} median {median * 1000:6.1f} ms  best {min(times[name]) * 1000:6.1f} ms"
            f"  x{ratio:.2f} the interpreter"
        )
        key = name.split()[-1].strip("-")
        result[f"{key}_ms"] = round(median * 1000, 1)
        result[f"{key}_ratio"] = round(ratio, 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
