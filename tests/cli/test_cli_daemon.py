"""The CLI and the daemon's life: auto-start (detached, one daemon however many commands race),
failures reported with the log's tail, ``serve`` in the foreground, and the light commands."""

from __future__ import annotations

import fcntl
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest
from test_cli_support import CliHome, cli_home

import localllm


def test_a_command_starts_a_detached_daemon_that_outlives_it(tmp_path: Path) -> None:
    # An empty home (not seeded with the starter, as the other tests' are): the first start
    # imports the starter model from its package.
    with cli_home(tmp_path / "home", seed=False) as cli:
        assert cli.daemon_pid() is None
        assert list(cli.home.iterdir()) == []
        assert "smollm2:135m" in cli.ok("list")
        pid = cli.daemon_pid()
        assert pid is not None
        with cli.client() as client:
            assert client.is_running()  # the command has exited; its daemon answers on
        assert os.getsid(pid) == pid  # its own session: Ctrl-C in the terminal cannot reach it
        assert os.readlink(f"/proc/{pid}/cwd") == "/"
        log = cli.serve_log.read_text()
        assert "started by localllm" in log and "listening on" in log
        # the next command uses it rather than starting another
        cli.ok("ps")
        assert cli.daemon_pid() == pid and log.count("listening on") == 1
    assert cli.daemon_pid() is None  # stopped by the fixture: nothing leaks


def test_racing_commands_start_one_daemon(tmp_path: Path) -> None:
    with cli_home(tmp_path / "home") as cli:
        commands = [cli.popen("list", stdout=subprocess.PIPE) for _ in range(4)]
        results = [(c.wait(120), *c.communicate()) for c in commands]
        for status, out, err in results:
            assert status == 0, err
            assert "smollm2:135m" in out
        log = cli.serve_log.read_text()
        assert log.count("started by localllm") == 1, log
        assert log.count("listening on") == 1 and "already running" not in log


