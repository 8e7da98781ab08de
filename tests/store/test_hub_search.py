"""Looking around the Hugging Face Hub before downloading (localllm.sources.hub), through the real
``huggingface_hub`` client against a loopback Hub: search and its pages, a repository's
quantizations, a GGUF header read with Range requests, and every way the Hub can fail."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes.helpers import TinyModels
from fakes.hf_hub import FakeHub
from test_cli_support import closed_port_url

from localllm._exceptions import (
    AuthRequiredError,
    NetworkError,
    RateLimitedError,
    RemoteNotFoundError,
)
from localllm.gguf_info import inspect_gguf
from localllm.settings import Settings
from localllm.sources.hub import HEADER_LIMIT, list_repo, read_header, search_hub

pytest_plugins = ["fakes.fixtures"]

SMOL_REPO = "someone/SmolLM2-135M-Instruct-GGUF"


@pytest.fixture(scope="module")
def module_hub(
    tiny_models: TinyModels, tiny_projector: bytes, smollm2_gguf: Path
) -> Iterator[FakeHub]:
    """Repositories to search and list: three GGUF ones with their own downloads and likes,
    a split model, a projector, one without GGUF files, one gated."""
    with FakeHub() as server:
        server.add_repo(
            SMOL_REPO,
            {"SmolLM2-135M-Instruct-Q4_1.gguf": smollm2_gguf.read_bytes(), "README.md": b"#\n"},
            downloads=900,
            likes=3,
            card={"base_model": "HuggingFaceTB/SmolLM2-135M-Instruct", "license": "apache-2.0"},
        )
        parts = {
            f"Q8_0/tiny-Q8_0-0000{i + 1}-of-00003.gguf": p for i, p in enumerate(tiny_models.split)
        }
        server.add_repo(
            "tester/tiny-GGUF",
            {
                "tiny-F16.gguf": tiny_models.f16,
                "tiny.Q4_K_M.gguf": tiny_models.f32,
                "mmproj-tiny-F16.gguf": tiny_projector,
                **parts,
            },
            downloads=50,
            likes=40,
            last_modified="2026-02-01T00:00:00.000Z",
        )
        server.add_repo("tester/tinier-gguf", {"x-Q4_0.gguf": tiny_models.other}, downloads=10)
        server.add_repo("tester/tiny-safetensors", {"model.safetensors": b"\0" * 64})
        server.add_repo("tester/gated-GGUF", {"g-Q4_0.gguf": tiny_models.other}, gated=True)
        yield server


@pytest.fixture
def hub(module_hub: FakeHub) -> Iterator[FakeHub]:
    """The module's Hub with its request log cleared and its fault switches off after."""
    module_hub.requests.clear()
    module_hub.cdn.requests.clear()
    module_hub.cdn.body_bytes.clear()
    yield module_hub
    module_hub.api_failure = None
    module_hub.api_stall = False


@pytest.fixture
def settings(home: Path, hub: FakeHub) -> Settings:
    return Settings.from_env({"LOCALLLM_HOME": str(home), "HF_ENDPOINT": hub.url})


def test_search_returns_gguf_repositories_with_what_the_hub_says(settings: Settings) -> None:
    page = search_hub(settings, "tin")
    names = [m.repo_id for m in page.models]
    # GGUF repositories only, most downloaded first; the gated one is listed as gated
    assert names == ["tester/tiny-GGUF", "tester/tinier-gguf"]
    tiny = page.models[0]
    assert (tiny.downloads, tiny.likes, tiny.name) == (50, 40, "hf.co/tester/tiny-GGUF")
    assert tiny.last_modified and tiny.last_modified.startswith("2026-02-01")
    assert tiny.architecture == "llama" and tiny.parameters and tiny.parameters > 0
    assert page.next_cursor is None
    smol = search_hub(settings, "smollm2").models[0]
    assert (smol.context_length, smol.parameters) == (8192, 134515008)


def test_search_sorts_and_pages_with_one_request_a_page(settings: Settings, hub: FakeHub) -> None:
    assert search_hub(settings, "", sort="likes").models[0].repo_id == "tester/tiny-GGUF"
    hub.requests.clear()
    first = search_hub(settings, "", limit=2)
    assert len(first.models) == 2 and first.next_cursor
    second = search_hub(settings, "", limit=2, cursor=first.next_cursor)
    seen = [m.repo_id for m in first.models + second.models]
    assert len(seen) == len(set(seen)) == 4  # four GGUF repositories, none twice
    assert [r.path for r in hub.requests] == ["/api/models", "/api/models"]
    assert "gated-GGUF" in " ".join(seen)
    with pytest.raises(ValueError, match="sort must be one of"):
        search_hub(settings, "", sort="size")


