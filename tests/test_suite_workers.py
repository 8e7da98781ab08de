"""The suite's own machinery: a test marked ``alone`` overlaps no other test (tests/support/
workers.py), checked on a small suite run by pytest-xdist in a child pytest."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SUPPORT = Path(__file__).parent / "support"

INNER = """
import json, os, time
import pytest

def _record(tmp_path_factory, name, spin):
    began = time.time()
    end = time.monotonic() + spin
    while time.monotonic() < end:  # busy, as a real test is, for a moment
        pass
    out = tmp_path_factory.getbasetemp().parent / f"{name}.json"
    out.write_text(json.dumps([began, time.time(), os.environ.get("PYTEST_XDIST_WORKER")]))

@pytest.mark.alone
def test_alone(tmp_path_factory):
    _record(tmp_path_factory, "alone", 0.3)

@pytest.mark.parametrize("n", range(8))
def test_other(tmp_path_factory, n):
    _record(tmp_path_factory, f"other{n}", 0.1)
"""


def test_a_test_marked_alone_overlaps_no_other(tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(INNER)
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nmarkers =\n    alone: runs alone\naddopts = -p workers\n"
    )
    base = tmp_path / "base"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-n",
            "2",
            "-p",
            "no:cacheprovider",
            f"--basetemp={base}",
            "test_inner.py",
        ],
        cwd=tmp_path,
        env={**_env(), "PYTHONPATH": str(SUPPORT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    spans = {path.stem: json.loads(path.read_text()) for path in base.glob("*.json")}
    assert len(spans) == 9
    began, ended, _ = spans.pop("alone")
    workers = {worker for _, _, worker in spans.values()}
    assert len(workers) == 2, workers  # the others did run on two workers at once
    for name, (other_began, other_ended, _) in spans.items():
        assert other_ended <= began or other_began >= ended, (name, spans)


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
