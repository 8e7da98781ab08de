"""Helpers for the daemon tests: start a real daemon process on a temporary home.

Each test module starts its own daemon (module-scoped fixture) with the settings it needs;
the daemon is a real ``python -m localllm.daemon`` subprocess on a free TCP port and its own
Unix socket. Stopping it checks the clean shutdown (exit status 0, socket removed).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
from home_support import seed_home
from hook_support import asks_for_hooks, with_hooks

from localllm._process import free_port
from localllm.client import Client
from localllm.settings import Settings

__all__ = [
    "Daemon",
    "busy_processes",
    "free_port",
    "run_daemon_expecting_failure",
    "running_daemon",
    "start_daemon",
    "wait_for_stats",
]


class Daemon:
    """A running daemon subprocess."""

    def __init__(self, home: Path, env: dict[str, str], process: subprocess.Popen[str]) -> None:
        self.home = home
        self.env = env
        self.process = process
        self.settings = Settings.from_env(env)
        self.url = self.settings.base_url

    def client(self, **kwargs: Any) -> Client:
        """A localllm client over the Unix socket (or TCP with ``use_tcp=True``)."""
        kwargs.setdefault("use_tcp", False)
        return Client(self.settings, **kwargs)

    def create(self, name: str, path: Path | None = None, **fields: Any) -> None:
        """Create model ``name`` from the GGUF file at ``path`` (the daemon reads it) and the
        other ``fields`` :meth:`Client.create` takes, to the end."""
        if path is not None:
            fields["from_"] = str(path)
        with self.client() as client:
            list(client.create(name, **fields))

    def http(self, **kwargs: Any) -> httpx.Client:
        """A plain httpx client on TCP."""
        return httpx.Client(base_url=self.url, timeout=120, **kwargs)

    def log(self) -> str:
        """The daemon's log so far."""
        path = self.settings.log_dir / "daemon.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM and wait; returns the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise

    def kill(self) -> None:
        """SIGKILL (cleanup after a failed test)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def start_daemon(
    home: Path,
    preexec_fn: Callable[[], None] | None = None,
    *,
    hooks: bool | None = None,
    seed: bool = True,
    **settings: Any,
) -> Daemon:
    """Start ``python -m localllm.daemon`` for ``home``; ``settings`` become LOCALLLM_* vars;
    ``preexec_fn`` runs in the child before the daemon (to enter a cgroup, say).

    A test hook asked for (``test_pause=...``, ``test_fault=...``) is switched on (see
    hook_support) unless ``hooks`` is False: a daemon that sees the variables as a user's
    would. A new home gets the starter as a first start would import it (see home_support)
    unless ``seed`` is False. Returns once the daemon announced that it listens (its sockets
    accept from then on).
    """
    if seed:
        seed_home(home)
    with contextlib.suppress(OSError):  # one the daemon cannot make either is a case to test
        home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCALLLM_")}
    env["LOCALLLM_HOME"] = str(home)
    env.setdefault("LOCALLLM_HOST", f"127.0.0.1:{free_port()}")
    # No speed probe at a quiet moment (a child measuring the CPU beside the suite), unless
    # a test asks for it (speed_probe="on").
    env["LOCALLLM_SPEED_PROBE"] = "off"
    # No spare runner (a process importing llama.cpp after the first load, 0.5 s of CPU per
    # daemon) unless a test asks (spare_runner="on": tests/engine/test_spare_runner.py).
    env["LOCALLLM_SPARE_RUNNER"] = "off"
    for key, value in settings.items():
        env[f"LOCALLLM_{key.upper()}"] = str(value)
    if hooks if hooks is not None else asks_for_hooks(env):
        env = with_hooks(env)
    process = subprocess.Popen(
        [sys.executable, "-m", "localllm.daemon"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=preexec_fn,
    )
    assert process.stderr is not None
    line = process.stderr.readline()  # the announcement, or an error before exiting
    if "listening" not in line:
        rest = process.stderr.read()
        process.wait(30)
        raise RuntimeError(f"daemon did not start: {line}{rest}")
    return Daemon(home, env, process)


def run_daemon_expecting_failure(home: Path, **settings: Any) -> subprocess.CompletedProcess[str]:
    """Run ``python -m localllm.daemon`` that should refuse to start; its exit and output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCALLLM_")}
    env["LOCALLLM_HOME"] = str(home)
    env.update({f"LOCALLLM_{k.upper()}": str(v) for k, v in settings.items()})
    if asks_for_hooks(env):
        env = with_hooks(env)
    return subprocess.run(
        [sys.executable, "-m", "localllm.daemon"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@contextlib.contextmanager
def running_daemon(
    home: Path,
    preexec_fn: Callable[[], None] | None = None,
    *,
    hooks: bool | None = None,
    seed: bool = True,
    **settings: Any,
) -> Iterator[Daemon]:
    """Start a daemon (as :func:`start_daemon`), yield it, and check it shuts down cleanly."""
    daemon = start_daemon(home, preexec_fn, hooks=hooks, seed=seed, **settings)
    try:
        yield daemon
    except BaseException:
        daemon.kill()
        raise
    status = daemon.stop()
    assert status == 0, f"daemon exited with {status}:\n{daemon.log()[-3000:]}"
    assert not daemon.settings.socket_path.exists(), "the socket was not removed"


def wait_for_stats(daemon: Daemon, condition: Any, timeout: float = 60) -> dict[str, Any]:
    """Read the live stats stream until ``condition(snapshot)`` holds; returns that snapshot."""
    deadline = time.monotonic() + timeout
    with (
        httpx.Client(base_url=daemon.url, timeout=timeout) as http,
        http.stream("GET", "/api/stats", params={"stream": "true", "interval": 0.05}) as response,
    ):
        for line in response.iter_lines():
            if not line:
                continue
            snapshot = json.loads(line)
            if condition(snapshot):
                return snapshot
            if time.monotonic() > deadline:
                raise AssertionError(f"condition not met within {timeout}s: {snapshot}")
    raise AssertionError("the stats stream ended before the condition held")


@contextlib.contextmanager
def busy_processes(count: int) -> Iterator[None]:
    """``count`` processes spinning a core each (bounded: killed when the block ends)."""
    spinners = [
        subprocess.Popen(
            [sys.executable, "-c", "while True: pass"],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
        )
        for _ in range(count)
    ]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
