"""What a daemon's start and stop cost: the wall time from ``python -m localllm.daemon`` to its
"listening" line, from SIGTERM to its exit, and the CPU seconds it used in all (its whole life,
about a second idle between), measured for this checkout against ``--base PYTHON`` (another
checkout's or venv's interpreter) in interleaved rounds, so the machine's other work falls on
both alike. The test suite starts about 150 daemons: this is their fixed cost.

Each daemon gets a fresh temporary home (the starter imported on its first start, as a user's
first start does) and a free port; the speed probe is off.

Printed: medians and ranges of each figure for each side, and the ratios of the medians; the
last line is one JSON object.

Usage::

    python benchmarks/daemon_lifecycle.py [--base PYTHON] [--rounds 8] [--idle 1.0]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def one_life(python: str, idle: float) -> tuple[float, float, float]:
    """(seconds to listening, seconds from SIGTERM to exit, CPU seconds of its life)."""
    with tempfile.TemporaryDirectory(prefix="localllm-life-") as home:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOCALLLM_")}
        env.update(
            LOCALLLM_HOME=home,
            LOCALLLM_HOST=f"127.0.0.1:{_free_port()}",
            LOCALLLM_SPEED_PROBE="off",
        )
        began = time.monotonic()
        process = subprocess.Popen(
            [python, "-m", "localllm.daemon"],
            env=env,
            cwd=home,  # never this checkout's package by way of the working directory
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert process.stderr is not None
        line = process.stderr.readline()
        listening = time.monotonic() - began
        if "listening" not in line:
            process.kill()
            raise SystemExit(f"{python}: the daemon did not start: {line}")
        time.sleep(idle)  # a daemon that served nothing: its fixed cost only
        asked = time.monotonic()
        process.send_signal(signal.SIGTERM)
        _, status, usage = os.wait4(process.pid, 0)
        stopped = time.monotonic() - asked
        process.stderr.close()
        if status != 0:
            raise SystemExit(f"{python}: the daemon exited with status {status}")
        return listening, stopped, usage.ru_utime + usage.ru_stime


def main() -> None:
    """Run the interleaved rounds and print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", help="another interpreter with localllm installed")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--idle", type=float, default=1.0, help="seconds between start and stop")
    args = parser.parse_args()
    sides = {"this": sys.executable}
    if args.base:
        sides["base"] = args.base
    figures: dict[str, list[tuple[float, float, float]]] = {name: [] for name in sides}
    for round_ in range(args.rounds):
        order = list(sides) if round_ % 2 == 0 else list(sides)[::-1]
        for name in order:
            figures[name].append(one_life(sides[name], args.idle))
    summary: dict[str, dict[str, float]] = {}
    for name, rows in figures.items():
        medians = {}
        for index, what in enumerate(("listening_s", "stop_s", "cpu_s")):
            values = [row[index] for row in rows]
            medians[what] = statistics.median(values)
            print(
                f"{name:>5} {what:<12} median {medians[what]:.3f}  "
                f"range {min(values):.3f}-{max(values):.3f}"
            )
        summary[name] = {k: round(v, 3) for k, v in medians.items()}
    if "base" in summary:
        ratios = {k: round(summary["this"][k] / summary["base"][k], 3) for k in summary["this"]}
        print("this / base: " + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items()))
        summary["ratio"] = ratios
    summary["load"] = {"loadavg_1m": round(os.getloadavg()[0], 2)}  # type: ignore[dict-item]
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