def test_a_daemon_started_elsewhere_meanwhile_is_waited_for(tmp_path: Path) -> None:
    """Our daemon loses the per-home lock to one started another way: we use that one."""
    with cli_home(tmp_path / "home") as cli:
        cli.settings.runtime_dir.mkdir(parents=True)
        lock = os.open(cli.settings.runtime_dir / "daemon.lock", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(lock, fcntl.LOCK_EX)  # "another daemon" holds the home for now
        command = cli.spawn("list")
        other: subprocess.Popen[str] | None = None
        try:
            command.expect("another localllm daemon is starting; waiting for it")
            os.close(lock)
            other = cli.serve()
            command.expect("smollm2:135m")
            command.expect(pexpect.EOF)
            command.close()
            assert command.exitstatus == 0
        finally:
            command.close(force=True)
            if other is not None:
                other.send_signal(signal.SIGTERM)
                assert other.wait(60) == 0


def test_a_daemon_that_cannot_start_is_reported_with_its_log(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
        port = taken.getsockname()[1]
        with cli_home(tmp_path / "home", LOCALLLM_HOST=f"127.0.0.1:{port}") as cli:
            result = cli.run("list")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    first, *tail = result.stderr.strip().splitlines()
    assert first.startswith("Error: the localllm daemon failed to start (exit status 1)")
    assert "serve.log" in first
    assert tail and f"127.0.0.1:{port} is already in use" in tail[-1]


def test_a_remote_daemon_is_never_started(tmp_path: Path) -> None:
    with cli_home(tmp_path / "home", LOCALLLM_HOST="192.0.2.1:9") as cli:
        error = cli.fails("list")
        assert "it is not on this machine so it cannot be started from here" in error
        assert not cli.serve_log.exists()


def test_serve_runs_in_the_foreground_and_refuses_a_second(tmp_path: Path) -> None:
    cli = CliHome(tmp_path / "home")
    serve = cli.serve()
    try:
        assert serve.stderr is not None
        assert "localllm daemon listening on" in serve.stderr.readline()
        second = cli.fails("serve")
        assert re.search(r"another localllm daemon \(pid \d+\) is already running", second)
        assert len(second.strip().splitlines()) == 1
        assert "smollm2:135m" in cli.ok("list")  # commands use the foreground daemon
        assert not cli.serve_log.exists()  # nothing was auto-started
    finally:
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(60) == 0
    assert not cli.settings.socket_path.exists()


def test_version_and_help(tmp_path: Path) -> None:
    cli = CliHome(tmp_path / "home")
    assert cli.ok("version").strip() == f"localllm version {localllm.__version__}"
    assert cli.ok("--version").strip() == f"localllm version {localllm.__version__}"
    help_text = cli.ok("--help")
    for command in ["serve", "run", "pull", "list", "ps", "show", "rm", "cp", "create", "stop"]:
        assert re.search(rf"^\s+{command}\b", help_text, re.MULTILINE), command
    assert cli.daemon_pid() is None  # neither version nor help starts a daemon


# What a short command must not load: each costs it more than the whole command should.
HEAVY = [
    "anyio",
    "asyncio",
    "fastapi",
    "gguf",
    "httpcore",
    "httpx",
    "huggingface_hub",
    "jinja2",
    "llama_cpp",
    "localllm.bench",
    "localllm.client._async_client",
    "localllm.daemon",
    "localllm.gateway",
    "localllm.tui",
    "numpy",
    "PIL",
    "pydantic",
    "rich",
    "textual",
    "uvicorn",
]


# Runs the CLI as ``python -m localllm`` does, then lists every module loaded by then, however
# it was imported (``-X importtime`` misses what importlib.import_module loads).
_LIST_MODULES = """
import runpy, sys
try:
    runpy.run_module("localllm", run_name="__main__", alter_sys=True)
finally:
    sys.stderr.write("\\nmodules: " + " ".join(sorted(sys.modules)) + "\\n")
"""


def _imported(cli: CliHome, *args: str) -> set[str]:
    """The modules loaded by the end of ``localllm ARGS`` (which must succeed)."""
    result = subprocess.run(
        [sys.executable, "-c", _LIST_MODULES, *args],
        env=cli.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return set(result.stderr.rpartition("modules: ")[2].split())


def test_help_imports_nothing_heavy(tmp_path: Path) -> None:
    """``--help`` must stay fast: no HTTP client, no rich, no daemon, no llama.cpp."""
    imported = _imported(CliHome(tmp_path / "home"), "--help")
    assert "argparse" in imported  # the list is read: a check that could fail
    for heavy in [*HEAVY, "localllm.client", "localllm.cli.models"]:
        assert heavy not in imported, heavy


def test_version_and_list_import_only_what_they_need(tmp_path: Path) -> None:
    """``--version`` and ``list`` talk to a running daemon through the light client and load
    nothing else: no httpx, asyncio or rich, no daemon, gateway or llama.cpp."""
    cli = CliHome(tmp_path / "home")
    serve = cli.serve()
    try:
        assert serve.stderr is not None
        assert "listening on" in serve.stderr.readline()
        for args in (["--version"], ["list"]):
            imported = _imported(cli, *args)
            assert "localllm.client._sync_client" in imported, args  # it did ask the daemon
            for heavy in HEAVY:
                assert heavy not in imported, (args, heavy)
        assert "localllm.cli.models" in _imported(cli, "list")
    finally:
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(60) == 0


def test_tui_opens_the_terminal_ui_and_quits(tmp_path: Path) -> None:
    with cli_home(tmp_path / "home") as cli:
        tui = cli.spawn("tui", columns=100)
        try:
            tui.expect("Quit")  # the footer is drawn
            tui.send("\x11")  # ctrl+q
            tui.expect(pexpect.EOF)
            tui.close()
            assert tui.exitstatus == 0
        finally:
            tui.close(force=True)
        assert cli.daemon_pid() is not None  # started for it, as for any command


def test_tui_says_when_it_is_not_there(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib

    import localllm.cli
    import localllm.cli.tui

    def missing(name: str) -> object:
        if name.startswith("localllm.tui"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return importlib.import_module(name)

    monkeypatch.setattr(localllm.cli.tui, "import_module", missing)
    assert localllm.cli.main(["tui"]) == 1
    assert "the terminal UI is not installed yet" in capsys.readouterr().err
