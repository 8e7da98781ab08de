"""The service files in ``packaging/``: the systemd user unit (checked by ``systemd-analyze
verify``), the launchd agent, and the desktop entry that opens the terminal UI."""

from __future__ import annotations

import configparser
import plistlib
import shutil
import subprocess
from pathlib import Path

import pytest

PACKAGING = Path(__file__).resolve().parents[2] / "packaging"
UNIT = PACKAGING / "systemd" / "localllm.service"


def _unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read_string(UNIT.read_text())
    return parser


def test_systemd_unit_runs_serve_for_the_user_session() -> None:
    unit = _unit()
    assert unit["Service"]["ExecStart"] == "%h/.local/bin/localllm serve"
    assert unit["Service"]["KillMode"] == "mixed"  # SIGTERM to the daemon, which stops runners
    assert unit["Install"]["WantedBy"] == "default.target"  # a user unit: no multi-user.target


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd is not installed")
@pytest.mark.parametrize("mode", ["--user", "--system"])
def test_systemd_unit_verifies_without_warnings(tmp_path: Path, mode: str) -> None:
    # verify checks that ExecStart's program exists: point it at a stand-in executable
    program = tmp_path / "bin" / "localllm"
    program.parent.mkdir()
    program.write_text("#!/bin/sh\nexit 0\n")
    program.chmod(0o755)
    unit = tmp_path / "localllm.service"
    unit.write_text(UNIT.read_text().replace("%h/.local/bin/localllm", str(program)))
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    result = subprocess.run(
        ["systemd-analyze", mode, "verify", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "XDG_RUNTIME_DIR": str(runtime)},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr  # unknown keys are only warnings


def test_launchd_agent_runs_serve_at_login() -> None:
    with open(PACKAGING / "macos" / "io.localllm.serve.plist", "rb") as handle:
        agent = plistlib.load(handle)
    assert agent["Label"] == "io.localllm.serve"
    assert agent["ProgramArguments"][:2] == ["/bin/sh", "-c"]
    assert "exec localllm serve" in agent["ProgramArguments"][2]
    assert agent["RunAtLoad"] is True
    assert agent["KeepAlive"] == {"SuccessfulExit": False}  # restarted only after a failure


def test_desktop_entry_opens_the_tui_in_a_terminal() -> None:
    path = PACKAGING / "linux" / "localllm.desktop"
    entry = configparser.ConfigParser(interpolation=None)
    entry.optionxform = str  # type: ignore[assignment,method-assign]
    entry.read_string(path.read_text())
    desktop = entry["Desktop Entry"]
    assert desktop["Type"] == "Application"
    assert desktop["Exec"] == "localllm tui"
    assert desktop["Terminal"] == "true"
    assert "ConsoleOnly" in desktop["Categories"].split(";")
    validator = shutil.which("desktop-file-validate")
    if validator is not None:
        result = subprocess.run([validator, str(path)], capture_output=True, text=True, check=False)
        assert result.returncode == 0 and not result.stdout.strip(), result.stdout


def test_packaging_readme_says_how_to_enable_and_build_for_gpus() -> None:
    readme = (PACKAGING / "README.md").read_text()
    assert "systemctl --user enable --now localllm.service" in readme
    assert 'CMAKE_ARGS="-DGGML_CUDA=on"' in readme
    assert 'CMAKE_ARGS="-DGGML_METAL=on"' in readme
