"""``localllm doctor``: what a bug report needs, in one screen (``--json`` for scripts).

localllm and llama.cpp versions, llama.cpp's own system info (the CPU features the build uses),
its backends and devices, GPU offload and RPC support, how llama.cpp's threads wait (OpenMP)
and what the CPU governor does about it, the CPU probe's decision about weight repacking and
why, this machine's speed figures (the speed probe, measured afresh unless ``--cached-speed``:
memory bandwidth, each weight type's decode and prefill rate, the fixed costs of a step), the
data root with its free disk, the model store's check (every blob re-hashed unless
``--no-verify``: damaged models by name with the fix, unused blobs, partial downloads), and
both daemon endpoints with whether a localllm daemon answers there, and any test hook variable
that is set (inert outside the test suite's fixtures, see :mod:`localllm.testhooks`). llama.cpp
is asked in a child process (:mod:`localllm.daemon.devices.cpu`), so a build that faults on
this CPU is reported, not fatal. Nothing is started: a daemon that does not run is reported as
such.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
from pathlib import Path
from typing import Any

from .._format import human_size
from .commands import EXIT_OK

__all__ = ["add_doctor_arguments", "cmd_doctor", "diagnose"]


def add_doctor_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``doctor`` command's arguments."""
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--no-verify", action="store_true", help="check blob sizes only, not their sha256"
    )
    parser.add_argument(
        "--cached-speed",
        action="store_true",
        help="show the speed figures measured before (by the daemon or an earlier doctor) "
        "instead of measuring them again, which takes 10 s or more",
    )


def _free_disk(path: Path) -> dict[str, Any]:
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        usage = shutil.disk_usage(existing)
    except OSError as exc:
        return {"path": str(path), "error": str(exc)}
    return {"path": str(path), "free": usage.free, "total": usage.total}


def _endpoint(settings: Any, **where: Any) -> dict[str, Any]:
    from .._exceptions import LocalLLMError
    from ..client import Client

    with Client(settings, timeout=5.0, **where) as client:
        report: dict[str, Any] = {"address": client.address, "localllm": client.is_running()}
        if report["localllm"]:
            try:
                report["version"] = client.version()
            except LocalLLMError as exc:
                report["error"] = str(exc)
    return report


def _threads(settings: Any, system_info: str) -> dict[str, Any]:
    """How llama.cpp's CPU threads wait, and what the CPU governor does about it."""
    from ..daemon.devices.cpu import default_threads
    from ..daemon.devices.governor import openmp_build
    from ..daemon.devices.procfs import allowed_cpus, others_now

    return {
        "openmp": openmp_build(system_info),
        "omp_wait_policy": settings.omp_wait_policy,
        "governor": settings.governor,
        "cpu_affinity": settings.cpu_affinity,
        "max_threads": settings.num_threads or default_threads(),
        "cpus": len(allowed_cpus()),
        "others_now": others_now(),
    }


def _describe_threads(threads: dict[str, Any]) -> list[str]:
    openmp = threads["openmp"]
    if openmp:
        waits = (
            "llama.cpp uses OpenMP: its threads spin at every barrier (hundreds per token), so "
            "a thread on a core another program holds costs far more than one thread fewer"
        )
    elif openmp is False:
        waits = "llama.cpp uses ggml's own threadpool (no OpenMP)"
    else:
        waits = "llama.cpp's system info does not say whether it uses OpenMP"
    lines = [f"CPU threads: {waits}"]
    most = threads["max_threads"]
    if threads["governor"]:
        shares = "on their own CPUs" if threads["cpu_affinity"] else "anywhere"
        lines.append(
            f"  CPU governor: on: a runner uses up to {most} threads, fewer while other "
            "programs need cores (read every 0.25 s) or fewer run faster, and models "
            f"working at once share the cores ({shares})"
        )
    else:
        lines.append(
            f"  CPU governor: off (LOCALLLM_GOVERNOR=off): runners keep {most} threads, "
            "however busy the machine is"
        )
    policy = threads["omp_wait_policy"]
    lines.append(
        f"  OMP_WAIT_POLICY: {policy}" if policy else "  OMP_WAIT_POLICY: not set (threads spin)"
    )
    others = threads["others_now"]
    if others is not None:
        lines.append(f"  now: other programs use {others:.1f} of {threads['cpus']} CPUs")
    return lines


def _store(settings: Any, verify: bool) -> dict[str, Any]:
    """The model store's check (see :mod:`localllm.store.check`); with ``verify``, every blob
    is re-hashed and one whose bytes do not match its digest is set aside, so the daemon
    reports its model as damaged instead of serving it."""
    from ..store.check import check_store
    from ..store.store import Store

    report = check_store(Store(settings.data_dir), digests=verify)
    return report.to_json() | {"summary": report.summary(), "lines": report.lines()}


def _test_hooks() -> dict[str, Any]:
    """The test hook variables set here, and whether this environment has the hooks module
    (only the test fixtures' daemons do: then the variables act)."""
    from .. import testhooks
    from ..settings import hook_variables

    return {"variables": hook_variables(), "module": testhooks.location()}


