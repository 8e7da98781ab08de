"""Whether llama.cpp's CPU code runs on this machine: a probe in a child process, and its decision.

llama.cpp is compiled for the machine that built the wheel, and some of its CPU paths fault
where they should not: ggml's AMX matrix multiply in some VMs (SIGILL at ``tilezero``, reached
because quantized weights are repacked into the AMX buffer type at load), or every path when
the wheel was built on a newer CPU than this one. A fault kills the process that runs it, so it
is found out in a child: the probe writes a tiny model whose weights have the types llama.cpp
repacks (Q4_0, Q4_1, Q8_0; rows and columns aligned as the AMX and CPU_REPACK kernels want),
then evaluates one batch and one single token with the runner's thread count (the AMX fault was
in ggml's worker threads), once with weight repacking (``use_extra_bufts``) and once without.

The decision — repacking on, repacking off because it crashed, or nothing runs here — is made
once per llama.cpp build, CPU and thread count and cached in the user's cache dir. Everything
that runs llama.cpp follows it: the runner (``--no-repack``), the in-process engine the tests
and benchmarks use (:class:`.model.LlamaModel`, :func:`model_params`), and the daemon before it
quantizes. ``LOCALLLM_CPU_REPACK=on|off`` overrides the probe.

Only the child (``python -m localllm.daemon.devices.cpu``) imports llama.cpp, so ``localllm
doctor`` can use this module without loading llama.cpp into the CLI.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import importlib.util
import json
import logging
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localllm._format import REBUILD_FOR_THIS_CPU, exit_status
from localllm._process import write_json
from localllm.settings import Settings

__all__ = [
    "PROBE_VERSION",
    "CpuPaths",
    "ProbeRun",
    "decide",
    "decision_key",
    "default_threads",
    "model_params",
    "record_crash",
]

log = logging.getLogger("localllm.cpu")

PROBE_VERSION = 1
"""Bumped when the probe's model or workload changes, so older decisions are made again."""
_PROBE_TIMEOUT_S = 180.0
_MODES = ("repack", "plain")
# Signals by which llama.cpp's native code dies on an instruction or memory fault.
_CRASH_SIGNALS = frozenset({signal.SIGILL, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE})

_decided: dict[tuple[Any, ...], CpuPaths] = {}
_decided_lock = threading.Lock()


