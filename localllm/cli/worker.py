"""``localllm worker``: serve this machine's devices to other machines' runners over RPC.

The worker is llama.cpp's own RPC server, started from the installed llama-cpp-python by the
runner package (``python -m localllm.daemon.devices.rpc``, see there). This command replaces
itself with that process (``exec``): the server blocks in C for the life of the process and
llama.cpp ends the process on internal errors, so llama.cpp stays out of the CLI, as it stays
out of the daemon, and signals and the exit status reach the worker with no process between.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

__all__ = ["WORKER_MODULE", "add_worker_arguments", "cmd_worker", "worker_command"]

WORKER_MODULE = "localllm.daemon.devices.rpc"
"""The module that runs the RPC server."""


def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``worker`` command's arguments."""
    parser.add_argument("--host", default="127.0.0.1", help="IPv4 address to listen on (loopback)")
    parser.add_argument("--port", type=int, default=50052, help="TCP port (default 50052)")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: physical cores)")
    parser.add_argument(
        "--device",
        action="append",
        default=[],
        metavar="DEVICE",
        help="devices to serve, comma separated (CPU, CUDA0, ...); default: the GPUs, else the CPU",
    )
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help="do not keep received tensors on disk (rpc-cache/ under the data root)",
    )


def worker_command(args: argparse.Namespace) -> list[str]:
    """The worker's command line for the parsed ``worker`` arguments."""
    command = [sys.executable, "-P", "-m", WORKER_MODULE, "--host", args.host]
    command += ["--port", str(args.port), "--threads", str(args.threads)]
    for device in args.device:
        command += ["--device", device]
    if args.no_cache:
        command.append("--no-cache")
    return command


def cmd_worker(args: argparse.Namespace) -> int:
    """``worker``: run the RPC server in the foreground until Ctrl-C or SIGTERM."""
    command = worker_command(args)
    sys.stdout.flush()
    sys.stderr.flush()
    if sys.platform == "win32":  # no exec there: wait for it instead
        return subprocess.call(command)
    os.execv(command[0], command)
    return 1  # not reached: execv returns only by raising
