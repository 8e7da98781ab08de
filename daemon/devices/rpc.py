"""llama.cpp's RPC backend: the worker (``localllm worker``) and a runner's remote devices.

**The worker.** ``python -m localllm.daemon.devices.rpc [--host H] [--port P] [--threads N]
[--device D,...] [--no-cache]`` serves this machine's devices to other machines' runners with
ggml's own RPC server, ``ggml_backend_rpc_start_server``, reached through the registry's proc
address exactly as llama.cpp's ``rpc-server`` does. It is started from the installed
llama-cpp-python's libraries, so its protocol is the runner's by construction. Large tensors it
receives are cached under the data root (``rpc-cache/``), so a model loads again without
sending them over the network. ``localllm worker`` execs this module: the server blocks in C
for the life of the process, and llama.cpp ends the process on internal errors, so it runs as
a runner-family process of its own (as runners do), never inside the CLI.

**The runner's side.** :func:`split_onto_workers` checks every worker of a load (a TCP connect
and the RPC hello, :mod:`.workers`; llama.cpp would abort the runner on a dead one), registers
them (``ggml_backend_rpc_add_server``), passes their devices in ``llama_model_params.devices``
and splits the layers by free memory (:mod:`.placement`).

**The doctor.** :func:`doctor_line` says whether this build has the RPC backend.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ipaddress
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .workers import WorkerStatus, expected_protocol, probe_all

if TYPE_CHECKING:
    from ..runner.protocol import RunnerConfig
    from .placement import Placement

__all__ = [
    "REBUILD_HINT",
    "RemoteSplit",
    "doctor_line",
    "exposure_warning",
    "main",
    "serve_worker",
    "split_onto_workers",
]

REBUILD_HINT = (
    'CMAKE_ARGS="-DGGML_RPC=on" pip install --force-reinstall --no-cache-dir llama-cpp-python'
)
"""How to get a llama-cpp-python with the RPC backend (add a GPU's flag as for any build)."""

NO_RPC = (
    "this llama-cpp-python was built without llama.cpp's RPC backend (-DGGML_RPC=on); "
    f"rebuild it: {REBUILD_HINT}"
)

DEFAULT_PORT = 50052
"""rpc-server's default port."""

log = logging.getLogger("localllm.runner.rpc")

_CHECK_BUILD = "--check-build"


# -- the runner's side ---------------------------------------------------------------------------


@dataclass
class RemoteSplit:
    """The workers a model was split onto, and the C arrays llama.cpp reads while loading."""

    placement: Placement
    """Layers per device."""
    workers: list[WorkerStatus]
    """The workers in use, as checked before the load."""
    dropped: list[WorkerStatus] = field(default_factory=list)
    """Lost workers still down, which this load went without."""
    _arrays: tuple[Any, ...] = ()


def _fit_problem(config: RunnerConfig, placement: Placement) -> str | None:
    """Why the model cannot fit without the dropped workers, or None when it can."""
    from localllm.gguf_info import inspect_gguf

    paths = [config.model_path, *config.extra_model_paths]
    weights = sum(os.path.getsize(p) for p in paths)
    info = inspect_gguf(config.model_path)
    cells = config.kv_cells or config.n_slots * config.n_ctx_per_slot
    needed = weights + info.kv_cache_bytes(cells, config.kv_cache_type)
    free = placement.cpu.free + sum(d.free for d in placement.devices)
    if needed <= free:
        return None
    return (
        f"without them the model needs about {needed >> 20} MiB and the CPU and the remaining "
        f"devices have {free >> 20} MiB free"
    )


def split_onto_workers(model_params: Any, config: RunnerConfig) -> RemoteSplit:
    """Check and register ``config.rpc_workers`` and set ``devices``, ``tensor_split`` and
    ``n_gpu_layers`` of ``model_params`` to split the model onto them and the local devices.

    Raises :class:`~.model.ModelLoadError` in one line naming every worker that cannot be used
    (lost workers excepted, when the model fits without them).
    """
    import llama_cpp

    from ..engine.params import ModelLoadError, set_fields
    from .backends import add_rpc_server, cpu_device, local_gpus
    from .placement import place_layers

    if not llama_cpp.llama_supports_rpc():
        raise ModelLoadError(f"rpc_workers {','.join(config.rpc_workers)}: {NO_RPC}")
    statuses = probe_all(config.rpc_workers)
    down = [s for s in statuses if not s.ok]
    fatal = [s for s in down if s.endpoint not in config.rpc_lost]
    if fatal:
        raise ModelLoadError("; ".join(f"RPC worker {s.endpoint} {s.problem}" for s in fatal))
    dropped = [s for s in down if s.endpoint in config.rpc_lost]
    for status in dropped:
        log.warning(
            "going on without RPC worker %s, lost earlier: it %s", status.endpoint, status.problem
        )
    live = [s for s in statuses if s.ok]
    remote = []
    for status in live:
        memory = [(d.free, d.total) for d in status.devices]
        remote += add_rpc_server(status.endpoint, memory)
    # RPC devices first, as llama.cpp orders them by default: the last device holds the
    # output layer, and the logits are read back from it after every step.
    devices = remote + local_gpus()
    if len(devices) > llama_cpp.llama_max_devices():
        raise ModelLoadError(
            f"{len(devices)} devices, more than this llama.cpp's {llama_cpp.llama_max_devices()}"
        )
    from localllm.gguf_info import inspect_gguf

    n_layer = inspect_gguf(config.model_path).block_count
    if not n_layer:
        raise ModelLoadError(f"{config.model_path} does not say how many layers it has")
    placement = place_layers(n_layer, cpu_device(), devices, config.n_gpu_layers)
    if dropped and (problem := _fit_problem(config, placement)) is not None:
        names = ", ".join(s.endpoint for s in dropped)
        raise ModelLoadError(f"RPC worker {names} is still down, and {problem}")
    handles = (ctypes.c_void_p * (len(devices) + 1))(*[d.handle for d in devices], None)
    split = (ctypes.c_float * llama_cpp.llama_max_devices())(*placement.device_units)
    set_fields(
        model_params,
        devices=ctypes.addressof(handles),
        tensor_split=split,
        n_gpu_layers=placement.n_gpu_layers,
    )
    for row in placement.report():
        log.info(
            "device %s%s: %d layers%s",
            row["name"],
            f" ({row['endpoint']})" if row["endpoint"] else "",
            row["layers"],
            " + output" if row["output"] else "",
        )
    return RemoteSplit(placement, live, dropped, (handles, split))


# -- the doctor ----------------------------------------------------------------------------------


def doctor_line(timeout: float = 60.0) -> tuple[bool, str]:
    """``(ok, line)`` for ``localllm doctor``: whether this llama-cpp-python has the RPC backend
    (``localllm worker`` and ``rpc_workers`` need it). Asked in a child process, so the caller
    never loads llama.cpp; ``ok`` is False only when the build lacks it or the check failed."""
    try:
        result = subprocess.run(
            [sys.executable, "-P", "-m", __name__, _CHECK_BUILD],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"RPC backend: could not be checked ({exc})"
    answer = result.stdout.strip()
    if result.returncode == 0 and answer == "rpc":
        major, minor = expected_protocol()
        return True, (
            f"RPC backend: built in (protocol {major}.{minor}): `localllm worker` and "
            "rpc_workers can split a model across machines"
        )
    if answer == "no-rpc":
        return False, f"RPC backend: missing: {NO_RPC}"
    detail = (result.stderr.strip().splitlines() or ["no output"])[-1]
    return False, f"RPC backend: could not be checked ({detail})"


# -- the worker ----------------------------------------------------------------------------------


_START_SERVER = ctypes.CFUNCTYPE(
    None,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_size_t,
    ctypes.c_size_t,
    ctypes.POINTER(ctypes.c_void_p),
)


class WorkerError(Exception):
    """The worker cannot start; the message says why in one line."""


def _serving_devices(names: list[str]) -> list[Any]:
    """The devices to serve: those named, else the GPUs, else the CPU (as rpc-server picks)."""
    from .backends import all_devices, device_by_name

    if names:
        chosen = []
        for name in names:
            device = device_by_name(name)
            if device is None:
                known = ", ".join(d.name for d in all_devices())
                raise WorkerError(f"no device called {name!r} here (there are: {known})")
            chosen.append(device)
        return chosen
    devices = all_devices()
    return [d for d in devices if d.kind in ("gpu", "igpu")] or [
        d for d in devices if d.kind == "cpu"
    ]


def _check_port(host: str, port: int) -> None:
    """Refuse a port another process holds, before the C server fails with a bare message."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise WorkerError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def exposure_warning(host: str, port: int) -> str | None:
    """What a worker listening beyond loopback must say (None on loopback)."""
    if ipaddress.IPv4Address(host).is_loopback:
        return None
    return (
        "Warning: the RPC protocol has no authentication and no encryption: anyone who "
        f"reaches {host}:{port} can use these devices and read their memory. Reach workers "
        "through an SSH tunnel or a VPN, never an open network."
    )


def serve_worker(
    host: str, port: int, threads: int, device_names: list[str], cache_dir: str | None
) -> int:
    """Serve this machine's devices over RPC until SIGTERM or Ctrl-C; returns the exit status
    (1 when the server cannot start)."""
    import llama_cpp

    if not llama_cpp.llama_supports_rpc():
        raise WorkerError(NO_RPC)
    from .backends import rpc_function

    try:
        # ggml's server binds IPv4 addresses only (inet_addr): resolve a name here.
        host = socket.gethostbyname(host)
    except OSError:
        raise WorkerError(
            f"--host must be an IPv4 address or a name of one (ggml's RPC server binds no "
            f"IPv6), got {host!r}"
        ) from None
    if not 0 < port < 65536:
        raise WorkerError(f"--port must be between 1 and 65535, got {port}")
    if threads < 1:
        raise WorkerError(f"--threads must be at least 1, got {threads}")
    devices = _serving_devices(device_names)
    if not devices:
        raise WorkerError("this machine has no device to serve")
    start = rpc_function("ggml_backend_rpc_start_server", _START_SERVER)
    if start is None:
        raise WorkerError(f"this llama.cpp's RPC backend cannot start a server; {NO_RPC}")
    _check_port(host, port)
    if cache_dir is not None:
        os.makedirs(cache_dir, exist_ok=True)

    served = ", ".join(f"{d.name} ({d.description}, {d.free >> 20} MiB free)" for d in devices)
    cache = f"tensor cache in {cache_dir}" if cache_dir else "no tensor cache"
    print(f"localllm worker: serving {served} on {host}:{port}, {threads} threads, {cache}")
    if (warning := exposure_warning(host, port)) is not None:
        print(warning, file=sys.stderr)
    sys.stdout.flush()

    handles = (ctypes.c_void_p * len(devices))(*[d.handle for d in devices])
    stopped = threading.Event()
    outcome = {"status": 0}

    def run() -> None:
        start(
            f"{host}:{port}".encode(),
            cache_dir.encode() if cache_dir else None,
            threads,
            len(devices),
            handles,
        )
        # It returns only when it could not listen or accept.
        outcome["status"] = 1
        stopped.set()

    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    # The server blocks in C (without the GIL) for as long as the worker runs; this thread
    # only waits for a signal.
    threading.Thread(target=run, name="rpc-server", daemon=True).start()
    with contextlib.suppress(KeyboardInterrupt):
        stopped.wait()
    sys.stdout.flush()
    sys.stderr.flush()
    if outcome["status"]:
        print("Error: the RPC server stopped (see its message above)", file=sys.stderr)
    # The server thread is still inside C: skip interpreter and library teardown under it.
    os._exit(outcome["status"])


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="localllm worker",
        description="Serve this machine's devices (GPUs, else the CPU) to other machines' "
        "localllm runners over llama.cpp's RPC protocol.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="IPv4 address to listen on")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="TCP port to listen on")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: physical cores)")
    parser.add_argument(
        "--device",
        action="append",
        default=[],
        help="ggml devices to serve, comma separated (CPU, CUDA0...); default: the GPUs, "
        "else the CPU",
    )
    parser.add_argument(
        "--no-cache", action="store_true", help="do not cache received tensors on disk"
    )
    parser.add_argument(_CHECK_BUILD, action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """``python -m localllm.daemon.devices.rpc``: run a worker (what ``localllm worker`` runs)."""
    args = _parse(argv)
    if args.check_build:
        import llama_cpp

        print("rpc" if llama_cpp.llama_supports_rpc() else "no-rpc")
        return 0
    from localllm._exceptions import LocalLLMError
    from localllm.settings import Settings

    from .cpu import default_threads

    try:
        settings = Settings.from_env()
        names = [n.strip() for value in args.device for n in value.split(",") if n.strip()]
        return serve_worker(
            args.host,
            args.port,
            args.threads or default_threads(),
            names,
            None if args.no_cache else str(settings.rpc_cache_dir),
        )
    except (WorkerError, LocalLLMError) as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
