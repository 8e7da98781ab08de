"""Predicted against measured speed: the speed model (daemon/speed/model.py) on models of several
shapes
and weight types, none of which any of its figures was fitted to, as ratios.

    python benchmarks/predict.py [--rounds 3] [--tokens 96] [--models NAME ...] [--home DIR]
                                 [--threads N] [--keep-sources] [--warmup 0]

What it does, in one run:

1. the speed probe, measured afresh and timed (a probe whose figures were not kept is said
   so, and its figures used all the same);
2. a daemon on ``--home`` (default: a folder in the user's cache dir, kept between runs so
   that the models are made once) holding:

   * the starter SmolLM2-135M (Q4_1) and its q8_0 and f16 quantizations (``localllm
     quantize``, requantized from Q4_1: the speed depends on the types, not on where the
     weights came from);
   * random-weight models with published models' shapes (``_shapes.py``: Llama 3.2 1B and
     3B, Qwen3 0.6B, Gemma 3 270M with its 262k-token vocabulary, a small Qwen3-MoE), written
     in F16 and quantized by ``localllm create --from FILE --quantize`` to K-quants (whose
     tensors mix Q4_K and Q6_K, with legacy types where rows are not a multiple of 256) and
     legacy quants (Q4_0, Q8_0);

   speculative decoding off and the CPU governor off, so that what is measured is what the
   model predicts (plain decoding with every thread);
3. each model measured through ``/api/generate`` ``--rounds`` times, models interleaved round
   by round: a prompt of about 500 tokens never seen before (prefill tokens/s, the daemon's
   ``prompt_eval_rate``) then ``--tokens`` generated tokens (decode tokens/s, ``eval_rate``);
   the best round of each counts, as a shared machine only ever makes a round slower (the
   probe keeps the best step likewise). Models are interleaved and one is loaded at a time,
   so each round loads its model again and measures its first request after the load;
   ``--warmup N`` sends N requests of the model, not measured, before each measured one (as
   ``llama-bench`` warms up before it times);
4. the predictions, from the model's GGUF header, the context it was measured at and the
   probe's figures: ``probe`` alone (what ``show`` says before the model ever served a
   request), and ``+served``: corrected by what the *other* models measured (the speed
   book's correction, leaving the predicted model out).

Each line prints predicted, measured and predicted ÷ measured, probe alone / +served (the
target: every probe-alone ratio within 0.8-1.2; ``probe_within_20_percent`` in the JSON).
The last line is one JSON object with every figure. The machine is shared: say what else ran
when quoting the figures (the load average before and after is printed).
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
from _daemon import daemon_env, start_daemon, stop, wait_http
from _shapes import SHAPES, write_shape
from probe_spread import figures_of

STARTER = "smollm2:135m"
# name -> (source: the starter, or a shape of _shapes.SHAPES; quantization)
MODELS: dict[str, tuple[str, str]] = {
    STARTER: (STARTER, ""),
    "smollm2:q8_0": (STARTER, "q8_0"),
    "smollm2:f16": (STARTER, "f16"),
    "shape-llama3.2-1b:q4_K_M": ("llama3.2-1b", "q4_K_M"),
    "shape-llama3.2-1b:q8_0": ("llama3.2-1b", "q8_0"),
    "shape-llama3.2-3b:q4_K_M": ("llama3.2-3b", "q4_K_M"),
    "shape-qwen3-0.6b:q4_K_M": ("qwen3-0.6b", "q4_K_M"),
    "shape-qwen3-0.6b:q4_0": ("qwen3-0.6b", "q4_0"),
    "shape-gemma3-270m:q4_K_M": ("gemma3-270m", "q4_K_M"),
    "shape-gemma3-270m:q8_0": ("gemma3-270m", "q8_0"),
    "shape-qwen3moe-mini:q4_K_M": ("qwen3moe-mini", "q4_K_M"),
}
PROMPT_TOKENS = 500
_WORDS = [
    "river", "stone", "garden", "window", "music", "paper", "table", "winter", "summer",
    "mountain", "ocean", "forest", "city", "road", "bridge", "castle", "dragon", "robot",
    "planet", "silver", "golden", "quiet", "bright", "ancient", "modern", "gentle", "wild",
]  # fmt: skip


# Each run's prompts lead with a number of their own: the daemon's KV tiers keep prompts on disk
# across restarts, and a prompt a home saw in an earlier run is restored, not prefilled.
_RUN = random.SystemRandom().randrange(10**9)


def _prompt(seed: int, words: int) -> str:
    rng = random.Random(seed)
    return f"[{_RUN}-{seed}] " + " ".join(rng.choice(_WORDS) for _ in range(words))


def _cli(env: dict[str, str], *args: str) -> None:
    subprocess.run([sys.executable, "-m", "localllm", *args], env=env, check=True)


def _make_models(env: dict[str, str], http: httpx.Client, names: list[str], scratch: Path) -> None:
    """Create the models of ``names`` the home lacks (sources written, quantized, removed)."""
    have = {m["name"] for m in http.get("/api/tags").json()["models"]}
    missing = [n for n in names if n not in have and f"{n}:latest" not in have]
    if STARTER in names and STARTER not in have:
        _cli(env, "pull", STARTER)
    by_source: dict[str, list[str]] = {}
    for name in missing:
        by_source.setdefault(MODELS[name][0], []).append(name)
    for source, made in by_source.items():
        if source == STARTER:
            for name in made:
                if name != STARTER:
                    _cli(
                        env, "quantize", STARTER, name, "-q", MODELS[name][1], "--allow-requantize"
                    )
            continue
        path = scratch / f"{source}.f16.gguf"
        print(f"writing {path.name} ({SHAPES[source].parameters / 1e9:.2f}B weights)", flush=True)
        write_shape(path, SHAPES[source])
        try:
            for name in made:
                _cli(env, "create", name, "--from", str(path), "--quantize", MODELS[name][1])
        finally:
            path.unlink()


def _words_for(http: httpx.Client, model: str) -> int:
    """Words of the prompt that make about PROMPT_TOKENS tokens for ``model``."""
    sample = _prompt(0, 100)
    answer = http.post("/tokenize", json={"model": model, "content": sample})
    answer.raise_for_status()
    tokens = len(answer.json()["tokens"])
    return max(10, round(100 * PROMPT_TOKENS / max(tokens, 1)))


def _measure(
    http: httpx.Client, model: str, seed: int, words: int, tokens: int
) -> dict[str, float]:
    answer = http.post(
        "/api/generate",
        json={
            "model": model,
            "prompt": _prompt(seed, words),
            "raw": True,
            "stream": False,
            # Ollama's default sampling (what the prediction prices), a fixed seed
            "options": {"num_predict": tokens, "seed": seed},
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


def _cost(settings: Any, name: str) -> Any:
    """What a token costs the model ``name`` of the home (a ``ModelCost``)."""
    from localllm.daemon.memory.layout import layout_from_gguf
    from localllm.daemon.speed.model import model_cost
    from localllm.gguf_info import inspect_gguf
    from localllm.store.models import load_model
    from localllm.store.store import Store

    model = load_model(Store(settings.data_dir), name)
    parts = [inspect_gguf(p) for p in model.gguf_paths]
    return model_cost(parts, layout_from_gguf(parts, settings.kv_cache_type).kv_per_cell)


_COSTS = (
    "decode_fixed",
    "decode_layer",
    "batch_fixed",
    "batch_layer",
    "row",
    "runner_step",
    "sample_token",
    "greedy_token",
    "others",
)


def _best_of(probes: list[Any]) -> Any:
    """One calibration from several probes: each rate the highest measured, each cost the
    lowest (a busy moment only ever makes a figure worse)."""
    from localllm.daemon.speed.model import Calibration, ExpertRate, TypeRate

    data = probes[0].to_dict()
    for name in data:
        values = [p.to_dict()[name] for p in probes]
        if name == "types":
            data[name] = {
                t: TypeRate(
                    max(v[t]["decode"] for v in values), max(v[t]["prefill"] for v in values)
                )
                for t in values[0]
            }
        elif name == "experts":
            data[name] = {
                t: ExpertRate(
                    max(v[t]["prefill"] for v in values), min(v[t]["setup"] for v in values)
                )
                for t in values[0]
            }
        elif name in ("bandwidth", "attention"):
            data[name] = max(values)
        elif name in _COSTS:
            data[name] = min(values)
    return Calibration(**data)


def _wait_for_quiet(cores: float = 0.4, span: float = 2.0, limit: float = 300.0) -> float:
    """Seconds waited until other programs used under ``cores`` for ``span`` seconds (as the
    daemon waits before its probe; at most ``limit``)."""
    from localllm.daemon.devices.procfs import allowed_cpus, read_cpu

    cpus = allowed_cpus()
    began = time.monotonic()
    quiet_since: float | None = None
    last = read_cpu(cpus)
    while last is not None and time.monotonic() - began < limit:
        time.sleep(0.5)
        now = read_cpu(cpus)
        if now is None:
            break
        others = ((now.busy - last.busy) - (now.own - last.own)) / max(now.at - last.at, 1e-6)
        last = now
        quiet_since = (quiet_since or now.at) if others < cores else None
        if quiet_since is not None and now.at - quiet_since >= span:
            break
    return time.monotonic() - began


def _ratio(predicted: float | None, measured: float) -> float | None:
    return round(predicted / measured, 3) if predicted and measured else None


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=96, help="tokens generated a round")
    parser.add_argument(
        "--models", nargs="*", default=list(MODELS), help=f"of: {', '.join(MODELS)}"
    )
    parser.add_argument("--home", help="the data root the models are kept in")
    parser.add_argument("--threads", type=int, default=0, help="runner threads (0: the default)")
    parser.add_argument(
        "--probes", type=int, default=1, help="probes, between rounds, the best figures kept"
    )
    parser.add_argument("--make-only", action="store_true", help="make the models, measure nothing")
    parser.add_argument(
        "--warmup",
        type=int,
        default=0,
        help="unmeasured requests before each measured one (0: the first after a load)",
    )
    parser.add_argument(
        "--probe-tries", type=int, default=5, help="probes until one is kept (as the daemon)"
    )
    args = parser.parse_args()
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        parser.error(f"unknown models: {', '.join(unknown)}")

    from localllm.daemon.speed.measure import last_level_cache
    from localllm.daemon.speed.model import corrected as speed_corrected
    from localllm.daemon.speed.model import predict
    from localllm.daemon.speed.probe import ProbeUnsettled, calibrate
    from localllm.settings import Settings

    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    home = Path(args.home) if args.home else cache / "localllm-bench" / "predict"
    settings_env: dict[str, Any] = {
        "speculative": "off",
        "governor": "off",
        "num_parallel": 1,
        "keep_alive": "10m",
        "max_loaded_models": 1,
        "speed_probe": "off",  # measured below, afresh and timed
    }
    if args.threads:
        settings_env["num_threads"] = args.threads
    env, url = daemon_env(home, **settings_env)
    settings = Settings.from_env(env)
    llc = last_level_cache()
    print(
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}; "
        f"load average before: {os.getloadavg()[0]:.2f}; last-level cache (read from "
        "/sys/devices/system/cpu/cpu0/cache): "
        + (f"{llc / 2**20:.0f} MiB" if llc else "not readable"),
        flush=True,
    )

    daemon = start_daemon(env)
    results: dict[str, Any] = {"models": {}}
    try:
        wait_http(url, daemon, path="/")
        with httpx.Client(base_url=url, timeout=1800) as http:
            home.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(prefix="sources-", dir=home.parent) as scratch:
                _make_models(env, http, args.models, Path(scratch))
            if args.make_only:
                return 0
            # Every weight type the models hold is measured (Gemma's 640-wide rows make its
            # K-quants fall back to Q5_0 and Q8_0 in places), as `show` would on demand.
            costs = {name: _cost(settings, name) for name in args.models}
            types = sorted({t for cost in costs.values() for t in cost.types})
            # and the routed experts' types of a mixture-of-experts model (their own kernel)
            experts = sorted({t for cost in costs.values() for t in cost.expert_types})
            # As the daemon does: figures that were not kept are measured again at the next
            # quiet moment (up to --probe-tries); the last ones are used if none is kept.
            results["probe_tries"] = []
            for _ in range(max(args.probe_tries, 1)):
                quiet = _wait_for_quiet()
                started = time.monotonic()
                load = os.getloadavg()[0]
                try:
                    calibration = calibrate(settings, fresh=True, types=types, experts=experts)
                    results["probe_kept"] = True
                except ProbeUnsettled as exc:
                    calibration = exc.figures
                    results["probe_kept"] = False
                    print(f"speed probe NOT KEPT: {calibration.why_not_kept()}", flush=True)
                probe_seconds = time.monotonic() - started
                results["probe_tries"].append(
                    {
                        "kept": results["probe_kept"],
                        "seconds": round(probe_seconds, 1),
                        "waited_for_quiet_s": round(quiet, 1),
                        "others": calibration.others,
                        "load_average_before": round(load, 2),
                    }
                )
                if results["probe_kept"]:
                    break
            probes = [calibration]
            results["probe_seconds"] = round(probe_seconds, 2)
            results["probe_others"] = calibration.others
            results["probe_load_average_before"] = round(load, 2)
            results["probe_figures"] = {
                name: round(value, 4) for name, (value, _) in figures_of(calibration).items()
            }
            results["cache_bytes"] = calibration.cache_bytes
            print(
                f"speed probe: {probe_seconds:.1f} s (load average before {load:.2f}); "
                f"{calibration.describe()}",
                flush=True,
            )
            names = list(args.models)
            words = {name: _words_for(http, name) for name in names}
            best: dict[str, dict[str, float]] = {n: {} for n in names}
            for round_number in range(args.rounds):
                if 0 < round_number < args.probes:
                    # On a shared machine: the probe again between rounds, its best kept,
                    # as each model's best round is.
                    probes.append(calibrate(settings, fresh=True, types=types, experts=experts))
                    calibration = _best_of(probes)
                order = names if round_number % 2 == 0 else list(reversed(names))
                for name in order:
                    seed = 1000 * round_number + names.index(name) + 1
                    for extra in range(args.warmup):
                        # unmeasured: the model was just (re)loaded for this round
                        _measure(http, name, seed + 500_000 + extra, words[name], 4)
                    got = _measure(http, name, seed, words[name], args.tokens)
                    mine = best[name]
                    for key in ("prefill", "decode"):
                        mine[key] = max(mine.get(key, 0.0), got[key])
                    mine["context"] = got["prompt_tokens"] + got["generated"] / 2
                    mine["prompt_tokens"] = got["prompt_tokens"]
                    print(
                        f"round {round_number + 1} {name}: prefill {got['prefill']:.0f} "
                        f"({got['prompt_tokens']:.0f} tokens), decode {got['decode']:.1f} "
                        f"tokens/s",
                        flush=True,
                    )
    finally:
        stop(daemon)

    probe_only: dict[str, dict[str, float | None]] = {}
    main_types: dict[str, str | None] = {}
    for name in best:
        cost = costs[name]
        guess = predict(
            cost,
            calibration,
            context=round(best[name]["context"]),
            prompt=round(best[name]["prompt_tokens"]),
        )
        probe_only[name] = {"decode": guess.decode_full, "prefill": guess.prefill}
        main_types[name] = cost.main_type

    within = served_within = True
    worst = 1.0
    print(f"\n{'model':28} {'':8} {'predicted':>10} {'+served':>8} {'measured':>9}  ratios")
    for name, measured in best.items():
        entry: dict[str, Any] = {"main_type": main_types[name]}
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
            if ratio is not None:
                worst = max(worst, ratio, 1 / ratio)
            within = within and ratio is not None and 0.8 <= ratio <= 1.2
            served_within = (
                served_within and ratio_served is not None and 0.8 <= ratio_served <= 1.2
            )
            print(
                f"{name:28} {key:8} {predicted or 0:10.1f} {corrected or 0:8.1f} "
                f"{measured[key]:9.1f}  {ratio} / {ratio_served}"
            )
        results["models"][name] = entry
    results["probe_within_20_percent"] = within
    results["served_within_20_percent"] = served_within
    results["worst_ratio"] = round(worst, 3)
    results["load_average_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
