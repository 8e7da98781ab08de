"""``predict.py`` over several fresh runs: the probe's figures of each run side by side (their
spread) and every predicted ÷ measured ratio, per run (issue 50: every decode and prefill
within ±20 % in three fresh runs).

    python benchmarks/predict_spread.py --template DIR [--runs 3] [predict.py's options]

``--template`` is a data root holding the models (made once: ``predict.py --make-only --home
DIR``). Each run gets a fresh data root (a copy of the template made of hard links: the same
blobs, no KV cache, speed book or anything else a run leaves) and a fresh cache directory (no
speed figures), so every prediction is the probe's alone, before any request of the model.
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from probe_spread import spread

HERE = Path(__file__).resolve().parent


def _fresh_root(template: Path, target: Path) -> None:
    """``target``: the template's manifests and blobs (hard links), nothing else."""
    for part in ("manifests", "blobs"):
        shutil.copytree(template / part, target / part, copy_function=os.link)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--template", required=True, type=Path)
    parser.add_argument("--runs", type=int, default=3)
    args, rest = parser.parse_known_args()
    runs: list[dict[str, Any]] = []
    for number in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="predict-run-", dir=args.template.parent) as top:
            home, cache = Path(top) / "home", Path(top) / "cache"
            _fresh_root(args.template, home)
            env = dict(os.environ, XDG_CACHE_HOME=str(cache))
            print(f"--- run {number + 1} (load average {os.getloadavg()[0]:.2f})", flush=True)
            done = subprocess.run(
                [sys.executable, str(HERE / "predict.py"), "--home", str(home), *rest],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
                check=True,
            )
            print(done.stdout, flush=True)
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))

    heads = [f"run {n + 1}" + ("" if r.get("probe_kept") else "*") for n, r in enumerate(runs)]
    print("\nthe probe's figures of each run (* not kept)")
    print(f"{'figure':22} " + " ".join(f"{h:>9}" for h in heads) + "   spread")
    for name in runs[0]["probe_figures"]:
        values = [r["probe_figures"][name] for r in runs]
        share = spread(values)
        print(
            f"{name:22} "
            + " ".join(f"{v:9.4g}" for v in values)
            + (f"   ±{share:.1%}" if share is not None else "")
        )
    for number, run in enumerate(runs):
        tries = run.get("probe_tries", [])
        print(
            f"run {number + 1}: {len(tries)} probe(s): "
            + "; ".join(
                f"{'kept' if t['kept'] else 'not kept'} in {t['seconds']} s after "
                f"{t['waited_for_quiet_s']} s waiting for quiet, others {t['others']:.2f} cores, "
                f"load average {t['load_average_before']}"
                for t in tries
            )
        )
    print(
        "probe seconds: "
        + ", ".join(str(r["probe_seconds"]) for r in runs)
        + "; load average before it: "
        + ", ".join(str(r.get("probe_load_average_before")) for r in runs)
        + "; others (cores): "
        + ", ".join(str(r["probe_others"]) for r in runs)
    )
    print("\npredicted ÷ measured, probe alone, each run")
    print(f"{'model':28} {'':8} " + " ".join(f"{h:>9}" for h in heads))
    within = True
    for name in runs[0]["models"]:
        for key in ("decode", "prefill"):
            ratios = [r["models"][name][key]["ratio"] for r in runs]
            within = within and all(x is not None and 0.8 <= x <= 1.2 for x in ratios)
            print(
                f"{name:28} {key:8} "
                + " ".join(f"{x:9.3f}" if x is not None else f"{'-':>9}" for x in ratios)
            )
    print(f"every ratio within 0.8-1.2 in every run: {within}")
    print(
        json.dumps(
            {"runs": runs, "within_20_percent": within, "cache_bytes": runs[0].get("cache_bytes")}
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
