"""Converting a ≥ 2 GB safetensors checkpoint: peak memory and throughput against ``cp``.

Writes a random-weight bf16 checkpoint shaped like Llama 3.2 1B (hidden 2048, 16 layers,
vocabulary 128256, tied embeddings: 2.47 GB in four shards, the largest tensor the 525 MB
embedding) with a small trained BPE tokenizer, then, interleaved and repeated, copies the shards
with ``cp`` and converts the folder in a child process, once per output type, in an order
rotated by one from pass to pass (what follows ``cp``'s deleted copy ran up to 2.6x slower than
the same code one place later) (``auto``, the
default: bf16 stays BF16, copied by the kernel; ``f16``: rounded on the CPU, what a model kept
unquantized is stored as). It reports each child's peak resident set (VmHWM), also above
what it held after its imports, against the bound of the issue (largest tensor + 512 MB), and
MB/s of source bytes for ``cp`` and each conversion (the child's whole run: start, imports,
tokenizer, weights, fsync, then ``sync``, as ``cp`` is timed with its ``sync``), with their
ratio of medians and the load average at each pass (the machine may be shared). All read the
same files, warm in the page cache after the first pass, and write to the same disk; with
``--cold`` the shards are dropped from the page cache (``posix_fadvise`` ``DONTNEED``, after a
``sync``) before every ``cp`` and every conversion, so that each reads them from the disk: the
disk's speed, not memory's, is then what ``cp`` measures. An output
type ``f16+sha256`` also hashes the file as it is written, as ``localllm create`` does for a
model it keeps unquantized (the file becomes the blob).

    python benchmarks/convert.py [--layers 16] [--repeat 3] [--outtypes auto,f16,f16+sha256]
                                 [--dir /tmp] [--cold] [--base CHECKOUT]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import safetensors

_CHILD = r"""
import json, sys, time
from pathlib import Path
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
from localllm.convert import convert_folder
import numpy, gguf, tokenizers, sentencepiece  # imported before the baseline is taken
base = hwm()
t = time.perf_counter()
outtype, _, hashed = sys.argv[3].partition("+")
r = convert_folder(Path(sys.argv[1]), Path(sys.argv[2]), outtype=outtype,
                   sha256=hashed == "sha256")
print(json.dumps({"seconds": time.perf_counter() - t, "base": base, "peak": hwm(),
                  "bytes_written": r.bytes_written, "tensors": r.tensor_count}))
"""


def _bf16(x: np.ndarray) -> np.ndarray:
    u = x.view(np.uint32)
    return (
        (u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
    ).astype(np.uint16)


def _tokenizer(folder: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = ["the quick brown fox jumps over the lazy dog " * 4, "safetensors to gguf " * 4]
    tok.train_from_iterator(
        text,
        trainers.BpeTrainer(
            vocab_size=300,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    tok.add_special_tokens(["<|begin_of_text|>", "<|end_of_text|>"])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"})
    )
    assert tok.get_vocab_size() < vocab_size


def write_checkpoint(folder: Path, layers: int, shards: int = 4) -> tuple[int, int]:
    """Write the checkpoint; returns (bytes of weights, bytes of the largest tensor)."""
    h, ffn, vocab, heads, kv = 2048, 8192, 128256, 32, 8
    hd = h // heads
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": h,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "intermediate_size": ffn,
        "vocab_size": vocab,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
    }
    (folder / "config.json").write_text(json.dumps(cfg))
    _tokenizer(folder, vocab)
    shapes = {"model.embed_tokens.weight": (vocab, h), "model.norm.weight": (h,)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (heads * hd, h),
                p + "self_attn.k_proj.weight": (kv * hd, h),
                p + "self_attn.v_proj.weight": (kv * hd, h),
                p + "self_attn.o_proj.weight": (h, heads * hd),
                p + "mlp.gate_proj.weight": (ffn, h),
                p + "mlp.up_proj.weight": (ffn, h),
                p + "mlp.down_proj.weight": (h, ffn),
            }
        )
    rng = np.random.default_rng(0)
    names = list(shapes)
    per = -(-len(names) // shards)
    weight_map, total = {}, 0
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        keep, specs = [], {}
        for name in names[s * per : (s + 1) * per]:
            # Random bf16 bits from a cheap generator: normal-ish values, never inf/nan.
            arr = _bf16(rng.standard_normal(shapes[name], dtype=np.float32) * 0.02)
            keep.append(arr)
            specs[name] = safetensors.TensorSpec(
                dtype="bfloat16", shape=arr.shape, data_ptr=arr.ctypes.data, data_len=arr.nbytes
            )
            weight_map[name] = fname
            total += arr.nbytes
        safetensors.serialize_file(specs, str(folder / fname), metadata={"format": "pt"})
        del keep, specs
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    return total, vocab * h * 2


def _evict(paths: list[str]) -> None:
    """Drop ``paths`` from the page cache, so that the next reader reads the disk."""
    subprocess.run(["sync"], check=True, timeout=900)
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _cached_share(paths: list[str]) -> float:
    """The share of ``paths``' pages in the page cache (``mincore``), to check an eviction."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    page = mmap.PAGESIZE
    resident = pages = 0
    for path in paths:
        size = os.path.getsize(path)
        count = (size + page - 1) // page
        # a private (copy-on-write) map: writable for ctypes, never written
        with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as m:
            vec = (ctypes.c_ubyte * count)()
            view = (ctypes.c_char * size).from_buffer(m)
            failed = libc.mincore(
                ctypes.c_void_p(ctypes.addressof(view)), ctypes.c_size_t(size), vec
            )
            del view  # the map cannot close while a view holds it
            if failed:
                raise OSError(ctypes.get_errno(), "mincore")
            resident += sum(b & 1 for b in bytes(vec))
        pages += count
    return resident / pages if pages else 0.0


