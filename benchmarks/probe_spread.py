"""The speed probe's spread: several fresh probes on the same machine, each figure that
prices a model side by side, with its spread (issue 50: five fresh probes on a quiet machine
agree within ±10 % on every such figure).

    python benchmarks/probe_spread.py [--probes 5] [--threads N]

Each probe runs as the daemon runs it (:func:`~localllm.daemon.speed.probe.calibrate`,
``fresh``, its child process) with a cache directory of its own. A probe whose figures were
not kept (they did not agree from round to round, or broke a sanity bound) is counted and
shown as such, with its figures: they are what the probe measured. Printed per probe: its
wall time, the CPU seconds its child used, the load average before it, the cores other
programs used meanwhile and its rounds; then every figure, one column per probe, min-max and
±% (half the range over the midpoint). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from typing import Any

__all__ = ["figures_of", "spread"]

# The costs of a step that price a model besides the weight types' rates, in the unit shown
_COSTS = {
    "decode_fixed": ("ms", 1e3),
    "decode_layer": ("us", 1e6),
    "batch_fixed": ("ms", 1e3),
    "batch_layer": ("us", 1e6),
    "row": ("ns", 1e9),
    "runner_step": ("us", 1e6),
    "sample_token": ("ns", 1e9),
    "greedy_token": ("ns", 1e9),
    "attention": ("GFLOP/s", 1e-9),
    "decode_attention": ("GFLOP/s", 1e-9),
}


def figures_of(calibration: Any) -> dict[str, tuple[float, str]]:
    """Every figure of a calibration that prices a model (and the memory's bandwidth, the
    decode rates' bound), each with its unit, in the unit's scale."""
    out: dict[str, tuple[float, str]] = {"memory": (calibration.bandwidth / 1e9, "GB/s")}
    for name, rate in sorted(calibration.types.items()):
        out[f"{name} decode"] = (rate.decode / 1e9, "GB/s")
        out[f"{name} prefill"] = (rate.prefill / 1e9, "GFLOP/s")
    for name, expert in sorted(getattr(calibration, "experts", {}).items()):
        # a mixture-of-experts model's routed experts (measured when one is priced)
        out[f"{name} experts"] = (expert.prefill / 1e9, "GFLOP/s")
        out[f"{name} expert setup"] = (expert.setup * 1e12, "ps/weight")
    for name, (unit, scale) in _COSTS.items():
        out[name] = (getattr(calibration, name) * scale, unit)
    return out


def spread(values: list[float]) -> float | None:
    """Half the range over the midpoint (±share); None when there is nothing to compare."""
    if len(values) < 2 or max(values) + min(values) <= 0:
        return None
    return (max(values) - min(values)) / (max(values) + min(values))


def table(columns: list[dict[str, tuple[float, str]]], heads: list[str]) -> list[str]:
    """Lines: one row per figure, one column per probe, then min-max and ±%."""
    lines = [f"{'figure':22} {'unit':8} " + " ".join(f"{h:>8}" for h in heads) + "   spread"]
    for name in columns[0]:
        unit = columns[0][name][1]
        values = [c[name][0] for c in columns if name in c]
        share = spread(values)
        said = f"{min(values):.3g}-{max(values):.3g} ±{share:.1%}" if share is not None else ""
        lines.append(f"{name:22} {unit:8} " + " ".join(f"{v:8.3g}" for v in values) + f"   {said}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--probes", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="threads (0: the runner's)")
    args = parser.parse_args()

    from localllm.daemon.speed.measure import last_level_cache
    from localllm.daemon.speed.probe import ProbeUnsettled, calibrate
    from localllm.settings import Settings

    cache = last_level_cache()
    print(
        "last-level cache (read from /sys/devices/system/cpu/cpu0/cache): "
        + (f"{cache / 2**20:.0f} MiB" if cache else "not readable"),
        flush=True,
    )
    columns, heads, probes = [], [], []
    for number in range(args.probes):
        with tempfile.TemporaryDirectory(prefix="localllm-probe-spread-") as folder:
            os.environ["XDG_CACHE_HOME"] = folder  # a fresh cache: nothing measured before
            settings = Settings.from_env(dict(os.environ))
            load = os.getloadavg()[0]
            cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
            began = time.monotonic()
            kept = True
            try:
                figures = calibrate(settings, threads=args.threads or None, fresh=True)
            except ProbeUnsettled as exc:
                figures, kept = exc.figures, False
            seconds = time.monotonic() - began
            cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (
                cpu_after.ru_stime - cpu_before.ru_stime
            )
        probe = {
            "kept": kept,
            "why_not_kept": figures.why_not_kept(),
            "seconds": round(seconds, 1),
            "cpu_seconds": round(cpu, 1),
            "load_average_before": round(load, 2),
            "others": figures.others,
            "rounds": figures.rounds,
            "figures": {name: round(value, 4) for name, (value, _) in figures_of(figures).items()},
        }
        probes.append(probe)
        columns.append(figures_of(figures))
        heads.append(f"#{number + 1}" + ("" if kept else "*"))
        print(
            f"probe {number + 1}: {'kept' if kept else 'NOT KEPT (' + probe['why_not_kept'] + ')'}"
            f"; {seconds:.1f} s, {cpu:.1f} CPU s, {figures.rounds} rounds; load average before "
            f"{load:.2f}, other programs {figures.others:.2f} cores meanwhile",
            flush=True,
        )
    print()
    print("\n".join(table(columns, heads)))
    print("(* not kept: the probe said so and would be run again at a quieter moment)")
    worst = {name: spread([c[name][0] for c in columns]) for name in columns[0]}
    within = all(share is not None and share <= 0.10 for share in worst.values())
    print(
        json.dumps(
            {
                "cache_bytes": cache,
                "probes": probes,
                "kept": sum(p["kept"] for p in probes),
                "within_10_percent": within,
                "spreads": {k: round(v, 4) for k, v in worst.items() if v is not None},
                "load_average_after": round(os.getloadavg()[0], 2),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