def _hook_lines(hooks: dict[str, Any]) -> list[str]:
    lines = []
    if hooks["variables"]:
        names = ", ".join(f"{name}={value}" for name, value in hooks["variables"].items())
        state = (
            f"ACTIVE: this environment has the test suite's hooks module ({hooks['module']})"
            if hooks["module"]
            else "inert: test hooks act only in daemons the test suite's fixtures start"
        )
        lines.append(f"test hooks: {names} set; {state}")
    elif hooks["module"]:
        lines.append(f"test hooks: the test suite's hooks module is here ({hooks['module']})")
    return lines


def _speed(settings: Any, fresh: bool) -> dict[str, Any]:
    """This machine's speed figures: measured now, or (not ``fresh``) the cached ones."""
    from ..daemon.speed import probe as speedprobe

    if not fresh:
        cached = speedprobe.cached_calibration(settings)
        if cached is None:
            return {"error": "none measured yet (`localllm doctor` measures them)"}
        return cached.to_dict() | {"source": "cached"}
    try:
        # A machine declared never quiet keeps what it measures, as the daemon's watch does.
        keep = settings.speed_probe_quiet >= 1.0
        figures = speedprobe.calibrate(settings, fresh=True, keep_unsettled=keep)
        return figures.to_dict() | {"source": "measured"}
    except speedprobe.ProbeUnsettled as exc:
        # shown, and said to be unkept: nothing prices a model with them
        return exc.figures.to_dict() | {"source": "measured, not kept"}
    except speedprobe.ProbeFailed as exc:
        return {"error": str(exc)}


def diagnose(verify: bool = True, fresh_speed: bool = True) -> dict[str, Any]:
    """Everything ``localllm doctor`` prints, as JSON-ready data (``fresh_speed``: measure the
    speed figures now, else show the cached ones)."""
    from .. import __version__
    from ..daemon.devices import cpu
    from ..daemon.devices.gpuinfo import gpu_build_command, hidden_vulkan_devices
    from ..daemon.devices.llamareport import system_report
    from ..daemon.devices.rpc import doctor_line
    from .common import load_settings

    settings = load_settings()
    paths = cpu.decide(settings)
    rpc_ok, rpc_line = doctor_line()
    speed = _speed(settings, fresh_speed)
    llama = system_report()
    if "error" not in llama:
        llama["hidden_devices"] = hidden_vulkan_devices(llama, settings.vulkan_visible_devices)
        llama["gpu_build"] = gpu_build_command()
    return {
        "localllm": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "llama_cpp": llama,
        "threads": _threads(settings, str(llama.get("system_info", ""))),
        "cpu_repack": paths.to_json() | {"warning": paths.warning, "error": paths.error},
        "rpc": {"ok": rpc_ok, "line": rpc_line},
        "speed": speed,
        "data_root": _free_disk(settings.data_dir),
        "store": _store(settings, verify),
        "endpoints": {
            "socket": _endpoint(settings, socket_path=settings.socket_path),
            "tcp": _endpoint(settings, base_url=settings.base_url),
        },
        "test_hooks": _test_hooks(),
    }


def _describe_endpoint(name: str, report: dict[str, Any]) -> str:
    if report.get("localllm"):
        state = f"localllm {report.get('version', '?')} answers"
        if "error" in report:
            state += f" ({report['error']})"
    else:
        state = "no localllm daemon answers"
    return f"  {name:7} {report['address']}: {state}"


def _speed_lines(speed: dict[str, Any]) -> list[str]:
    if "error" in speed:
        return [f"speed: not measured ({speed['error']})"]
    from ..daemon.speed.model import Calibration

    figures = Calibration.from_dict(speed)
    when = "cached, " if speed.get("source") == "cached" else ""
    cache = (
        f"{figures.cache_bytes / 2**20:.0f} MiB last-level cache"
        if figures.cache_bytes
        else "last-level cache not readable"
    )
    lines = [
        f"speed ({figures.threads} threads, {when}measured in {figures.seconds:.1f} s, "
        f"{figures.rounds} rounds; {cache}): memory "
        f"{figures.bandwidth / 1e9:.1f} GB/s; a decode step {figures.decode_fixed * 1e3:.2f} ms "
        f"+ {figures.decode_layer * 1e6:.0f} us a layer + {figures.row * 1e9:.1f} ns a matrix "
        f"row; the runner {figures.runner_step * 1e6:.0f} us a step; sampling "
        f"{figures.sample_token * 1e9:.1f} us per 1,000 tokens of vocabulary "
        f"(greedy {figures.greedy_token * 1e9:.1f})"
    ]
    if speed.get("source") == "measured, not kept":
        lines.append(f"  measured, not kept: {figures.why_not_kept()} (measured again later)")
    elif not figures.kept:  # kept where the machine is declared never quiet
        lines.append(f"  kept unsettled (LOCALLLM_SPEED_PROBE_QUIET=1): {figures.why_not_kept()}")
    if figures.others > 0.2:
        lines.append(f"  (other programs used {figures.others:.1f} cores while it measured)")
    for name, rate in figures.types.items():
        share = rate.decode / figures.bandwidth
        lines.append(
            f"  {name:6} decode {rate.decode / 1e9:5.1f} GB/s ({share:.0%} of memory), "
            f"prefill {rate.prefill / 1e9:4.0f} GFLOP/s"
        )
    for device in figures.devices.values():
        lines.append(
            f"  on {device.label()}: a decode step {device.decode_fixed * 1e3:.2f} ms + "
            f"{device.decode_layer * 1e6:.0f} us a layer"
        )
        for name, rate in device.types.items():
            # a software device reads megabytes a second: its figures keep their digits
            read = (
                f"{rate.decode / 1e9:5.1f} GB/s"
                if rate.decode >= 1e9
                else f"{rate.decode / 1e6:5.1f} MB/s"
            )
            lines.append(f"    {name:6} decode {read}, prefill {rate.prefill / 1e9:6.2f} GFLOP/s")
    return lines


