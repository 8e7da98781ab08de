"""Helpers for the CLI tests: run ``python -m localllm`` on a temporary home, as a user would.

A :class:`CliHome` is a temporary ``LOCALLLM_HOME`` with its own free TCP port; the first
command that needs the daemon starts it in the background (the auto-start under test), and
:meth:`CliHome.stop_daemon` stops whatever daemon holds that home's lock, so nothing leaks.
No network: the registry and the Hugging Face endpoint point at a closed loopback port unless
a test gives a fake one.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from home_support import seed_home
from hook_support import asks_for_hooks, with_hooks
from test_daemon_support import free_port

from localllm.client import Client
from localllm.settings import Settings

__all__ = [
    "CliHome",
    "cli_home",
    "closed_port_url",
    "daemon_log",
    "free_port",
    "wait_for_stats",
]


def closed_port_url() -> str:
    """An http:// URL on loopback where nothing listens (a source that cannot be reached)."""
    return f"http://127.0.0.1:{free_port()}"


class CliHome:
    """A temporary home and the environment every CLI call of a test module shares.

    A test hook variable in ``env`` (``LOCALLLM_TEST_FAULT=...``) switches the hooks on for the
    daemon the CLI starts (see hook_support) unless ``hooks`` is False: then the daemon sees
    the variable as a user's would. A new home gets the starter as a daemon's first start would
    import it (see home_support) unless ``seed`` is False.
    """

    def __init__(
        self, home: Path, *, hooks: bool | None = None, seed: bool = True, **env: str
    ) -> None:
        self.home = home
        if seed:
            seed_home(home)
        home.mkdir(parents=True, exist_ok=True)
        base = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("LOCALLLM_", "HF_", "HUGGING_FACE_")) and k != "COLUMNS"
        }
        self.env: dict[str, str] = {
            **base,
            "LOCALLLM_HOME": str(home),
            "LOCALLLM_HOST": f"127.0.0.1:{free_port()}",
            "LOCALLLM_NUM_THREADS": "1",
            "LOCALLLM_NUM_PARALLEL": "2",
            "LOCALLLM_CONTEXT_LENGTH": "1024",
            "LOCALLLM_REGISTRY": closed_port_url(),
            "HF_ENDPOINT": closed_port_url(),
            # no MCP servers but a test's own: never the ones this machine's user configured
            "LOCALLLM_MCP_CONFIG": str(home / "mcp.json"),
            # no speed probe at the daemon's quiet moments beside the suite, unless asked
            "LOCALLLM_SPEED_PROBE": "off",
            # no spare runner (a process importing llama.cpp after a daemon's first load, 0.5 s
            # of CPU each) unless asked: its own tests ask (tests/engine/test_spare_runner.py)
            "LOCALLLM_SPARE_RUNNER": "off",
            **env,
        }
        if hooks if hooks is not None else asks_for_hooks(env):
            self.env = with_hooks(self.env)
        self.settings = Settings.from_env(self.env)

    # -- running the CLI ------------------------------------------------------------------

    def run(
        self, *args: str, input: str | None = None, timeout: float = 180
    ) -> subprocess.CompletedProcess[str]:
        """``localllm ARGS`` to completion (stdin: ``input``, else nothing)."""
        return subprocess.run(
            [sys.executable, "-m", "localllm", *args],
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
            check=False,
        )

    def ok(self, *args: str, input: str | None = None) -> str:
        """``localllm ARGS`` that must succeed; its stdout."""
        result = self.run(*args, input=input)
        assert result.returncode == 0, f"localllm {' '.join(args)} failed:\n{result.stderr}"
        return result.stdout

    def json(self, *args: str) -> Any:
        """``localllm ARGS --json`` parsed."""
        return json.loads(self.ok(*args, "--json"))

    def fails(self, *args: str, input: str | None = None) -> str:
        """``localllm ARGS`` that must fail the user-error way; its stderr (no traceback)."""
        result = self.run(*args, input=input)
        assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr, result.stderr
        return result.stderr

    def spawn(self, *args: str, timeout: float = 120, columns: int = 100) -> Any:
        """``localllm ARGS`` in a pseudo-terminal (a ``pexpect.spawn``)."""
        import pexpect

        return pexpect.spawn(
            sys.executable,
            ["-m", "localllm", *args],
            env=self.env,
            encoding="utf-8",
            timeout=timeout,
            dimensions=(40, columns),
        )

    def popen(self, *args: str, stdout: int = subprocess.DEVNULL) -> subprocess.Popen[str]:
        """``localllm ARGS`` started, as a child of the test (stderr piped, text)."""
        return subprocess.Popen(
            [sys.executable, "-m", "localllm", *args],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
        )

    def serve(self) -> subprocess.Popen[str]:
        """``localllm serve`` in the foreground, as a child of the test (stderr piped)."""
        return self.popen("serve")

    def client(self) -> Client:
        """A client of this home's daemon (TCP, as the CLI's LOCALLLM_HOST says)."""
        return Client(self.settings)

    # -- the daemon -----------------------------------------------------------------------

    @property
    def serve_log(self) -> Path:
        """Where daemons started by the CLI write their output."""
        return self.settings.log_dir / "serve.log"

    def daemon_pid(self) -> int | None:
        """The pid of the daemon holding this home's lock, if one runs."""
        lock = self.settings.runtime_dir / "daemon.lock"
        try:
            pid = int(lock.read_text().strip())
        except (OSError, ValueError):
            return None
        # A stale lock file may name a pid reused by an unrelated process: check it is ours
        # (an exited daemon not yet reaped by its new parent has no environ to read).
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            return None
        ours = f"LOCALLLM_HOME={self.home}".encode() in environ
        return pid if ours and b"localllm" in b" ".join(cmdline) else None

    def stop_daemon(self, timeout: float = 60) -> None:
        """SIGTERM the daemon of this home (if any) and wait until it has exited."""
        pid = self.daemon_pid()
        if pid is None:
            return
        try:
            handle = os.pidfd_open(pid)
        except ProcessLookupError:
            return
        try:
            os.kill(pid, signal.SIGTERM)
            ready, _, _ = select.select([handle], [], [], timeout)
            if not ready:
                os.kill(pid, signal.SIGKILL)
                select.select([handle], [], [], timeout)
                raise AssertionError(f"the daemon (pid {pid}) ignored SIGTERM for {timeout}s")
        finally:
            os.close(handle)


@contextlib.contextmanager
def cli_home(
    home: Path, *, hooks: bool | None = None, seed: bool = True, **env: str
) -> Iterator[CliHome]:
    """A :class:`CliHome` whose daemon, however it was started, is stopped at the end."""
    cli = CliHome(home, hooks=hooks, seed=seed, **env)
    try:
        yield cli
    finally:
        cli.stop_daemon()


def wait_for_stats(
    cli: CliHome, condition: Callable[[dict[str, Any]], bool], timeout: float = 120
) -> dict[str, Any]:
    """Read the daemon's live stats stream until ``condition(snapshot)`` holds."""
    import time

    deadline = time.monotonic() + timeout
    with cli.client() as client:
        for snapshot in client.stats_stream(interval=0.05):
            if condition(dict(snapshot)):
                return dict(snapshot)
            if time.monotonic() > deadline:
                raise AssertionError(f"condition not met within {timeout}s: {snapshot}")
    raise AssertionError("the stats stream ended")


def daemon_log(cli: CliHome) -> str:
    """The daemon's own log so far."""
    path = cli.settings.log_dir / "daemon.log"
    return path.read_text(errors="replace") if path.exists() else ""