def test_a_repository_lists_its_quantizations_with_split_parts_summed(
    settings: Settings, tiny_models: TinyModels, tiny_projector: bytes
) -> None:
    listing = list_repo(settings, "tester/tiny-GGUF")
    by_label = {q.label: q for q in listing.quants}
    assert set(by_label) == {"F16", "Q4_K_M", "Q8_0"}
    split = by_label["Q8_0"]
    assert len(split.files) == 3 and split.size == sum(len(p) for p in tiny_models.split)
    assert split.to_dict()["split"] is True
    assert [q.size for q in listing.quants] == sorted(q.size for q in listing.quants)
    # the projector is the vision part, never a quantization; it goes with the models beside it
    assert [p.path for p in listing.projectors] == ["mmproj-tiny-F16.gguf"]
    assert by_label["F16"].projector is not None
    assert by_label["F16"].projector.size == len(tiny_projector)
    assert split.projector is None  # in another folder
    assert listing.find("q4_k_m").label == "Q4_K_M"
    with pytest.raises(RemoteNotFoundError, match="no IQ1_S quantization; available"):
        listing.find("IQ1_S")


def test_a_header_is_read_with_ranges_never_the_weights(
    settings: Settings, hub: FakeHub, smollm2_gguf: Path
) -> None:
    listing = list_repo(settings, SMOL_REPO)
    assert listing.card["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    (info,) = read_header(settings, listing, listing.quants[0])
    whole = inspect_gguf(smollm2_gguf)
    assert info.tensors == whole.tensors and info.metadata == whole.metadata
    ranges = [r.headers.get("range") for r in hub.cdn.requests]
    assert ranges and all(r and r.startswith("bytes=") for r in ranges)
    sent = sum(hub.cdn.body_bytes.values())
    assert sent <= HEADER_LIMIT and sent < whole.file_size // 10


def test_split_models_are_read_part_by_part(settings: Settings) -> None:
    listing = list_repo(settings, "tester/tiny-GGUF")
    parts = read_header(settings, listing, listing.find("Q8_0"))
    assert len(parts) == 3
    assert parts[0].architecture == "llama" and all(p.tensors for p in parts)


def test_no_gguf_says_so(settings: Settings) -> None:
    with pytest.raises(RemoteNotFoundError, match="has no GGUF model files"):
        list_repo(settings, "tester/tiny-safetensors")
    with pytest.raises(RemoteNotFoundError, match="was not found on Hugging Face"):
        list_repo(settings, "tester/missing")


def test_a_gated_repository_says_how_to_log_in(settings: Settings) -> None:
    listing = list_repo(settings, "tester/gated-GGUF")  # the file list is public
    assert listing.model.gated
    with pytest.raises(AuthRequiredError) as caught:
        read_header(settings, listing, listing.quants[0])
    assert "HF_TOKEN" in str(caught.value) and "huggingface-cli login" in str(caught.value)


@pytest.mark.parametrize(
    ("headers", "wait"),
    [({"Retry-After": "7"}, 7.0), ({"RateLimit": '"api";r=0;t=55'}, 55.0), ({}, None)],
)
def test_rate_limits_say_when_to_retry(
    settings: Settings, hub: FakeHub, headers: dict[str, str], wait: float | None
) -> None:
    hub.api_failure = (429, headers)
    with pytest.raises(RateLimitedError) as caught:
        search_hub(settings, "tiny")
    assert caught.value.retry_after == wait
    when = f"try again in {wait:.0f} s" if wait is not None else "try again in a minute"
    assert when in str(caught.value)
    assert len(hub.requests) == 1  # no retries behind the caller's back


def test_a_hub_that_is_down_or_silent_is_a_network_error(settings: Settings, hub: FakeHub) -> None:
    hub.api_failure = (503, {})
    with pytest.raises(NetworkError, match="answered HTTP 503"):
        list_repo(settings, "tester/tiny-GGUF")
    hub.api_failure = None
    hub.api_stall = True
    with pytest.raises(NetworkError, match="cannot reach Hugging Face"):
        search_hub(settings.replace(hub_timeout=0.3), "tiny")


def test_no_network_is_one_line(home: Path) -> None:
    settings = Settings.from_env({"LOCALLLM_HOME": str(home), "HF_ENDPOINT": closed_port_url()})
    with pytest.raises(NetworkError) as caught:
        search_hub(settings, "tiny")
    assert str(caught.value).startswith("cannot reach Hugging Face at http://127.0.0.1")
    assert "\n" not in str(caught.value)
