"""The CLI's store commands (list, show, cp, rm, create) as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def run_cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCALLLM_")}
    env["LOCALLLM_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "localllm", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_starter_model_is_listed_and_shown_without_network(home: Path) -> None:
    listed = run_cli(home, "list")
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()[:2]
    assert header.split() == ["NAME", "ID", "SIZE", "MODIFIED"]
    assert row.startswith("smollm2:135m") and "98 MB" in row

    shown = run_cli(home, "show", "smollm2:135m")
    assert shown.returncode == 0, shown.stderr
    for fragment in [
        "architecture",
        "llama",
        "134.52M",
        "Q4_1",
        "8192",
        "Template",
        "im_start",
        "apache-2.0",
    ]:
        assert fragment in shown.stdout

    data = json.loads(run_cli(home, "show", "smollm2:135m", "--json").stdout)
    assert data["details"]["quantization_level"] == "Q4_1"
    assert data["model_info"]["context_length"] == 8192


def test_create_cp_rm_round_trip(home: Path, tiny_gguf: Path) -> None:
    created = run_cli(home, "create", "tiny:f32", "--from", str(tiny_gguf))
    assert created.returncode == 0, created.stderr
    assert "created 'tiny:f32'" in created.stdout

    assert run_cli(home, "cp", "tiny:f32", "me/tiny:copy").returncode == 0
    names = {m["name"] for m in json.loads(run_cli(home, "list", "--json").stdout)}
    assert {"tiny:f32", "me/tiny:copy", "smollm2:135m"} <= names

    removed = run_cli(home, "rm", "tiny:f32")
    assert removed.returncode == 0 and "deleted 'tiny:f32'" in removed.stdout
    shown = run_cli(home, "show", "me/tiny:copy", "--json")
    assert json.loads(shown.stdout)["details"]["quantization_level"] == "F32"

    # The starter stays removed once the user removed it.
    assert run_cli(home, "rm", "smollm2:135m").returncode == 0
    assert "smollm2" not in run_cli(home, "list").stdout


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["show", "nosuchmodel"], 'model "nosuchmodel:latest" not found, try `localllm pull'),
        (["show", "../../etc/passwd"], "invalid model name"),
        (["rm", "nosuch:tag"], "not found"),
        (["cp", "nosuch", "other"], "not found"),
        (["cp", "smollm2:135m", "bad name"], "invalid model name"),
        (["create", "x", "--from", "/nonexistent/file.gguf"], "no such file"),
    ],
)
def test_user_errors_are_one_line_without_traceback(
    home: Path, args: list[str], fragment: str
) -> None:
    result = run_cli(home, *args)
    assert result.returncode == 1
    assert fragment in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_create_refuses_a_file_that_is_not_gguf(home: Path, tmp_path: Path) -> None:
    fake = tmp_path / "fake.gguf"
    fake.write_text("not a model")
    result = run_cli(home, "create", "fake", "--from", str(fake))
    assert result.returncode == 1 and "not a GGUF file" in result.stderr
    assert "fake" not in run_cli(home, "list").stdout
