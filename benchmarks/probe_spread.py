"""Fresh speed probes side by side: does the probe read the same machine the same way every time?

    python benchmarks/probe_spread.py [--probes 5] [--threads N] [--types Q4_K,Q8_0,...]

Runs the speed probe's child (daemon/speed/measure.py) ``--probes`` times, each from scratch
(nothing cached is read), and prints every figure that prices a model, one column a probe,
with how far the farthest is from their median (the target: within ±10 % on a quiet machine).
Before them: the last-level cache this machine reports and the working set the probe sized
from it. After each probe: whether the daemon would have kept it (its rounds agreed, and no
figure beyond what memory and the cores allow: daemon/speed/trust.py), and why not. The last
line is one JSON object with every figure. The machine is shared: the load average before
and after is printed; quote the figures with it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any

TARGET = 0.10


def _figures(figures: Any) -> dict[str, float]:
    """Every figure that prices a model, in units people read."""
    out = {
        "memory GB/s": figures.bandwidth / 1e9,
        "step fixed us": figures.decode_fixed * 1e6,
        "step per layer us": figures.decode_layer * 1e6,
        "batch fixed ms": figures.batch_fixed * 1e3,
        "batch per layer ms": figures.batch_layer * 1e3,
        "row ns": figures.row * 1e9,
        "runner step us": figures.runner_step * 1e6,
        "sampling ns/token": figures.sample_token * 1e9,
        "attention GFLOP/s": figures.attention / 1e9,
    }
    for name, rate in figures.types.items():
        out[f"{name} decode GB/s"] = rate.decode / 1e9
        out[f"{name} prefill GFLOP/s"] = rate.prefill / 1e9
    return out


def main() -> int:
    """Run the probes and print their figures side by side."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--probes", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="0: the runner's default")
    parser.add_argument("--types", default="", help="weight types (default: the probe's own)")
    args = parser.parse_args()

    from localllm.daemon.devices.cpu import decide, default_threads
    from localllm.daemon.devices.cpuspec import last_level_cache, peak_ops
    from localllm.daemon.speed import probe as speedprobe
    from localllm.daemon.speed.measure import working_set
    from localllm.daemon.speed.model import Calibration
    from localllm.settings import Settings

    settings = Settings.from_env(dict(os.environ))
    threads = args.threads or settings.num_threads or default_threads()
    types = [t for t in args.types.split(",") if t] or list(speedprobe.BASE_TYPES)
    paths = decide(settings, threads)
    if paths.error:
        print(paths.error, file=sys.stderr)
        return 1
    cache = last_level_cache()
    target, _ = working_set()
    peak = peak_ops(threads)
    said = (
        f"L{cache.level} {cache.size / 2**20:.0f} MiB x {cache.instances} ({cache.source})"
        if cache is not None
        else "not reported"
    )
    arithmetic = f"at most {peak / 1e9:.0f} GFLOP/s" if peak else "not reported"
    print(
        f"last-level cache: {said}; working set {target / 2**20:.0f} MiB; {threads} threads; "
        f"cores' arithmetic {arithmetic}",
        flush=True,
    )
    print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    runs: list[dict[str, float]] = []
    kept: list[str] = []
    for number in range(args.probes):
        report = speedprobe._run_child(threads, paths.repack, types, timeout=1800, keep_going=True)
        figures = Calibration.from_probe(report, "spread", 0.0)
        try:
            speedprobe._check(figures)
            verdict = "kept"
        except speedprobe.ProbeUnstable as exc:
            verdict = f"not kept: {exc}"
        kept.append(verdict)
        runs.append(_figures(figures))
        print(
            f"probe {number + 1}: others {figures.others:.2f} cores, widest round spread "
            f"{figures.spread:.1%}; {verdict}",
            flush=True,
        )
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    names = list(runs[0])
    width = max(len(n) for n in names)
    print(f"{'figure':{width}}  " + "  ".join(f"{i + 1:>8}" for i in range(len(runs))) + "  worst")
    worst: dict[str, float] = {}
    for name in names:
        values = [run.get(name, 0.0) for run in runs]
        middle = statistics.median(values)
        worst[name] = max(abs(v / middle - 1) for v in values) if middle else 0.0
        mark = "" if worst[name] <= TARGET else "  > ±10 %"
        cells = "  ".join(f"{v:8.2f}" for v in values)
        print(f"{name:{width}}  {cells}  {worst[name]:5.1%}{mark}")
    within = all(w <= TARGET for w in worst.values())
    print(f"every figure within ±{TARGET:.0%} of its median: {within}")
    print(
        json.dumps(
            {
                "cache": said,
                "working_set": target,
                "threads": threads,
                "runs": runs,
                "kept": kept,
                "worst": worst,
                "within_10_percent": within,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
