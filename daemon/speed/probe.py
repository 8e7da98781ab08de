"""How fast llama.cpp runs on this machine: a short probe in a child process, cached.

Decode is bound by memory: each token reads every weight once. But it reads them through
ggml's kernels, which unpack each weight type at their own pace, so on a CPU a quantized type
reaches only a fraction of what ``memcpy`` moves. Prefill is bound by compute: a batch reuses
each weight for every token. So the probe measures, with the runner's thread count and weight
repacking as decided for this machine (:mod:`.cpu`), in a child process
(:mod:`.speedmeasure`, which says what each part measures):

* **per weight type** (``Q4_K``, ``Q8_0``, ``F16``...): a synthetic model whose matrices are
  all of that type, decoded token by token and fed one batch;
* **fixed costs**: tiny models of 2 and 26 layers (a step's and a layer's cost besides the
  weights) and the runner's own work per step;
* **the output head and the sampler**: a 131,072-token head with logits and without, and the
  runner's samplers on its logits;
* **attention**: a batch late in a context; **memory bandwidth**, for reference;
* **a GPU**, when llama.cpp lists one: the fixed costs and two weight types with every layer
  on it (a software device such as llvmpipe is measured too, and flagged).

The result (:class:`~localllm.daemon.speed.model.Calibration`) is cached in the user's cache dir per
llama.cpp build, CPU, thread count and ``OMP_WAIT_POLICY``; ``localllm doctor`` measures it
again, and the daemon at its first quiet moment when there is none
(:mod:`localllm.daemon.speed.watch`).
Types a model needs that the first probe skipped are measured when first needed
(:func:`calibrate` with ``types``) and added to the cache. A probe can be stopped (the child
killed) and refuses figures measured while other programs were busy.

Only the child imports llama.cpp.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from localllm._process import child_report, write_json
from localllm.settings import Settings

from ..devices.cpu import decide, decision_key, default_threads
from ..devices.gpuinfo import HIDDEN_GPUS
from .model import Calibration

__all__ = [
    "BASE_TYPES",
    "PROBE_VERSION",
    "ProbeFailed",
    "ProbeInterrupted",
    "ProbeUnsettled",
    "cached_calibration",
    "calibrate",
]

log = logging.getLogger("localllm.speedprobe")

PROBE_VERSION = 4
"""Bumped when the probe's models or workload change, so older figures are measured again."""
BASE_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q6_K", "Q5_K", "Q4_K", "Q4_0", "Q4_1")
"""Weight types the first probe measures: what most GGUF files on the Hub are made of (the
K-quant mixes, the legacy 4- and 8-bit types, unquantized). Others are probed on demand."""
_TIMEOUT_S = 300.0
_POLL_S = 0.1
"""How often a probe that may be interrupted looks whether it must give way."""

_probing = threading.Lock()


class ProbeFailed(RuntimeError):
    """The probe child did not give figures (it crashed, timed out or printed nothing)."""


class ProbeInterrupted(ProbeFailed):
    """The probe was stopped before it finished (work came in), or measured while other
    programs were busy: nothing was kept, and it can be run again at a quieter moment."""


class ProbeUnsettled(ProbeInterrupted):
    """The probe finished, but its figures did not agree from round to round or broke a
    sanity bound (:attr:`~localllm.daemon.speed.model.Calibration.kept`): they were not kept
    (``figures`` holds them, to show), and the probe is run again at a quieter moment."""

    def __init__(self, figures: Calibration) -> None:
        super().__init__(f"measured, not kept: {figures.why_not_kept()}")
        self.figures = figures


# -- the parent -----------------------------------------------------------------------------


def _threads(settings: Settings, threads: int | None) -> int:
    return threads or settings.num_threads or default_threads()


def probe_key(threads: int) -> str:
    """What the figures are cached under: the CPU probe's key (llama.cpp build, CPU, threads),
    how OpenMP's threads wait (spinning or sleeping changes every step's cost) and this
    probe's version."""
    gpus = ",".join(f"{name}={os.environ.get(name)}" for name in sorted(HIDDEN_GPUS))
    return _probe_key(threads, os.environ.get("OMP_WAIT_POLICY", "").lower() or "default", gpus)


@functools.lru_cache(maxsize=8)
def _probe_key(threads: int, wait: str, gpus: str) -> str:
    # The GPUs a build may use (the visible-device variables) decide the devices' part.
    text = f"{decision_key(threads)}|omp={wait}|gpus={gpus}|speed={PROBE_VERSION}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _cache_file(settings: Settings, key: str) -> Path:
    return settings.cache_dir / "speed-probe" / f"{key}.json"


_read: dict[Path, tuple[int, Calibration]] = {}


