"""The CLI finds the running daemon whatever ``XDG_RUNTIME_DIR`` says (issue 10, part 3).

With ``LOCALLLM_HOME`` and ``LOCALLLM_HOST`` unset, as a user has them, the socket's place
depends on ``XDG_RUNTIME_DIR``: set in a desktop shell, unset under sudo, cron or some ssh
sessions. A daemon started in one must be found from the other (over TCP, since its socket is
elsewhere) instead of a second daemon being started, and no command may print platformdirs'
``RuntimeDirWarning``.

Unset ``LOCALLLM_HOST`` means the default port, 11435, which other tests and a developer's own
daemon use too. So the scenario runs in a private network namespace (``unshare -rn``, its own
loopback) when the system allows one; otherwise on this machine's loopback if 11435 is free.
The scenario is this file run as a script; the test asserts on the JSON it prints.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

DEFAULT_PORT = 11435
_ASYNC_PROBE = """
import asyncio
from localllm.client import AsyncClient
from localllm.settings import Settings

async def main():
    async with AsyncClient(Settings.from_env()) as client:
        print(await client.is_running(), client.address, await client.version())

asyncio.run(main())
"""


def _namespace_prefix() -> list[str] | None:
    """``unshare -rn`` when this system lets us make a network namespace, else None."""
    if shutil.which("unshare") is None:
        return None
    trial = subprocess.run(["unshare", "-rn", "true"], capture_output=True, check=False)
    return ["unshare", "-rn"] if trial.returncode == 0 else None


def _port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_a_daemon_is_found_whatever_xdg_runtime_dir_says(tmp_path: Path) -> None:
    prefix = _namespace_prefix()
    if prefix is None and not _port_is_free(DEFAULT_PORT):
        pytest.skip(f"no network namespace here and port {DEFAULT_PORT} is taken")
    result = subprocess.run(
        [*(prefix or []), sys.executable, __file__, str(tmp_path), "1" if prefix else "0"],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    scenarios = json.loads(result.stdout.strip().splitlines()[-1])
    assert [s["name"] for s in scenarios] == ["daemon with XDG_RUNTIME_DIR", "daemon without"]
    for scenario in scenarios:
        name = scenario["name"]
        assert scenario["list"]["status"] == 0, (name, scenario["list"]["stderr"])
        assert "smollm2:135m" in scenario["list"]["stdout"], name
        # found, not started: nothing was auto-started (its output would be in serve.log)
        assert not scenario["serve_log"], (name, scenario["serve_log"])
        for output in (scenario["list"]["stderr"], scenario["daemon_stderr"]):
            assert "RuntimeDirWarning" not in output, (name, output)
        # the terminal UI's client finds it the same way, over TCP
        running, address, version = scenario["async_probe"]["stdout"].split()
        assert (running, address) == ("True", f"http://127.0.0.1:{DEFAULT_PORT}"), scenario
        assert version, scenario
        assert scenario["daemon_status"] == 0, (name, scenario["daemon_stderr"])


# -- the scenario, run as a script (in the namespace) --------------------------------------------


def _loopback_up() -> None:
    """Bring ``lo`` up: a new network namespace starts with it down."""
    import fcntl
    import struct

    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, siocgifflags, request))[1]
        fcntl.ioctl(sock, siocsifflags, struct.pack("16sH14x", b"lo", flags | iff_up))


def _environment(root: Path, runtime_dir: Path | None) -> dict[str, str]:
    """A user's environment on a fresh machine: no LOCALLLM_HOME, no LOCALLLM_HOST."""
    from test_cli_support import closed_port_url

    dropped = ("LOCALLLM_", "XDG_", "HF_", "HUGGING_FACE_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    for key in ("TMPDIR", "COLUMNS"):
        env.pop(key, None)
    env.update(
        HOME=str(root / "user"),
        TMPDIR=str(root / "tmp"),  # the runtime dir's fallback lives here, private to the test
        LOCALLLM_NUM_THREADS="1",
        LOCALLLM_NUM_PARALLEL="1",
        LOCALLLM_CONTEXT_LENGTH="1024",
        LOCALLLM_REGISTRY=closed_port_url(),
        HF_ENDPOINT=closed_port_url(),
    )
    if runtime_dir is not None:
        env["XDG_RUNTIME_DIR"] = str(runtime_dir)
    return env


def _run(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Run a command to its end (bounded); its status and output. The output goes through
    files: a daemon it might start must not keep a pipe of ours open."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        try:
            status = subprocess.run(
                args, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err, timeout=120
            ).returncode
        except subprocess.TimeoutExpired:
            status = -1
        out.seek(0)
        err.seek(0)
        return {"status": status, "stdout": out.read(), "stderr": err.read()}


def _scenario(name: str, root: Path, daemon_env: dict[str, str], cli_env: dict[str, str]) -> Any:
    serve_log = root / "user" / ".local" / "state" / "localllm" / "logs" / "serve.log"
    daemon = subprocess.Popen(
        [sys.executable, "-m", "localllm", "serve"],
        env=daemon_env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert daemon.stderr is not None
    try:
        head = []  # what it printed up to its announcement (a warning would come first)
        for line in daemon.stderr:
            head.append(line)
            if "listening" in line:
                break
        else:
            raise SystemExit(f"{name}: the daemon did not start: {''.join(head)}")
        listed = _run([sys.executable, "-m", "localllm", "list"], cli_env)
        probe = _run([sys.executable, "-c", _ASYNC_PROBE], cli_env)
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            _, rest = daemon.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            _, rest = daemon.communicate()
    return {
        "name": name,
        "list": listed,
        "async_probe": probe,
        "serve_log": serve_log.read_text() if serve_log.exists() else "",
        "daemon_status": daemon.returncode,
        "daemon_stderr": "".join(head) + rest,
    }


def _main(root: Path, in_namespace: bool) -> None:
    if in_namespace:
        _loopback_up()
    (root / "tmp").mkdir(exist_ok=True)
    xdg = root / "xdg-runtime"
    xdg.mkdir(mode=0o700, exist_ok=True)
    with_xdg, without_xdg = _environment(root, xdg), _environment(root, None)
    results = [
        _scenario("daemon with XDG_RUNTIME_DIR", root, with_xdg, without_xdg),
        _scenario("daemon without", root, without_xdg, with_xdg),
    ]
    print(json.dumps(results))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parents[1] / "support"))  # test_cli_support
    _main(Path(sys.argv[1]), sys.argv[2] == "1")
