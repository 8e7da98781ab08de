"""Starting and stopping the server processes the benchmarks measure (shared by the scripts)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys

__all__ = ["free_port", "start_daemon", "stop"]


def free_port() -> int:
    """A loopback TCP port nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_daemon(env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``python -m localllm.daemon`` with ``env``, silent (its log goes to its data dir)."""
    return subprocess.Popen(
        [sys.executable, "-m", "localllm.daemon"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stop(process: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout`` seconds."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