def _device_lines(llama: dict[str, Any]) -> list[str]:
    """Every device llama.cpp sees, the ones it skips, and what offloading can use."""
    lines = []
    for device in llama["devices"]:
        memory = f"{human_size(device['memory_free'])} free of " + human_size(
            device["memory_total"]
        )
        software = " (software device: runs on the CPU)" if device.get("software") else ""
        lines.append(
            f"  device {device['name']} ({device['type']}): {device['description']}, "
            f"{memory}{software}"
        )
    for device in llama.get("hidden_devices", []):
        kind = "a software device, slower than the CPU backend" if device["software"] else "a GPU"
        lines.append(
            f"  skipped: Vulkan device {device['index']}: {device['description']} ({kind}); "
            f"GGML_VK_VISIBLE_DEVICES={device['index']} uses it"
        )
    gpus = [d["name"] for d in llama["devices"] if d["type"] in ("gpu", "igpu")]
    if gpus:
        lines.append(f"  GPU offload: yes ({', '.join(gpus)})")
    elif not _has_gpu_backend(llama["backends"]):
        lines.append(
            "  GPU offload: no: this llama-cpp-python has no GPU backend; "
            f"`{llama.get('gpu_build', 'scripts/gpu-build.sh vulkan VENV')}` builds one "
            "(docs/gpu.md)"
        )
    else:
        backends = ", ".join(b for b in llama["backends"] if b not in ("CPU", "RPC"))
        lines.append(f"  GPU offload: no GPU device ({backends} found none to use)")
    return lines


def _has_gpu_backend(backends: list[str]) -> bool:
    return any(name not in ("CPU", "RPC", "BLAS") for name in backends)


def _render(report: dict[str, Any]) -> list[str]:
    llama = report["llama_cpp"]
    repack = report["cpu_repack"]
    lines = [
        f"localllm {report['localllm']} (Python {report['python']}, {report['platform']}, "
        f"event loop {report.get('event_loop', '?')})",
    ]
    if "error" in llama:
        lines.append(f"llama.cpp: {llama['error']}")
    else:
        lines += [
            f"llama.cpp: llama-cpp-python {llama['llama_cpp_python']} ({llama['library']})",
            f"  system info: {llama['system_info']}",
            f"  backends: {', '.join(llama['backends']) or 'none'}",
        ]
        lines += _device_lines(llama)
        lines.append(f"  {report['rpc']['line']}")
    lines += _describe_threads(report["threads"])
    state = "on" if repack["repack"] else "off"
    if not repack["usable"]:
        state = "llama.cpp cannot run here"
    origin = {"probe": "probed now", "cache": "cached", "setting": "set", "runtime": "learned"}
    where = f"; {repack['cache_file']}" if repack.get("cache_file") else ""
    lines.append(
        f"weight repacking: {state} — {repack['reason']} "
        f"({origin.get(repack['source'], repack['source'])}{where})"
    )
    for key in ("warning", "error"):
        if repack.get(key):
            lines.append(f"  {key}: {repack[key]}")
    lines.extend(_speed_lines(report["speed"]))
    disk = report["data_root"]
    free = (
        f"{human_size(disk['free'])} free of {human_size(disk['total'])}"
        if "free" in disk
        else disk.get("error", "")
    )
    lines.append(f"data root: {disk['path']} ({free})")
    store = report["store"]
    lines.append(store["summary"])
    lines += [f"  {line}" for line in store["lines"]]
    lines.append("daemon:")
    for name, endpoint in report["endpoints"].items():
        lines.append(_describe_endpoint(name, endpoint))
    lines += _hook_lines(report["test_hooks"])
    return lines


def cmd_doctor(args: argparse.Namespace) -> int:
    """``doctor [--json]``: print what a bug report needs."""
    report = diagnose(verify=not args.no_verify, fresh_speed=not args.cached_speed)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print("\n".join(_render(report)))
    return EXIT_OK
