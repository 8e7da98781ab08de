"""``localllm pull`` through the daemon (``/api/pull``) from a loopback Hugging Face Hub:
progress on the terminal, quantize on pull, one-line errors, and the event format."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator

import pytest
from fakes.helpers import TinyModels
from fakes.hf_hub import FakeHub
from test_cli_support import CliHome, cli_home

from localllm.progress_display import ProgressView
from localllm.sources import PullProgress

pytest_plugins = ["fakes.fixtures"]


@pytest.fixture(scope="module")
def module_hub(tiny_models: TinyModels) -> Iterator[FakeHub]:
    """One fake Hub for the module's daemon (which reads HF_ENDPOINT when it starts)."""
    with FakeHub() as server:
        server.add_repo(
            "tester/tiny-GGUF",
            {"tiny-F32.gguf": tiny_models.f32, "tiny-F16.gguf": tiny_models.f16},
        )
        # bytes no other pull stores: a blob already in the store is never fetched again
        server.add_repo("tester/gated", {"gated-F16.gguf": tiny_models.other}, gated=True)
        yield server


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory, module_hub: FakeHub) -> Iterator[CliHome]:
    with cli_home(tmp_path_factory.mktemp("pull-cli") / "home", HF_ENDPOINT=module_hub.url) as c:
        yield c


def test_pull_shows_progress_and_the_model_is_listed(cli: CliHome) -> None:
    result = cli.run("pull", "hf.co/tester/tiny-GGUF:F16")
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0] == "pulling manifest"
    assert "using tiny-F16.gguf (F16)" in result.stderr
    assert any(re.fullmatch(r"pulling [0-9a-f]{12}: [0-9.]+ [kM]B", line) for line in lines)
    assert lines[-1] == "success"
    assert "hf.co/tester/tiny-GGUF:F16" in cli.ok("list")


def test_pull_with_quantize_stores_the_quantized_model(cli: CliHome) -> None:
    result = cli.run("pull", "hf.co/tester/tiny-GGUF:F32", "--quantize", "q8_0")
    assert result.returncode == 0, result.stderr
    assert "quantizing F32 model to Q8_0" in result.stderr
    shown = cli.json("show", "hf.co/tester/tiny-GGUF:F32")
    assert shown["details"]["quantization_level"] == "Q8_0"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["hf.co/tester/missing"], "Error: hf.co/tester/missing was not found on Hugging Face"),
        (["hf.co/tester/tiny-GGUF:IQ1_S"], "Error: hf.co/tester/tiny-GGUF has no IQ1_S"),
        (["hf.co/tester/gated"], "Error: hf.co/tester/gated is gated: accept its conditions"),
        (["hf.co/tester/tiny-GGUF:F16", "-q", "q3_xx"], "Error: unsupported quantization type"),
        (["../escape"], "Error: invalid model name"),
    ],
)
def test_pull_errors_are_one_line(cli: CliHome, args: list[str], expected: str) -> None:
    error = cli.fails("pull", *args)
    assert error.strip().splitlines()[-1].startswith(expected)
    assert len([line for line in error.splitlines() if line.startswith("Error")]) == 1


def test_no_network_is_one_line(tmp_path_factory: pytest.TempPathFactory) -> None:
    with cli_home(tmp_path_factory.mktemp("pull-offline") / "home") as offline:
        error = offline.fails("pull", "hf.co/tester/tiny-GGUF")
    assert (
        error.strip()
        .splitlines()[-1]
        .startswith("Error: cannot reach Hugging Face at http://127.0.0.1")
    )


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


def test_status_lines_are_plain_text_on_one_line() -> None:
    from rich.console import Console

    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=40)
    with ProgressView(console) as view:
        view.update(PullProgress("using layer sha256:" + "0" * 64))
        view.update(PullProgress("[bold]not markup[/bold]"))
    assert out.getvalue().splitlines() == [
        "using layer sha256:" + "0" * 64,
        "[bold]not markup[/bold]",
    ]


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
