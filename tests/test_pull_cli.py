"""``localllm pull``: progress on the terminal, one-line errors, and the event format."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys

import pytest
from fakes.helpers import TinyModels
from fakes.hf_hub import FakeHub

from localllm.cli import main
from localllm.progress_display import ProgressView
from localllm.settings import Settings
from localllm.sources import PullProgress

pytest_plugins = ["fakes.fixtures"]


@pytest.fixture
def no_starter(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's first use of a store would import the 100 MB starter model; skip that here."""
    monkeypatch.setattr("localllm.starter.starter_gguf_path", lambda: None)


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("hf.co/tester/missing", "Error: hf.co/tester/missing was not found on Hugging Face"),
        ("hf.co/tester/tiny-GGUF:IQ1_S", "Error: hf.co/tester/tiny-GGUF has no IQ1_S quantization"),
        ("hf.co/tester/gated", "Error: hf.co/tester/gated is gated: accept its conditions"),
    ],
)
def test_pull_errors_are_one_line(
    name: str,
    expected: str,
    hf_settings: Settings,
    hub: FakeHub,
    tiny_models: TinyModels,
    no_starter: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    hub.add_repo("tester/gated", {"gated-F16.gguf": tiny_models.f16}, gated=True)
    assert main(["pull", name]) == 1
    assert _error_line(capsys).startswith(expected)


def test_no_network_is_one_line(
    home: object,
    monkeypatch: pytest.MonkeyPatch,
    no_starter: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    assert main(["pull", "hf.co/tester/tiny-GGUF"]) == 1
    assert _error_line(capsys).startswith("Error: cannot reach Hugging Face at http://127.0.0.1")


def test_unknown_quantize_target_is_one_line(
    hf_settings: Settings, no_starter: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["pull", "hf.co/tester/tiny-GGUF:F16", "--quantize", "q3_xx"]) == 1
    assert _error_line(capsys).startswith("Error: unsupported quantization type 'q3_xx'")


def test_pull_then_list_in_a_real_process(hf_settings: Settings, tiny_models: TinyModels) -> None:
    env = dict(os.environ)
    run = [sys.executable, "-m", "localllm"]
    result = subprocess.run(
        [*run, "pull", "hf.co/tester/tiny-GGUF:F16"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "using tiny-F16.gguf (F16)" in result.stderr
    assert "success" in result.stderr
    listed = subprocess.run(
        [*run, "list"], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    assert "hf.co/tester/tiny-GGUF:F16" in listed.stdout


def test_progress_bars_show_size_speed_and_time_left() -> None:
    from rich.console import Console

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120, color_system=None)
    digest = "sha256:" + "ab" * 32
    with ProgressView(console) as view:
        view.update(PullProgress("pulling manifest"))
        view.update(PullProgress("pulling abababababab", digest, 50_000_000, 0))
        view.update(PullProgress("pulling abababababab", digest, 50_000_000, 20_000_000, 4e6))
        view.update(PullProgress("verifying sha256 digest"))
    text = out.getvalue()
    assert "pulling manifest" in text and "verifying sha256 digest" in text
    assert "pulling abababababab" in text
    assert "20.0/50.0 MB" in text
    assert "4.0 MB/s" in text
    assert "7s" in text  # 30 MB left at 4 MB/s


def test_events_are_ollama_pull_lines() -> None:
    from ollama import ProgressResponse

    event = PullProgress("pulling 0123456789ab", "sha256:" + "0" * 64, 100, 40, 12.5)
    line = event.to_json()
    parsed = ProgressResponse.model_validate(line)
    assert (parsed.status, parsed.digest, parsed.total, parsed.completed) == (
        "pulling 0123456789ab",
        "sha256:" + "0" * 64,
        100,
        40,
    )
    assert PullProgress.from_json(line) == event
    assert PullProgress("success").to_json() == {"status": "success"}
    assert event.eta_seconds == pytest.approx(60 / 12.5)
