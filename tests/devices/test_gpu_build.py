"""``scripts/gpu-build.sh``: the one command for a GPU flavour, and the patch it carries.

The build itself takes 10-30 minutes, so CI runs it once in its GPU step (``.ci/run``) and the
tests marked ``gpu`` run in the environment it made. Here: the script's refusals, which cost
nothing, and the Vulkan patch, checked against its own context and, where a build kept its
source (the GPU step), against that source.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-build.sh"
PATCH = ROOT / "scripts" / "patches" / "vulkan-old-headers.patch"
PATCHED_FILE = "vendor/llama.cpp/ggml/src/ggml-vulkan/ggml-vulkan.cpp"


def _run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "LOCALLLM_GPU_NO_APT": "1", **env},
        check=False,
    )


def test_an_unknown_flavour_or_missing_venv_is_the_usage_line(tmp_path: Path) -> None:
    for args in (("opencl", str(tmp_path / "venv")), ("vulkan",), ()):
        done = _run(*args)
        assert done.returncode == 2, done
        assert "usage:" in done.stderr and "vulkan|cuda|rocm|metal VENV" in done.stderr
    assert not (tmp_path / "venv").exists(), "a refused call must not create the venv"


def test_a_missing_toolchain_is_named_before_anything_is_built(tmp_path: Path) -> None:
    # A PATH without nvcc / hipconfig: the script says what to install, and creates nothing.
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("bash", "uname", "dirname", "id"):
        found = shutil.which(tool)
        assert found is not None
        (bare / tool).symlink_to(found)
    for flavour, tool in (("cuda", "nvcc"), ("rocm", "hipconfig")):
        done = _run(flavour, str(tmp_path / "venv"), PATH=str(bare))
        assert done.returncode == 1, done
        assert f"{tool} is missing" in done.stderr
    assert not (tmp_path / "venv").exists()


def _original_hunks(patch: str) -> str:
    """The text the patch expects to find, rebuilt from its context and removed lines."""
    lines = []
    for line in patch.splitlines()[2:]:
        if line.startswith("@@"):
            lines.append("// (lines between hunks)")
        elif line.startswith((" ", "-")):
            lines.append(line[1:])
    return "\n".join(lines) + "\n"


def test_the_vulkan_patch_applies_to_its_own_context_and_guards_the_extension(
    tmp_path: Path,
) -> None:
    text = PATCH.read_text()
    assert text.startswith(f"--- a/{PATCHED_FILE}\n+++ b/{PATCHED_FILE}\n")
    target = tmp_path / PATCHED_FILE
    target.parent.mkdir(parents=True)
    target.write_text(_original_hunks(text))
    done = subprocess.run(
        ["patch", "-p1", "-d", str(tmp_path)],
        input=text,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    patched = target.read_text()
    guarded = patched.split("#ifdef VK_EXT_layer_settings", 1)[1].split("#else", 1)
    assert "vk::LayerSettingsCreateInfoEXT" in guarded[0]
    fallback = guarded[1].split("#endif", 1)[0]
    assert "LayerSetting" not in fallback.replace("VK_EXT_layer_settings", "")
    assert "vk::InstanceCreateInfo instance_create_info(" in fallback


def _kept_sources() -> list[Path]:
    cache = Path(
        os.environ.get("LOCALLLM_GPU_CACHE", Path.home() / ".cache" / "localllm" / "gpu-wheels")
    )
    return sorted((cache / "sources").glob("llama_cpp_python-*.tar.gz"))


@pytest.mark.gpu
def test_the_vulkan_patch_applies_to_the_source_a_build_kept(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    sources = _kept_sources()
    if not sources:
        message = "no llama-cpp-python source kept by scripts/gpu-build.sh (LOCALLLM_GPU_CACHE)"
        if request.config.getoption("--require-gpu"):
            pytest.fail(message)
        pytest.skip(message)
    with tarfile.open(sources[-1]) as archive:
        root = archive.getnames()[0].split("/")[0]
        member = archive.getmember(f"{root}/{PATCHED_FILE}")
        archive.extractall(tmp_path, members=[member], filter="data")
    done = subprocess.run(
        ["patch", "-p1", "--dry-run", "-d", str(tmp_path / root)],
        input=PATCH.read_text(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
