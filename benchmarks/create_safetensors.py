"""What the entry point adds to a conversion: ``POST /api/create`` with a safetensors folder on a
real daemon (the converter in a child process with progress on a pipe, the F16 file hashed and
renamed into the store, the manifest) against the converter alone in a child process plus
hashing its output (the work any create must do), interleaved and repeated.

The checkpoint is the converter benchmark's random-weight Llama (hidden 2048, vocabulary
128256, tied embeddings; ``--layers`` sets its size: 2 layers are 0.78 GB). Prints one JSON
line per run and a summary with the medians and their ratio (entry point / baseline).

    python benchmarks/create_safetensors.py [--layers 2] [--repeat 3] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from _daemon import daemon_env, start_daemon, stop, wait_http

_CONVERT = (
    "import sys; from pathlib import Path; from localllm.convert import convert_folder; "
    "convert_folder(Path(sys.argv[1]), Path(sys.argv[2]))"
)


def _checkpoint_writer() -> object:
    spec = importlib.util.spec_from_file_location(
        "convert_bench", Path(__file__).with_name("convert.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.write_checkpoint


def _baseline(folder: Path, work: Path) -> float:
    """The converter in a child, then the sha256 of its output (what makes it a blob)."""
    out = work / "baseline.gguf"
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", _CONVERT, str(folder), str(out)], check=True)
    hasher = hashlib.sha256()
    with open(out, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            hasher.update(chunk)
    seconds = time.perf_counter() - start
    out.unlink()
    return seconds


def _entry(http: httpx.Client, folder: Path, name: str) -> float:
    start = time.perf_counter()
    lines = []
    with http.stream("POST", "/api/create", json={"model": name, "from": str(folder)}) as reply:
        for line in reply.iter_lines():
            if line.strip():
                lines.append(json.loads(line))
    seconds = time.perf_counter() - start
    if lines[-1].get("status") != "success":
        raise SystemExit(f"create failed: {lines[-1]}")
    http.request("DELETE", "/api/delete", json={"model": name}).raise_for_status()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write (a temporary folder in it)")
    args = parser.parse_args()
    write_checkpoint = _checkpoint_writer()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="create-st-") as tmp:
        root = Path(tmp)
        folder = root / "checkpoint"
        folder.mkdir()
        weights, _ = write_checkpoint(folder, args.layers)  # type: ignore[operator]
        env, url = daemon_env(root / "home", num_threads=1, speed_probe="off")
        daemon = start_daemon(env)
        try:
            wait_http(url, daemon)
            base, entry = [], []
            with httpx.Client(base_url=url, timeout=3600) as http:
                for round_ in range(args.repeat):
                    # interleaved, the order alternating: neither always gets a warmer cache
                    order = ("baseline", "entry") if round_ % 2 == 0 else ("entry", "baseline")
                    for which in order:
                        if which == "baseline":
                            seconds = _baseline(folder, root)
                            base.append(seconds)
                        else:
                            seconds = _entry(http, folder, f"bench:{round_}")
                            entry.append(seconds)
                        print(json.dumps({"run": which, "round": round_, "seconds": seconds}))
        finally:
            stop(daemon)
    summary = {
        "weights_bytes": weights,
        "baseline_median_s": statistics.median(base),
        "entry_median_s": statistics.median(entry),
        "ratio": statistics.median(entry) / statistics.median(base),
        "entry_mb_per_s": weights / 1e6 / statistics.median(entry),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
