"""Predicted against measured speed: the speed model (daemon/speed.py) on every model this machine
has, as ratios.

    python benchmarks/predict.py [--rounds 3] [--tokens 128] [--models NAME ...] [--home DIR]

What it does, in one run:

1. the speed probe, measured afresh and timed (target: under 5 s);
2. a daemon on a temporary home (or ``--home``) with the starter SmolLM2-135M (Q4_1) and its
   q8_0 and f16 quantizations made with ``localllm quantize`` (requantized from Q4_1: the
   speed depends on the types, not on where the weights came from), and any ``--models`` of
   that home; speculative decoding off and the CPU governor off, so that what is measured is
   what the model predicts (plain decoding with every thread);
3. each model measured through ``/api/generate`` ``--rounds`` times, models interleaved round
   by round: a ~500-token prompt never seen before (prefill tokens/s, the daemon's
   ``prompt_eval_rate``) then ``--tokens`` generated tokens (decode tokens/s, ``eval_rate``);
   the best round of each counts, as a shared machine only ever makes a round slower (the
   probe keeps the best step likewise);
4. the predictions, from the model's GGUF header, its plan's context and the probe's figures:
   ``probe`` alone, and ``+served``: corrected by what the other models measured (the speed
   book's correction: the median of the seconds the probe alone missed per step, and per
   prompt token over the models of the same main weight type, leaving the predicted model
   out, as it works for a model not served yet).

Each line prints predicted, measured and predicted ÷ measured, probe alone / +served (the
target: every ratio within 0.75-1.25; ``probe_within_25_percent`` and
``served_within_25_percent`` in the JSON say whether each held). The last line is one JSON
object with every figure. The machine is shared: say what else ran when quoting the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from _daemon import free_port, start_daemon, stop

STARTER = "smollm2:135m"
QUANTIZED = {"smollm2:q8_0": "q8_0", "smollm2:f16": "f16"}
_WORDS = [
    "river", "stone", "garden", "window", "music", "paper", "table", "winter", "summer",
    "mountain", "ocean", "forest", "city", "road", "bridge", "castle", "dragon", "robot",
    "planet", "silver", "golden", "quiet", "bright", "ancient", "modern", "gentle", "wild",
]  # fmt: skip


def _prompt(seed: int, words: int = 380) -> str:
    rng = random.Random(seed)
    return f"[{seed}] " + " ".join(rng.choice(_WORDS) for _ in range(words))


def _cli(env: dict[str, str], *args: str) -> None:
    subprocess.run([sys.executable, "-m", "localllm", *args], env=env, check=True)


def _measure(http: httpx.Client, model: str, seed: int, tokens: int) -> dict[str, float]:
    answer = http.post(
        "/api/generate",
        json={
            "model": model,
            "prompt": _prompt(seed),
            "raw": True,
            "stream": False,
            "options": {"num_predict": tokens, "temperature": 0, "seed": seed},
        },
    )
    answer.raise_for_status()
    data = answer.json()
    return {
        "prefill": float(data["prompt_eval_rate"]),
        "decode": float(data["eval_rate"]),
        "prompt_tokens": float(data["prompt_eval_count"]),
        "generated": float(data["eval_count"]),
    }


def _ratio(predicted: float | None, measured: float) -> float | None:
    return round(predicted / measured, 3) if predicted and measured else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128, help="tokens generated a round")
    parser.add_argument("--models", nargs="*", default=[], help="more models of the home")
    parser.add_argument("--home", help="a data root with models (default: a temporary one)")
    args = parser.parse_args()

    from localllm.daemon.memlayout import layout_from_gguf
    from localllm.daemon.runner.speedprobe import calibrate
    from localllm.daemon.speed import corrected as speed_corrected
    from localllm.daemon.speed import model_cost, predict
    from localllm.gguf_info import inspect_gguf
    from localllm.settings import Settings
    from localllm.store.models import load_model
    from localllm.store.store import Store

    temporary = tempfile.TemporaryDirectory(prefix="localllm-predict-")
    home = Path(args.home) if args.home else Path(temporary.name) / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCALLLM_")}
    env.update(
        LOCALLLM_HOME=str(home),
        LOCALLLM_HOST=f"127.0.0.1:{free_port()}",
        LOCALLLM_SPECULATIVE="off",
        LOCALLLM_GOVERNOR="off",
        LOCALLLM_NUM_PARALLEL="1",
        LOCALLLM_KEEP_ALIVE="10m",
        LOCALLLM_MAX_LOADED_MODELS="1",
    )
    settings = Settings.from_env(env)
    print(
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}; "
        f"load average before: {os.getloadavg()[0]:.2f}",
        flush=True,
    )

    started = time.monotonic()
    calibration = calibrate(settings, fresh=True)
    probe_seconds = time.monotonic() - started
    print(f"speed probe: {probe_seconds:.1f} s; {calibration.describe()}", flush=True)

    daemon = start_daemon(env)
    results: dict[str, Any] = {"probe_seconds": round(probe_seconds, 2), "models": {}}
    try:
        base = settings.base_url
        with httpx.Client(base_url=base, timeout=600) as http:
            for _ in range(600):
                try:
                    http.get("/")
                    break
                except httpx.TransportError:
                    time.sleep(0.1)
            _cli(env, "pull", STARTER)
            for name, quant in QUANTIZED.items():
                _cli(env, "quantize", STARTER, name, "-q", quant, "--allow-requantize")
            names = [STARTER, *QUANTIZED, *args.models]
            best: dict[str, dict[str, float]] = {n: {} for n in names}
            for round_number in range(args.rounds):
                order = names if round_number % 2 == 0 else list(reversed(names))
                for name in order:
                    seed = 1000 * round_number + names.index(name)
                    got = _measure(http, name, seed, args.tokens)
                    mine = best[name]
                    for key in ("prefill", "decode"):
                        mine[key] = max(mine.get(key, 0.0), got[key])
                    mine["context"] = got["prompt_tokens"] + got["generated"] / 2
                    print(
                        f"round {round_number + 1} {name}: prefill {got['prefill']:.0f}, "
                        f"decode {got['decode']:.1f} tokens/s",
                        flush=True,
                    )
            contexts = {m["name"]: m for m in http.get("/api/ps").json()["models"]}
    finally:
        stop(daemon)

    store = Store(settings.data_dir)
    probe_only: dict[str, dict[str, float | None]] = {}
    main_types: dict[str, str | None] = {}
    for name in best:
        model = load_model(store, name)
        parts = [inspect_gguf(p) for p in model.gguf_paths]
        cost = model_cost(parts, layout_from_gguf(parts, settings.kv_cache_type).kv_per_cell)
        guess = predict(cost, calibration, context=round(best[name]["context"]))
        probe_only[name] = {"decode": guess.decode_full, "prefill": guess.prefill}
        main_types[name] = cost.main_type
    del contexts

    within = served_within = True
    print(f"\n{'model':16} {'':8} {'predicted':>10} {'+served':>8} {'measured':>9}  ratios")
    for name, measured in best.items():
        entry: dict[str, Any] = {}
        for key in ("decode", "prefill"):
            predicted = probe_only[name][key]
            # the speed book's correction, learned from the other models (seconds missed;
            # a prompt token's only from models of the same main weight type, as the book)
            gaps = [
                1 / measured_other[key] - 1 / probe_only[other][key]  # type: ignore[operator]
                for other, measured_other in best.items()
                if other != name
                and probe_only[other][key]
                and (key == "decode" or main_types[other] == main_types[name])
            ]
            corrected = (
                1 / speed_corrected(1 / predicted, statistics.median(gaps) if gaps else 0.0)
                if predicted
                else None
            )
            ratio, ratio_served = _ratio(predicted, measured[key]), _ratio(corrected, measured[key])
            entry[key] = {
                "predicted": round(predicted, 1) if predicted else None,
                "predicted_served": round(corrected, 1) if corrected else None,
                "measured": round(measured[key], 1),
                "ratio": ratio,
                "ratio_served": ratio_served,
            }
            within = within and ratio is not None and 0.75 <= ratio <= 1.25
            served_within = (
                served_within and ratio_served is not None and 0.75 <= ratio_served <= 1.25
            )
            print(
                f"{name:16} {key:8} {predicted or 0:10.1f} {corrected or 0:8.1f} "
                f"{measured[key]:9.1f}  {ratio} / {ratio_served}"
            )
        results["models"][name] = entry
    results["probe_within_25_percent"] = within
    results["served_within_25_percent"] = served_within
    results["probe_under_5_s"] = probe_seconds < 5
    results["load_average_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(results))
    temporary.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
