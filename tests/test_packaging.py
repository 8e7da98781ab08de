"""The wheel holds exactly one top-level package, with the daemon and TUI inside it."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_has_only_the_localllm_package(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("localllm-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {
        name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")
    }
    assert top_level == {"localllm"}
    # Every source folder with an __init__.py is in the wheel, under localllm/.
    for folder, prefix in (
        ("localllm", "localllm"),
        ("daemon", "localllm/daemon"),
        ("tui", "localllm/tui"),
    ):
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.relative_to(ROOT / folder).as_posix()
            assert f"{prefix}/{relative}" in names, f"{folder}/{relative} is missing from the wheel"
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "localllm = localllm.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