def default_threads() -> int:
    """Physical cores available to this process (llama.cpp gains nothing from SMT siblings)."""
    available = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    )
    try:
        smt_active = Path("/sys/devices/system/cpu/smt/active").read_text().strip() == "1"
    except OSError:
        smt_active = False
    return max(1, available // 2 if smt_active and available > 1 else available)


@dataclass(frozen=True)
class ProbeRun:
    """How one probe child ended."""

    mode: str
    """``repack`` (weights in llama.cpp's extra buffer types) or ``plain``."""
    returncode: int | None
    """The child's exit status (negative: the signal that killed it); None: it timed out."""
    detail: str
    """One line: what it printed on success (the repacked buffers), or how it failed."""
    buffers: tuple[str, ...] = ()
    """Extra buffer types the weights went into (``CPU_REPACK``, ``AMX``); empty when none."""

    @property
    def ok(self) -> bool:
        """The batch and the single token were evaluated."""
        return self.returncode == 0

    @property
    def crashed(self) -> bool:
        """Killed by a fault of native code (an illegal instruction, a bad access)."""
        return self.returncode is not None and -self.returncode in _CRASH_SIGNALS

    def describe(self) -> str:
        """``the repack probe passed (CPU_REPACK buffers)``, ``... was killed by SIGILL``."""
        if self.ok:
            where = ", ".join(self.buffers) + " buffers" if self.buffers else "no repacked buffers"
            return f"the {self.mode} probe passed ({where})"
        if self.returncode is None:
            return f"the {self.mode} probe {self.detail}"
        tail = f": {self.detail}" if self.detail else ""
        return f"the {self.mode} probe {exit_status(self.returncode)}{tail}"


@dataclass(frozen=True)
class CpuPaths:
    """Which of llama.cpp's CPU paths to use here, and why."""

    repack: bool
    """Load weights with llama.cpp's extra buffer types (weight repacking)."""
    usable: bool
    """False when even the plain path crashed: nothing can run llama.cpp here."""
    reason: str
    """One sentence: why (the probe's outcome, the setting, a runner's crash)."""
    source: str
    """``probe`` (run now), ``cache`` (an earlier probe's), ``setting`` or ``runtime``."""
    key: str = ""
    """The build/CPU/threads fingerprint the decision is cached under."""
    runs: tuple[ProbeRun, ...] = ()
    """The probe children this decision came from."""
    fell_back: bool = False
    """Repacking is off because it crashed (the case worth a warning)."""
    cache_file: str = ""
    """Where the decision is cached ("" for a setting's, or one that is asked again)."""

    @property
    def warning(self) -> str | None:
        """The one warning to log when repacking is off because it crashed here."""
        if not self.fell_back:
            return None
        return (
            f"llama.cpp's weight repacking crashed on this CPU ({self.reason}); models load "
            "without it (slower prompt processing). LOCALLLM_CPU_REPACK=on forces it."
        )

    @property
    def error(self) -> str | None:
        """The one line a load fails with when nothing runs here; None when usable."""
        if self.usable:
            return None
        return f"llama.cpp cannot run on this CPU ({self.reason}); {REBUILD_FOR_THIS_CPU}"

    def to_json(self) -> dict[str, Any]:
        """The decision as JSON (the cache file, ``localllm doctor --json``)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str, cache_file: str) -> CpuPaths:
        """Read a cached decision (raises KeyError/TypeError/ValueError on a bad file)."""
        runs = tuple(
            ProbeRun(
                mode=str(run["mode"]),
                returncode=None if run["returncode"] is None else int(run["returncode"]),
                detail=str(run["detail"]),
                buffers=tuple(str(b) for b in run.get("buffers", ())),
            )
            for run in data["runs"]
        )
        return cls(
            repack=bool(data["repack"]),
            usable=bool(data["usable"]),
            reason=str(data["reason"]),
            source=source,
            key=str(data["key"]),
            runs=runs,
            fell_back=bool(data.get("fell_back", False)),
            cache_file=cache_file,
        )


# -- the fingerprint ------------------------------------------------------------------------


def _library_dir() -> Path | None:
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "lib"


def _cpu_identity() -> list[str]:
    """The CPU's vendor, model and feature flags (what a native build's paths depend on)."""
    wanted = ("vendor_id", "cpu family", "model", "model name", "stepping", "flags", "Features")
    found: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if not line.strip():
                if found:
                    break  # the first processor describes them all
                continue
            name, _, value = line.partition(":")
            if name.strip() in wanted:
                found[name.strip()] = value.strip()
    if not found:
        found["processor"] = platform.processor() or platform.machine()
    return [f"{name}={value}" for name, value in sorted(found.items())]


def decision_key(threads: int) -> str:
    """The fingerprint a decision is cached under: llama.cpp's library files (name, size,
    modification time), the CPU's identity and flags, the thread count and the probe's
    version."""
    parts = [f"probe={PROBE_VERSION}", f"threads={threads}", *_cpu_identity()]
    library = _library_dir()
    if library is not None and library.is_dir():
        for file in sorted(library.iterdir()):
            with contextlib.suppress(OSError):
                stat = file.stat()
                parts.append(f"{file.name}:{stat.st_size}:{stat.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


# -- running the probe ----------------------------------------------------------------------


def _probe_command() -> list[str]:
    return [sys.executable, "-P", "-m", "localllm.daemon.devices.cpu", "probe"]


def _run_probe(command: Sequence[str], mode: str, threads: int, timeout: float) -> ProbeRun:
    with tempfile.TemporaryDirectory(prefix="localllm-probe-") as workdir:
        try:
            done = subprocess.run(
                [*command, "--mode", mode, "--threads", str(threads), "--workdir", workdir],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return ProbeRun(mode, None, f"did not finish within {timeout:.0f} s")
        except OSError as exc:
            return ProbeRun(mode, 1, f"could not start ({exc})")
    out = done.stdout.decode("utf-8", "replace").strip().splitlines()
    if done.returncode == 0 and out:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            report = json.loads(out[-1])
            return ProbeRun(mode, 0, "passed", tuple(str(b) for b in report["buffers"]))
        return ProbeRun(mode, 1, f"printed no result ({out[-1][:200]})")
    errors = done.stderr.decode("utf-8", "replace").strip().splitlines()
    return ProbeRun(mode, done.returncode, errors[-1][:300] if errors else "")


def _judge(runs: dict[str, ProbeRun], key: str) -> tuple[CpuPaths, bool]:
    """The decision from the two probes, and whether it may be cached (a probe that failed for
    another reason than a crash says nothing about the CPU and is asked again next time)."""
    repack, plain = runs["repack"], runs["plain"]
    ran = tuple(runs[m] for m in _MODES)
    if repack.ok and plain.ok:
        return CpuPaths(True, True, repack.describe(), "probe", key, ran), True
    if plain.ok and repack.crashed:
        return CpuPaths(False, True, repack.describe(), "probe", key, ran, fell_back=True), True
    if plain.crashed and (repack.crashed or not repack.ok):
        return CpuPaths(False, False, plain.describe(), "probe", key, ran), True
    # Neither crashed (a timeout, a missing library, a bug of ours): keep llama.cpp's default,
    # and let a load report its own error.
    failed = next(run for run in ran if not run.ok)
    reason = f"{failed.describe()}; using llama.cpp's default (repacking on)"
    return CpuPaths(True, True, reason, "probe", key, ran), False


def _cache_file(cache_dir: Path, key: str) -> Path:
    return cache_dir / "cpu-probe" / f"{key}.json"


def _write_cached(file: Path, paths: CpuPaths) -> None:
    try:
        write_json(file, paths.to_json())
    except OSError as exc:
        log.warning("could not cache the CPU probe's decision in %s: %s", file, exc)


def _read_cached(file: Path, key: str) -> CpuPaths | None:
    try:
        paths = CpuPaths.from_json(json.loads(file.read_text()), "cache", str(file))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return paths if paths.key == key else None


def decide(
    settings: Settings | None = None,
    threads: int | None = None,
    *,
    probe_command: Sequence[str] | None = None,
    cache_dir: Path | None = None,
    timeout: float = _PROBE_TIMEOUT_S,
    fresh: bool = False,
) -> CpuPaths:
    """Which CPU paths to use with ``threads`` threads (0/None: the runner's default).

    ``LOCALLLM_CPU_REPACK=on|off`` decides at once; ``auto`` reads the cached decision for
    this build, CPU and thread count, or runs the probe (a few seconds, once) and caches it.
    ``fresh`` ignores both caches. Safe to call from several threads; blocks while probing.
    """
    settings = settings or Settings.from_env()
    threads = threads or settings.num_threads or default_threads()
    if settings.cpu_repack != "auto":
        on = settings.cpu_repack == "on"
        return CpuPaths(on, True, f"LOCALLLM_CPU_REPACK={settings.cpu_repack}", "setting")
    cache_dir = cache_dir or settings.cache_dir
    command = tuple(probe_command or _probe_command())
    memo = (threads, str(cache_dir), command)
    with _decided_lock:
        if not fresh and memo in _decided:
            return _decided[memo]
        key = decision_key(threads)
        file = _cache_file(cache_dir, key)
        paths = None if fresh else _read_cached(file, key)
        if paths is None:
            runs = {mode: _run_probe(command, mode, threads, timeout) for mode in _MODES}
            paths, cacheable = _judge(runs, key)
            if cacheable:
                paths = dataclasses.replace(paths, cache_file=str(file))
                _write_cached(file, paths)
        _decided[memo] = paths
        return paths


def record_crash(paths: CpuPaths, returncode: int) -> CpuPaths:
    """A runner with repacking on died by a native fault the probe did not catch (a weight type
    it does not cover): repacking goes off from now on, remembered where ``paths`` is."""
    if not paths.repack or paths.source == "setting" or -returncode not in _CRASH_SIGNALS:
        return paths
    reason = f"a runner with weight repacking {exit_status(returncode)}"
    fallback = dataclasses.replace(
        paths, repack=False, reason=reason, source="runtime", fell_back=True
    )
    if paths.cache_file:
        _write_cached(Path(paths.cache_file), fallback)
    with _decided_lock:
        for memo, known in list(_decided.items()):
            if known.key == paths.key and known.cache_file == paths.cache_file:
                _decided[memo] = fallback
    return fallback


# -- what runs llama.cpp in this process ----------------------------------------------------


def model_params(paths: CpuPaths | None = None) -> Any:
    """``llama_model_default_params()`` with weight repacking as decided (for tests, benchmarks
    and reference loops that load a model with llama.cpp directly)."""
    import llama_cpp

    paths = paths or decide()
    if paths.error:
        raise RuntimeError(paths.error)
    params = llama_cpp.llama_model_default_params()
    params.use_extra_bufts = paths.repack
    return params


# -- the child ------------------------------------------------------------------------------

# The probe model: llama architecture, 2 layers, 256-wide (a multiple of what AMX's K-quant
# kernels align to), FFN 512, 4 heads, 320 tokens; the output rows are multiples of 32.
_EMBD, _FFN, _HEADS, _LAYERS, _VOCAB = 256, 512, 4, 2, 320
_BATCH = 64


def _write_probe_model(path: Path) -> None:
    import gguf
    import numpy as np

    from .synthetic import write_llama

    rng = np.random.default_rng(0)
    q4_0, q4_1, q8_0 = (
        gguf.GGMLQuantizationType.Q4_0,
        gguf.GGMLQuantizationType.Q4_1,
        gguf.GGMLQuantizationType.Q8_0,
    )

    def matrix(name: str, layer: int, rows: int, cols: int) -> tuple[Any, Any]:
        # Each layer has every repackable type, so each is multiplied at batch and single size.
        kind = q8_0 if layer < 0 or "ffn_up" in name else (q4_0, q4_1)[layer % 2]
        weight = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
        return gguf.quants.quantize(weight, kind), kind

    write_llama(
        path,
        embd=_EMBD,
        ffn=_FFN,
        heads=_HEADS,
        layers=_LAYERS,
        vocab=_VOCAB,
        matrix=matrix,
        context=256,
        name="localllm-cpu-probe",
        file_type=gguf.LlamaFileType.MOSTLY_Q4_0,
    )


def _probe_child(mode: str, threads: int, workdir: Path) -> int:
    import ctypes
    import re

    import llama_cpp

    from .synthetic import fill_batch

    path = workdir / "probe.gguf"
    _write_probe_model(path)
    logged: list[str] = []

    @llama_cpp.llama_log_callback
    def on_log(_level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
        logged.append(text.decode("utf-8", "replace"))

    llama_cpp.llama_log_set(on_log, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = 0  # the CPU's paths are what is probed
    params.use_extra_bufts = mode == "repack"
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        print("llama.cpp could not load the probe model", file=sys.stderr)
        return 3
    ctx_params = llama_cpp.llama_context_default_params()
    ctx_params.n_ctx = 256
    ctx_params.n_batch = ctx_params.n_ubatch = _BATCH
    ctx_params.n_threads = ctx_params.n_threads_batch = threads
    ctx = llama_cpp.llama_init_from_model(model, ctx_params)
    if not ctx:
        print("llama.cpp could not create the probe's context", file=sys.stderr)
        return 3
    batch = llama_cpp.llama_batch_init(_BATCH, 0, 1)
    # One batch (the matrix kernels), then one token (the vector kernels).
    for start, count in ((0, _BATCH), (_BATCH, 1)):
        fill_batch(batch, start, count)
        if llama_cpp.llama_decode(ctx, batch) != 0:
            print("llama_decode failed in the probe", file=sys.stderr)
            return 3
        llama_cpp.llama_get_logits_ith(ctx, count - 1)
    llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    text = "".join(logged)
    buffers = sorted(set(re.findall(r"(\w+) model buffer size", text)) - {"CPU", "CPU_Mapped"})
    print(json.dumps({"mode": mode, "buffers": buffers}))
    return 0


def _info_child() -> int:
    import ctypes

    import llama_cpp

    from . import backends
    from .gpuinfo import is_software

    quiet = llama_cpp.llama_log_callback(lambda *_: None)  # referenced while C may call it
    llama_cpp.llama_log_set(quiet, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    devices = backends.all_devices()
    report = {
        "llama_cpp_python": llama_cpp.__version__,
        "system_info": llama_cpp.llama_print_system_info().decode().strip(),
        "backends": backends.backend_names(),
        "devices": [
            {
                "name": device.name,
                "description": device.description,
                "type": device.kind,
                "memory_free": device.free,
                "memory_total": device.total,
                "software": is_software(device.description) and device.kind != "cpu",
            }
            for device in devices
        ],
        "gpu_offload": backends.has_local_gpu(),
        "rpc": bool(llama_cpp.llama_supports_rpc()),
        "mmap": bool(llama_cpp.llama_supports_mmap()),
        "mlock": bool(llama_cpp.llama_supports_mlock()),
        "library": str(_library_dir()),
    }
    print(json.dumps(report))
    return 0


def main(argv: list[str] | None = None) -> int:
    """The child: ``probe --mode repack|plain --threads N --workdir DIR``, or ``info``."""
    parser = argparse.ArgumentParser(prog="python -m localllm.daemon.devices.cpu")
    commands = parser.add_subparsers(dest="command", required=True)
    probe = commands.add_parser("probe", help="run llama.cpp's CPU paths on a tiny model")
    probe.add_argument("--mode", choices=_MODES, required=True)
    probe.add_argument("--threads", type=int, required=True)
    probe.add_argument("--workdir", type=Path, required=True)
    commands.add_parser("info", help="llama.cpp's system info, backends and devices as JSON")
    args = parser.parse_args(argv)
    if args.command == "info":
        return _info_child()
    return _probe_child(args.mode, max(1, args.threads), args.workdir)


if __name__ == "__main__":
    sys.exit(main())
