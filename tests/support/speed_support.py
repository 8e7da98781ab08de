"""Made-up speed figures for the tests (the probe itself is tested in test_speed.py)."""

from __future__ import annotations

import json
from pathlib import Path

from localllm.daemon.speed.model import Calibration, TypeRate

__all__ = ["make_calibration", "seed_calibration"]


def make_calibration(key: str = "test", threads: int = 2, **rates: TypeRate) -> Calibration:
    """Figures with these rates per type, 20 GB/s of memory and small fixed costs."""
    return Calibration(
        key=key,
        threads=threads,
        repack=True,
        bandwidth=20e9,
        decode_fixed=0.5e-3,
        decode_layer=0.1e-3,
        batch_fixed=2e-3,
        batch_layer=0.2e-3,
        batch=64,
        types=dict(rates),
    )


def seed_calibration(cache: Path, threads: int) -> Calibration:
    """Fixed figures (every ggml type at 10 GB/s and 50 GFLOP/s) where a daemon with
    ``threads`` threads and ``XDG_CACHE_HOME=cache`` looks for this machine's: no probe runs,
    not even for a type beyond the base ones (a small model's Q4_K_M falls back to Q5_0 for
    rows that are not a multiple of 256: probed on demand, that cost a test 10-15 s)."""
    from gguf import GGMLQuantizationType

    from localllm.daemon.speed.probe import probe_key

    rates = {t.name: TypeRate(decode=10e9, prefill=50e9) for t in GGMLQuantizationType}
    figures = make_calibration(probe_key(threads), threads, **rates)
    folder = cache / "localllm" / "speed-probe"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{figures.key}.json").write_text(json.dumps(figures.to_dict()))
    return figures