def cached_calibration(settings: Settings, threads: int | None = None) -> Calibration | None:
    """The figures measured earlier for this machine and thread count, if any (never probes;
    the file is read again only when it changed: ``ps`` asks at every refresh)."""
    key = probe_key(_threads(settings, threads))
    file = _cache_file(settings, key)
    try:
        changed = file.stat().st_mtime_ns
        known = _read.get(file)
        if known is not None and known[0] == changed:
            return known[1]
        calibration = Calibration.from_dict(json.loads(file.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if calibration.key != key:
        return None
    _read[file] = (changed, calibration)
    return calibration


def _write_cache(settings: Settings, calibration: Calibration) -> None:
    file = _cache_file(settings, calibration.key)
    try:
        write_json(file, calibration.to_dict())
    except OSError as exc:
        log.warning("could not cache the speed probe's figures in %s: %s", file, exc)


def _run_child(
    threads: int,
    repack: bool,
    types: Sequence[str],
    timeout: float,
    cancelled: Callable[[], bool] | None = None,
    experts: Sequence[str] = (),
) -> dict[str, Any]:
    command = [sys.executable, "-P", "-m", "localllm.daemon.speed.measure"]
    with tempfile.TemporaryDirectory(prefix="localllm-speed-") as workdir:
        args = ["--threads", str(threads), "--workdir", workdir, "--types", ",".join(types)]
        args += ["--experts", ",".join(experts)]
        if not repack:
            args.append("--no-repack")
        child = subprocess.Popen(
            [*command, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + timeout
        try:
            # Its output is small (one JSON line, a few log lines): the pipes cannot fill.
            while child.poll() is None:
                if cancelled is not None and cancelled():
                    raise ProbeInterrupted("the speed probe gave way to work that came in")
                if time.monotonic() > deadline:
                    raise ProbeFailed(f"the speed probe did not finish within {timeout:.0f} s")
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(_POLL_S)
            stdout, stderr = child.communicate()
        finally:
            if child.poll() is None:
                child.kill()
                child.communicate()
    done = subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr)
    report, failure = child_report(done)
    if report is None:
        raise ProbeFailed(f"the speed probe {failure}")
    return report


def calibrate(
    settings: Settings,
    *,
    threads: int | None = None,
    types: Iterable[str] = (),
    experts: Iterable[str] = (),
    fresh: bool = False,
    timeout: float = _TIMEOUT_S,
    cancelled: Callable[[], bool] | None = None,
    max_others: float | None = None,
    keep_unsettled: bool = False,
) -> Calibration:
    """This machine's figures for ``threads`` threads (default: the runner's), with at least
    :data:`BASE_TYPES` and ``types`` measured, and the routed experts of ``experts``' types
    (a mixture-of-experts model's, :mod:`.experts`): the cached ones, completed by a probe of
    what is missing (the experts alone, when only they are: a second or two), or all (and
    those probed before) measured again with ``fresh``. Blocks
    while probing (about 10 s on a quiet machine, up to a minute on a busy one); raises
    :class:`ProbeFailed` when the probe cannot run, :class:`ProbeUnsettled` (with the
    figures) when they did not agree or broke a sanity bound: they are not cached, unless
    ``keep_unsettled`` (a machine declared never quiet: its figures are kept as they are,
    with what did not agree in them).

    ``cancelled`` is asked every tenth of a second while the child runs: when it says so the
    child is killed and :class:`ProbeInterrupted` raised. With ``max_others``, figures
    measured while other programs used more cores than that on average are not kept
    (:class:`ProbeInterrupted` too): a probe beside a busy program measures the program."""
    count = _threads(settings, threads)
    with _probing:
        known = cached_calibration(settings, count)
        # Measured again afresh, the types probed on demand before are measured too.
        earlier = known.types if known is not None else {}
        earlier_experts = known.experts if known is not None else {}
        cached = None if fresh else known
        wanted = [t for t in dict.fromkeys([*BASE_TYPES, *earlier, *types]) if t]
        missing = [t for t in wanted if cached is None or t not in cached.types]
        routed = [t for t in dict.fromkeys([*earlier_experts, *experts]) if t]
        missing_experts = [t for t in routed if cached is None or t not in cached.experts]
        if cached is not None and not missing and not missing_experts:
            return cached
        paths = decide(settings, count)
        if paths.error:
            raise ProbeFailed(paths.error)
        started = time.monotonic()
        report = _run_child(count, paths.repack, missing, timeout, cancelled, missing_experts)
        others = float(report.get("others", 0.0))
        if max_others is not None and others > max_others:
            raise ProbeInterrupted(
                f"other programs used {others:.1f} cores while the speed probe ran"
            )
        if not missing and cached is not None:
            # The experts alone were measured: added to the kept figures.
            measured = cached.with_experts(report, time.monotonic() - started)
        else:
            measured = Calibration.from_probe(report, probe_key(count), time.monotonic() - started)
        if missing and cached is not None:
            # Types added to kept figures: only their own rates are taken (the kept fixed
            # costs stay), so only their own figures must have agreed.
            measured = cached.merged(measured, only_types=True)
        if not measured.kept:
            log.info("speed probe: %s", measured.why_not_kept())
            if not keep_unsettled:
                raise ProbeUnsettled(measured)
        calibration = measured
        _write_cache(settings, calibration)
        log.info("speed probe: %s", calibration.describe())
        return calibration
