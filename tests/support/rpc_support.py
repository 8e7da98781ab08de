"""RPC workers for the tests: real ``localllm worker`` processes on loopback ports."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import llama_cpp
import pytest
from test_daemon_support import free_port

from localllm.daemon.devices.rpc import REBUILD_HINT
from localllm.daemon.devices.workers import probe

__all__ = ["NEEDS_RPC", "Worker"]

NEEDS_RPC = pytest.mark.skipif(
    not llama_cpp.llama_supports_rpc(),
    reason=f"this llama-cpp-python was built without -DGGML_RPC=on ({REBUILD_HINT})",
)
"""The one skip this project allows: the RPC tests need a build option, not missing code."""


class Worker:
    """A ``localllm worker`` subprocess serving the CPU on a free loopback port."""

    def __init__(
        self,
        home: Path,
        threads: int = 1,
        ready_timeout: float = 60.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.log_path = home / f"worker-{self.port}.log"
        home.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOCALLLM_")} | (env or {})
        env["LOCALLLM_HOME"] = str(home)
        command = [sys.executable, "-m", "localllm", "worker", "--port", str(self.port)]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [*command, "--threads", str(threads)],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        # Ready once it answers the RPC hello (the server listens only after loading ggml).
        deadline = time.monotonic() + ready_timeout
        while not probe(self.endpoint, timeout=2.0).ok:
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"the worker did not start:\n{self.log()}")
            time.sleep(0.05)

    def log(self) -> str:
        """What the worker printed."""
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL it (a machine that vanished) and reap it."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> int:
        """SIGTERM it, as a user stopping the worker would; returns its exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
