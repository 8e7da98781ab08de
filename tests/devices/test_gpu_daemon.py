"""The daemon with a model on a real GPU device: what ``ps`` and ``show`` say, and GPU faults.

On lavapipe in CI (see test_gpu.py). Faults: a software device cannot be lost or run out of
memory on purpose, so ``LOCALLLM_TEST_FAULT`` stands in for the GPU at a chosen decode (the
status ``llama_decode`` returns when a backend fails, or the abort a lost Vulkan device
causes); everything after it, in the runner and the daemon, is the real path.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_cli_support import CliHome, cli_home
from tiny_gguf import write_tiny_gguf

pytestmark = [pytest.mark.gpu, pytest.mark.slow, pytest.mark.usefixtures("gpu_device")]

TIMEOUT = 600.0


@pytest.fixture(scope="module")
def modelfile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("gpu-daemon")
    tiny = write_tiny_gguf(folder / "tiny.gguf", never_ends=True)
    (folder / "Modelfile").write_text(f"FROM {tiny}\n")
    return folder / "Modelfile"


@contextlib.contextmanager
def _home(tmp_path: Path, modelfile: Path, **env: str) -> Iterator[CliHome]:
    with cli_home(tmp_path / "home", **env) as cli:
        cli.ok("create", "tiny", "-f", str(modelfile))
        yield cli


def _generate(cli: CliHome, tokens: int = 4) -> httpx.Response:
    body = {
        "model": "tiny",
        "prompt": "a few words for the device",
        "raw": True,
        "stream": False,
        "options": {"num_predict": tokens, "temperature": 0},
    }
    return httpx.post(f"{cli.settings.base_url}/api/generate", json=body, timeout=TIMEOUT)


def _ps(cli: CliHome) -> dict[str, Any]:
    (entry,) = httpx.get(f"{cli.settings.base_url}/api/ps", timeout=60).json()["models"]
    return entry


def test_ps_and_show_report_the_layers_and_memory_on_the_device(
    tmp_path: Path, modelfile: Path, gpu_device: dict[str, Any]
) -> None:
    with _home(tmp_path, modelfile) as cli:
        assert _generate(cli).status_code == 200
        entry = _ps(cli)
        device = str(gpu_device["name"])
        # What the load allocated there, llama.cpp's own figures.
        assert entry["allocated"][device] > 0
        assert entry["size_vram"] >= entry["allocated"][device]
        assert 0 < entry["size_vram"] < entry["size"]  # token embeddings stay on the CPU
        table = cli.ok("ps")
        assert re.search(r"\d+%/\d+% CPU/GPU|100% GPU", table), table
        shown = cli.ok("show", "tiny")
        assert f"3 on {device}" in shown, shown
        # A partial offload asked for: one layer there, the rest on the CPU.
        body = {"model": "tiny", "prompt": "x", "raw": True, "stream": False}
        body["options"] = {"num_predict": 2, "num_gpu": 1}
        assert httpx.post(
            f"{cli.settings.base_url}/api/generate", json=body, timeout=TIMEOUT
        ).is_success
        partial = _ps(cli)
        assert 0 < partial["size_vram"] < entry["size_vram"]


@pytest.mark.parametrize(
    ("fault", "named"),
    [
        ("decode-failed@2", "the GPU failed to compute the batch"),
        ("device-lost@2", "the GPU failed (ggml_vulkan: Device lost"),
    ],
)
def test_a_gpu_fault_ends_its_request_named_and_a_second_one_moves_the_model_to_the_cpu(
    tmp_path: Path, modelfile: Path, fault: str, named: str
) -> None:
    with _home(tmp_path, modelfile, LOCALLLM_TEST_FAULT=fault) as cli:
        # The GPU fails the first generated token: the request ends with the GPU's error.
        first = _generate(cli)
        assert first.status_code >= 500 and named in first.text, first.text
        # The model loads again on the GPU for the next request, which fails the same way.
        second = _generate(cli)
        assert second.status_code >= 500 and named in second.text, second.text
        # Twice in ten minutes: the device is taken to be unusable, the model runs on the CPU.
        third = _generate(cli)
        assert third.status_code == 200, third.text
        assert third.json()["eval_count"] == 4
        entry = _ps(cli)
        assert entry["size_vram"] == 0
        assert "the GPU failed 2 times" in entry["gpu_fallback"]
        table = cli.ok("ps")
        assert "100% CPU" in table and "tiny:latest on the CPU: the GPU failed" in table
        log = (cli.settings.log_dir / "daemon.log").read_text(errors="replace")
        assert "runs on the CPU until the daemon restarts" in log


def test_the_speed_probe_measures_the_device_and_show_predicts_on_it(
    tmp_path: Path, modelfile: Path, gpu_device: dict[str, Any]
) -> None:
    # Declared never quiet, doctor keeps what it measures even where a figure did not settle:
    # lavapipe's threads share CI's two cores with the probe, and this test is about pricing on
    # the device (test_cli_doctor and test_speedwatch are about figures that are not kept).
    quiet = {"LOCALLLM_SPEED_PROBE_QUIET": "1"}
    with _home(tmp_path, modelfile, XDG_CACHE_HOME=str(tmp_path / "cache"), **quiet) as cli:
        doctor = cli.run("doctor", timeout=TIMEOUT)
        assert doctor.returncode == 0, doctor.stderr
        device = str(gpu_device["name"])
        software = "a software device" if gpu_device.get("software") else ""
        said = re.search(rf"on {device} \(.*\): a decode step [\d.]+ ms", doctor.stdout)
        assert said and software in said.group(0), doctor.stdout
        assert re.search(r"Q8_0 +decode +[\d.]+ [MG]B/s, prefill +[\d.]+ GFLOP/s", doctor.stdout)
        # show prices the layers the plan puts on the device at the device's figures
        shown = cli.ok("show", "tiny")
        assert re.search(r"decode\s+predicted [\d.,]+ tokens/s", shown), shown
        assert f"predicted on {device}" in re.sub(r"\s+", " ", shown), shown
        assert software in shown