def _cold(shards: list[str]) -> str:
    """Evict the shards; what was left cached, for the line printed."""
    _evict(shards)
    return f" (cached before: {_cached_share(shards):.0%})"


def _cp(shards: list[str], dst: Path) -> float:
    dst.mkdir()
    t = time.perf_counter()
    subprocess.run(["cp", *shards, str(dst)], check=True, timeout=900)
    subprocess.run(["sync"], check=True, timeout=900)
    seconds = time.perf_counter() - t
    shutil.rmtree(dst)
    return seconds


def _convert(src: Path, out: Path, outtype: str, base: str | None = None) -> tuple[float, dict]:
    """Convert in a child process; with ``base`` (a checkout's root), that checkout's
    converter (imported from it: the child starts outside any checkout)."""
    env = dict(os.environ)
    if base is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [base, env.get("PYTHONPATH")]))
    t = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(src), str(out), outtype],
        check=True,
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=out.parent,
        env=env,
    )
    subprocess.run(["sync"], check=True, timeout=900)
    seconds = time.perf_counter() - t
    out.unlink()
    return seconds, json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    """Write, then time cp and the conversions, interleaved."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--outtypes", default="auto,f16")
    ap.add_argument("--dir", default=None, help="where to write (a temporary folder in it)")
    ap.add_argument(
        "--base",
        default=None,
        help="a checkout's root: its converter too, interleaved with this one (outtype@base)",
    )
    ap.add_argument(
        "--cold",
        action="store_true",
        help="read the shards from the disk each time (drop them from the page cache)",
    )
    args = ap.parse_args()
    outtypes = args.outtypes.split(",")
    if args.base:
        outtypes = [name for o in outtypes for name in (o, f"{o}@base")]
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        src = Path(tmp) / "model"
        src.mkdir()
        t = time.perf_counter()
        total, largest = write_checkpoint(src, args.layers)
        print(
            f"checkpoint: {total / 1e9:.2f} GB bf16, largest tensor {largest / 1e6:.0f} MB "
            f"(written in {time.perf_counter() - t:.0f} s)",
            flush=True,
        )
        shards = sorted(str(p) for p in src.glob("*.safetensors"))
        cp_s: list[float] = []
        conv_s: dict[str, list[float]] = {o: [] for o in outtypes}
        peaks: dict[str, list[int]] = {o: [] for o in outtypes}
        loads = []
        # Every pass runs cp and each conversion once, in an order rotated by one each pass:
        # what runs just after cp (or after a conversion's file was deleted) is measured in
        # every position, not always in the same one (one position read 2.6x another for the
        # same code here: 822 vs 2126 MB/s).
        kinds = ["cp", *outtypes]
        for i in range(args.repeat):
            loads.append(os.getloadavg()[0])
            line = [f"pass {i + 1} (load {loads[-1]:.1f}):"]
            for kind_name in kinds[i % len(kinds) :] + kinds[: i % len(kinds)]:
                cold = _cold(shards) if args.cold else ""
                if kind_name == "cp":
                    cp_s.append(_cp(shards, Path(tmp) / "copy"))
                    line.append(f"cp{cold} {total / cp_s[-1] / 1e6:.0f} MB/s")
                    continue
                outtype = kind_name
                kind, _, base = outtype.partition("@")
                seconds, r = _convert(
                    src, Path(tmp) / "model.gguf", kind, args.base if base else None
                )
                conv_s[outtype].append(seconds)
                peaks[outtype].append(r["peak"])
                line.append(
                    f"{outtype}{cold} {total / seconds / 1e6:.0f} MB/s (in-process "
                    f"{r['seconds']:.1f} s, peak RSS {r['peak'] / 1e6:.0f} MB = "
                    f"{r['base'] / 1e6:.0f} after imports + "
                    f"{(r['peak'] - r['base']) / 1e6:.0f}, GGUF "
                    f"{r['bytes_written'] / 1e9:.2f} GB)"
                )
            print(line[0] + " " + "; ".join(line[1:]), flush=True)
        cp_rate = total / statistics.median(cp_s) / 1e6
        bound = largest + 512 * 2**20
        where = ", shards read from the disk" if args.cold else ""
        print(
            f"median of {args.repeat}{where}, load average {min(loads):.1f}-{max(loads):.1f}: "
            f"cp {cp_rate:.0f} MB/s"
        )
        for outtype in outtypes:
            rate = total / statistics.median(conv_s[outtype]) / 1e6
            peak = max(peaks[outtype])
            print(
                f"  {outtype}: {rate:.0f} MB/s, ratio to cp {rate / cp_rate:.2f}; peak RSS "
                f"{peak / 1e6:.0f} MB against the bound largest tensor + 512 MiB = "
                f"{bound / 1e6:.0f} MB: {'within' if peak <= bound else 'OVER'}"
            )


if __name__ == "__main__":
    main()
