"""``localllm search``, ``show hf.co/...`` before download, and ``pull`` picking a quantization,
through the daemon against a loopback Hub. The speed figures are a fixed calibration placed in
the cache dir (the probe itself is tested in test_speed.py), so no probe runs here."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes.helpers import TinyModels
from fakes.hf_hub import FakeHub
from speed_support import seed_calibration
from test_cli_support import CliHome, cli_home, closed_port_url

from localllm.gguf_info import inspect_gguf_header

pytest_plugins = ["fakes.fixtures"]

REPO = "hf.co/tester/tiny-GGUF"


@pytest.fixture(scope="module")
def module_hub(tiny_models: TinyModels, tiny_projector: bytes) -> Iterator[FakeHub]:
    with FakeHub() as server:
        server.add_repo(
            "tester/tiny-GGUF",
            {
                "tiny-F32.gguf": tiny_models.f32,
                "tiny-F16.gguf": tiny_models.f16,
                "tiny-Q8_0.gguf": tiny_models.other,
                "tiny.Q4_K_M.gguf": tiny_models.f16[:-1] + b"\x02",
                "mmproj-tiny-F16.gguf": tiny_projector,
            },
            downloads=1234,
            likes=7,
        )
        server.add_repo("tester/tinier-GGUF", {"t-Q4_0.gguf": tiny_models.f32}, likes=99)
        server.add_repo("tester/safetensors", {"model.safetensors": b"\0" * 64})
        server.add_repo("tester/gated-GGUF", {"g-Q8_0.gguf": tiny_models.other}, gated=True)
        yield server


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory, module_hub: FakeHub) -> Iterator[CliHome]:
    root = tmp_path_factory.mktemp("discover-cli")
    cache = root / "cache"
    seed_calibration(cache, threads=1)
    with cli_home(
        root / "home",
        HF_ENDPOINT=module_hub.url,
        XDG_CACHE_HOME=str(cache),
        # plain decoding: what the speed model predicts (and what the speed book learns from)
        LOCALLLM_SPECULATIVE="off",
    ) as c:
        yield c


@pytest.fixture
def hub(module_hub: FakeHub) -> Iterator[FakeHub]:
    yield module_hub
    module_hub.api_failure = None


def test_search_lists_gguf_repositories(cli: CliHome) -> None:
    out = cli.ok("search", "tin")
    lines = out.splitlines()
    assert lines[0].split() == [
        "NAME",
        "PARAMS",
        "ARCH",
        "CONTEXT",
        "DOWNLOADS",
        "LIKES",
        "UPDATED",
    ]
    assert lines[1].startswith(REPO) and "1.2k" in lines[1] and "llama" in lines[1]
    assert "localllm show hf.co/<user>/<repo>" in out
    by_likes = cli.json("search", "tin", "--sort", "likes", "--limit", "1")
    assert [m["name"] for m in by_likes["models"]] == ["hf.co/tester/tinier-GGUF"]
    assert by_likes["next_cursor"]
    second = cli.ok("search", "tin", "--sort", "likes", "--limit", "1", "--page", "2")
    assert REPO in second and "tinier" not in second
    assert "no GGUF models on Hugging Face match" in cli.ok("search", "zzz-nothing")
    error = cli.fails("search", "tin", "--sort", "size")
    assert error.strip().endswith(
        "sort must be one of downloads, likes, updated, trending, created"
    )


def test_show_before_download_lists_each_quantization_with_fit_and_speed(cli: CliHome) -> None:
    out = cli.ok("show", REPO)
    assert out.startswith(f"{REPO}  (llama, ")
    assert "vision part: mmproj-tiny-F16.gguf" in out
    table = [line for line in out.splitlines() if line.startswith(("F32", "F16", "Q8_0", "Q4_K_M"))]
    assert len(table) == 4
    for row in table:
        assert "CPU only" in row and "× 1,024" in row
    assert f"localllm pull {REPO}" in out
    data = cli.json("show", REPO)
    (q8,) = [q for q in data["quants"] if q["label"] == "Q8_0"]
    assert q8["fit"] == "cpu" and q8["predicted"]["decode"] > 0 and q8["predicted"]["prefill"] > 0
    assert data["header"] == "Q4_K_M" and q8["shapes"] == "scaled from Q4_K_M"
    one = cli.json("show", f"{REPO}:Q8_0")
    assert [q["label"] for q in one["quants"]] == ["Q8_0"] and one["quants"][0][
        "shapes"
    ] == "header"


def test_pull_without_a_tag_picks_the_best_fit_and_says_why(cli: CliHome) -> None:
    result = cli.run("pull", REPO)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0].startswith("picked Q8_0 (") and "predicted" in lines[0]
    assert "the largest quantization that runs wholly on the CPU" in lines[0]
    assert "F16/BF16/F32 left out" in lines[0]
    assert "using tiny-Q8_0.gguf (Q8_0)" in result.stderr and lines[-1] == "success"
    assert f"{REPO}:latest" in cli.ok("list")
    shown = cli.json("show", REPO)  # in the store now: the ordinary show
    assert shown["details"]["quantization_level"] == "F32"  # tiny-Q8_0.gguf's own header
    assert REPO in cli.ok("show", REPO, "--hub").splitlines()[0]


def test_pull_quant_overrides_the_pick(cli: CliHome) -> None:
    result = cli.run("pull", REPO, "--quant", "F16")
    assert result.returncode == 0, result.stderr
    assert "picked" not in result.stderr and "using tiny-F16.gguf (F16)" in result.stderr
    assert f"{REPO}:F16" in cli.ok("list")
    error = cli.fails("pull", f"{REPO}:Q8_0", "--quant", "F16")
    assert "give the tag or --quant, not both" in error


def test_a_local_show_puts_predicted_beside_measured(cli: CliHome, tiny_models: TinyModels) -> None:
    name = f"{REPO}:F16"
    cli.ok("pull", name)  # (again: the blobs are there already when another test pulled it)
    out = cli.ok("show", name)
    decode = next(line for line in out.splitlines() if line.strip().startswith("decode"))
    assert "predicted" in decode and "tokens/s" in decode and "measured" not in decode
    with cli.client() as client:
        before = client.speed(name)
        assert before["predicted"]["decode"] > 0 and "measured" not in before
        # one request alone, long enough to count (its end of text forbidden, so that it
        # runs its 24 tokens): the speed book learns its rates
        eos = inspect_gguf_header(tiny_models.f16, len(tiny_models.f16), "f16").metadata[
            "tokenizer.ggml.eos_token_id"
        ]
        body = {
            "model": name,
            "prompt": " ".join(f"w{i}" for i in range(120)),
            "max_tokens": 24,
            "temperature": 0,
            "logit_bias": {str(eos): -100},
        }
        answer = client.openai_completion(body)
        assert answer["usage"]["completion_tokens"] == 24
        after = client.speed(name)
    assert after["measured"]["requests"] == 1
    assert after["measured"]["decode"] > 0 and after["measured"]["prefill"] > 0
    decode = next(line for line in cli.ok("show", name).splitlines() if "decode" in line)
    assert "predicted" in decode and "measured" in decode and "(1 requests)" in decode
    # loaded now: ps puts the prediction beside the live rate
    (loaded,) = [m for m in cli.json("ps") if m["name"] == name]
    assert loaded["speed"]["predicted"]["decode"] > 0
    header, row = cli.ok("ps").splitlines()[:2]
    predicted = row[header.index("PREDICTED") :].split()[0]
    assert predicted == f"{loaded['speed']['predicted']['decode']:.0f}"


@pytest.mark.parametrize(
    ("args", "failure", "expected"),
    [
        (
            ["show", "hf.co/tester/tinier-GGUF"],
            (429, {"Retry-After": "30"}),
            "Error: Hugging Face is rate-limiting this machine, try again in 30 s",
        ),
        (["search", "tin"], (503, {}), "Error: Hugging Face at http://127.0.0.1"),
        (["show", "hf.co/tester/safetensors"], None, "Error: hf.co/tester/safetensors has no GGUF"),
        (["show", "hf.co/tester/missing"], None, "Error: hf.co/tester/missing was not found"),
    ],
)
def test_hub_errors_are_one_line(
    cli: CliHome,
    hub: FakeHub,
    args: list[str],
    failure: tuple[int, dict[str, str]] | None,
    expected: str,
) -> None:
    hub.api_failure = failure
    error = cli.fails(*args)
    assert error.strip().splitlines()[-1].startswith(expected), error
    assert len([line for line in error.splitlines() if line.startswith("Error")]) == 1
    if failure and failure[0] == 429:
        assert "try again in 30 s" in error


def test_a_gated_repository_is_shown_with_how_to_log_in(cli: CliHome) -> None:
    out = cli.ok("show", "hf.co/tester/gated-GGUF")
    assert "gated: accept its conditions" in out
    assert "~ from the Hub's metadata alone" in out and "huggingface-cli login" in out


def test_no_network_is_one_line(tmp_path: Path) -> None:
    with cli_home(tmp_path / "home", HF_ENDPOINT=closed_port_url()) as offline:
        error = offline.fails("search", "tiny")
    assert error.strip().splitlines()[-1].startswith("Error: cannot reach Hugging Face at http://")
