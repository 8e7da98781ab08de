"""How much the machine itself drifts: the speed probe's decode figures and the memory's
bandwidth read again and again in one process, with the same models loaded, for minutes.

    python benchmarks/machine_drift.py [--seconds 180] [--types Q4_K,F16,Q8_0] [--window 10]

Issue 50 asks that five fresh probes agree within ±10 %. A probe takes about 10 s; if the
machine's own speed moves by more than that from one 10 s stretch to the next (a virtual
machine shares its host's memory with other guests), no probe of one moment can agree with one
taken at another. This reads, in one process and with nothing reloaded, each type's decode
step on the probe's own model (several times the last-level cache, as the probe builds it) and
the memory's bandwidth (the probe's numpy readers), one reading each about every 0.2 s; it
prints a line a second, then each figure's spread over the whole run and over the medians of
consecutive windows of a probe's length, with the cores other programs used and the time the
host took the CPUs away (steal) meanwhile. Nothing here is a model of a user's; the figures
are the probe's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path


def _cpu_times() -> tuple[int, int]:
    """(busy jiffies of all CPUs, steal jiffies) from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return user + nice + system + irq + softirq, steal


def _spread(values: list[float]) -> float:
    return (max(values) - min(values)) / (max(values) + min(values))


def main() -> int:
    """Read, print, summarise."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=180.0)
    parser.add_argument("--types", default="Q4_K,F16,Q8_0")
    parser.add_argument("--window", type=float, default=10.0, help="a probe's length, s")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    from localllm.daemon.speed import measure

    cache = measure.last_level_cache()
    reads = measure.working_set(cache)
    runner = measure._Runner(args.threads, repack=True)
    rounds = measure._Rounds(runner)
    readers: dict[str, tuple[object, int]] = {}
    with tempfile.TemporaryDirectory(prefix="localllm-drift-") as folder:
        for type_name in args.types.split(","):
            layer_bytes = measure._Weights(type_name).layer_bytes(measure._EMBD, measure._FFN)
            layers = max(1, min(measure._MAX_DECODE_LAYERS, -(-reads // layer_bytes)))
            path = Path(folder) / f"{type_name}.gguf"
            measure._write_model(
                path, type_name, measure._EMBD, measure._FFN, measure._HEADS, layers
            )
            (context,) = rounds.load(path, 2 * measure._ROUND_STEPS + 2)
            readers[f"{type_name} decode"] = (context.steps, layers * layer_bytes)
    memory, stop = measure._memory_reader(args.threads, reads)
    readers["memory"] = (memory, reads)
    print(
        f"last-level cache {cache and cache / 2**20:.0f} MiB, working set {reads / 2**20:.0f} "
        f"MiB, {args.threads} threads; GB/s every second (the best of that second's readings)",
        flush=True,
    )
    print(f"{'t, s':>6} " + " ".join(f"{n:>12}" for n in readers) + "   others  steal")
    series: dict[str, list[tuple[float, float]]] = {name: [] for name in readers}
    began = time.monotonic()
    try:
        while time.monotonic() - began < args.seconds:
            second = time.monotonic()
            busy0, steal0 = _cpu_times()
            cpu0 = time.process_time()
            best = dict.fromkeys(readers, 0.0)
            while time.monotonic() - second < 1.0:
                for name, (read, nbytes) in readers.items():
                    rate = nbytes / read() / 1e9  # type: ignore[operator]
                    best[name] = max(best[name], rate)
                    series[name].append((time.monotonic() - began, rate))
            busy1, steal1 = _cpu_times()
            spent = time.monotonic() - second
            ours = time.process_time() - cpu0
            others = max((busy1 - busy0) / 100 - ours, 0.0) / spent
            print(
                f"{time.monotonic() - began:6.1f} "
                + " ".join(f"{best[n]:12.1f}" for n in readers)
                + f"   {others:6.2f}  {(steal1 - steal0) / 100 / spent:5.2f}",
                flush=True,
            )
    finally:
        rounds.close()
        stop()
    summary = {}
    print(f"\nspread (±, half the range over the midpoint); windows of {args.window:g} s:")
    for name, points in series.items():
        rates = [rate for _, rate in points]
        windows: dict[int, list[float]] = {}
        for at, rate in points:
            windows.setdefault(int(at // args.window), []).append(rate)
        # a window's figure as a probe keeps one: its best readings' median (top quarter)
        kept = [
            statistics.median(sorted(w)[-max(1, len(w) // 4) :])
            for w in windows.values()
            if len(w) >= 4
        ]
        summary[name] = {
            "readings": len(rates),
            "min": round(min(rates), 1),
            "max": round(max(rates), 1),
            "windows": [round(k, 1) for k in kept],
            "window_spread": round(_spread(kept), 3) if len(kept) > 1 else None,
        }
        print(
            f"  {name:12} readings {min(rates):.1f}-{max(rates):.1f} GB/s; per window "
            + ", ".join(f"{k:.1f}" for k in kept)
            + (f": ±{_spread(kept):.1%}" if len(kept) > 1 else "")
        )
    print(json.dumps({"cache_bytes": cache, "working_set": reads, "figures": summary}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
