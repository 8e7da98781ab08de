"""Pulling from Hugging Face through the real huggingface_hub client and a loopback Hub."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from fakes.helpers import EventLog, TinyModels
from fakes.hf_hub import FakeHub

from localllm import AuthRequiredError, RemoteNotFoundError
from localllm.daemon.devices import cpu
from localllm.settings import Settings
from localllm.sources import linked_splits, model_paths, pull
from localllm.store.manifest import MEDIA_MODEL
from localllm.store.models import load_model
from localllm.store.store import Store

pytest_plugins = ["fakes.fixtures"]

REPO = "hf.co/tester/tiny-GGUF"


def _digest(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def _model_digests(store: Store, name: str) -> list[str]:
    return [
        layer.digest for layer in store.get(name).manifest.layers if layer.media_type == MEDIA_MODEL
    ]


def test_pull_by_quant_tag_is_case_insensitive(
    store: Store, hf_settings: Settings, hub: FakeHub, tiny_models: TinyModels
) -> None:
    log = EventLog()
    entry = pull(store, f"{REPO}:q8_0", hf_settings, on_progress=log)

    assert _model_digests(store, f"{REPO}:q8_0") == [_digest(tiny_models.other)]
    assert store.blob_path(_digest(tiny_models.other)).read_bytes() == tiny_models.other
    assert entry.name.tag == "q8_0"
    assert "using tiny-Q8_0.gguf (Q8_0)" in log.statuses
    # Ollama's status sequence, with per-layer progress that ends complete.
    assert log.statuses[0] == "pulling manifest"
    assert log.statuses[-3:] == ["verifying sha256 digest", "writing manifest", "success"]
    layer_events = [e for e in log.events if e.digest == _digest(tiny_models.other)]
    assert layer_events and all(e.total == len(tiny_models.other) for e in layer_events)
    assert layer_events[-1].completed == len(tiny_models.other)
    assert [e.completed for e in layer_events] == sorted(e.completed or 0 for e in layer_events)


def test_no_tag_picks_q4_k_m(store: Store, hf_settings: Settings, tiny_models: TinyModels) -> None:
    log = EventLog()
    pull(store, REPO, hf_settings, on_progress=log)
    assert _model_digests(store, f"{REPO}:latest") == [_digest(tiny_models.other[:-1] + b"\x01")]
    assert "using tiny.Q4_K_M.gguf (Q4_K_M)" in log.statuses


def test_no_q4_k_m_picks_the_nearest_and_says_so(
    store: Store, hf_settings: Settings, hub: FakeHub, tiny_models: TinyModels
) -> None:
    hub.add_repo(
        "tester/big-GGUF", {"big-F16.gguf": tiny_models.f16, "big-Q8_0.gguf": tiny_models.other}
    )
    log = EventLog()
    pull(store, "hf.co/tester/big-GGUF", hf_settings, on_progress=log)
    assert _model_digests(store, "hf.co/tester/big-GGUF") == [_digest(tiny_models.other)]
    assert "Q4_K_M is not available, using Q8_0 (big-Q8_0.gguf)" in log.statuses


def test_pull_by_file_name(store: Store, hf_settings: Settings, tiny_models: TinyModels) -> None:
    pull(store, f"{REPO}:tiny-F32.gguf", hf_settings)
    model = load_model(store, f"{REPO}:tiny-F32.gguf")
    assert model.model_layer.digest == _digest(tiny_models.f32)
    assert model.info.file_type == "F32"


def test_unknown_tag_lists_the_quants_and_downloads_nothing(
    store: Store, hf_settings: Settings, hub: FakeHub
) -> None:
    with pytest.raises(RemoteNotFoundError) as info:
        pull(store, f"{REPO}:Q3_K_S", hf_settings)
    message = str(info.value)
    assert "no Q3_K_S quantization" in message
    assert "available: Q4_K_M, Q8_0, F16, F32" in message
    assert "mmproj" not in message and "\n" not in message
    assert hub.cdn.requests == []
    assert not store.exists(f"{REPO}:Q3_K_S")


def test_unknown_file_name_lists_the_files(store: Store, hf_settings: Settings) -> None:
    with pytest.raises(RemoteNotFoundError, match=r"no file tiny-Q2_K\.gguf; .*tiny-F16\.gguf"):
        pull(store, f"{REPO}:tiny-Q2_K.gguf", hf_settings)


def test_unknown_repository(store: Store, hf_settings: Settings) -> None:
    with pytest.raises(RemoteNotFoundError, match=r"hf\.co/tester/nothing-here was not found"):
        pull(store, "hf.co/tester/nothing-here", hf_settings)


def test_split_gguf_is_pulled_whole_and_loads(
    store: Store, hf_settings: Settings, hub: FakeHub, tiny_models: TinyModels
) -> None:
    files = {
        f"F32/tiny-F32-{i:05d}-of-00003.gguf": part
        for i, part in enumerate(tiny_models.split, start=1)
    }
    hub.add_repo("tester/split-GGUF", {"tiny-F16.gguf": tiny_models.f16, **files})
    log = EventLog()
    entry = pull(store, "hf.co/tester/split-GGUF:f32", hf_settings, on_progress=log)

    # One model layer per part, in order, each verified against its own sha256.
    assert _model_digests(store, "hf.co/tester/split-GGUF:f32") == [
        _digest(part) for part in tiny_models.split
    ]
    assert "using F32/tiny-F32-00001-of-00003.gguf and 2 more parts (F32)" in log.statuses

    from llama_cpp import Llama

    def greedy(path: Path) -> str:
        llm = Llama(model_path=str(path), n_ctx=64, n_threads=1, verbose=False)
        try:
            return llm.create_completion("the sky is", max_tokens=6, temperature=0)["choices"][0][
                "text"
            ]
        finally:
            llm.close()

    paths = model_paths(store, entry.manifest)
    with linked_splits(paths) as first:
        split_text = greedy(first)
    assert split_text == greedy(tiny_models.f32_path)
    assert split_text != ""

    # What a runner does with the blob paths themselves: llama_model_load_from_splits.
    import ctypes

    import llama_cpp

    array = (ctypes.c_char_p * len(paths))(*[str(path).encode() for path in paths])
    model = llama_cpp.llama_model_load_from_splits(array, len(paths), cpu.model_params())
    assert model
    try:
        from localllm.gguf_info import inspect_gguf

        assert (
            llama_cpp.llama_model_n_params(model)
            == inspect_gguf(tiny_models.f32_path).parameter_count
        )
    finally:
        llama_cpp.llama_model_free(model)


def test_gated_repository_needs_hf_token_which_never_reaches_the_cdn(
    store: Store,
    hf_settings: Settings,
    hub: FakeHub,
    tiny_models: TinyModels,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hub.add_repo("tester/gated-GGUF", {"gated-F16.gguf": tiny_models.f16}, gated=True)
    with pytest.raises(AuthRequiredError, match=r"gated.*HF_TOKEN"):
        pull(store, "hf.co/tester/gated-GGUF", hf_settings)
    assert hub.cdn.requests == []

    monkeypatch.setenv("HF_TOKEN", hub.token)
    pull(store, "hf.co/tester/gated-GGUF", hf_settings)
    assert _model_digests(store, "hf.co/tester/gated-GGUF") == [_digest(tiny_models.f16)]
    resolves = [r for r in hub.requests if "/resolve/" in r.path]
    assert resolves[-1].headers.get("authorization") == f"Bearer {hub.token}"
    assert hub.cdn.requests and all("authorization" not in r.headers for r in hub.cdn.requests)


def test_no_second_copy_is_left_anywhere(
    store: Store, hf_settings: Settings, tiny_models: TinyModels
) -> None:
    from huggingface_hub import constants

    pull(store, f"{REPO}:F16", hf_settings)
    blobs = [p for p in store.blobs_dir.iterdir() if p.stat().st_size == len(tiny_models.f16)]
    assert len(blobs) == 1
    assert list(store.partial_dir.iterdir()) == []
    assert not (Path(constants.HF_HUB_CACHE) / "models--tester--tiny-GGUF").exists()


def test_the_fake_hub_satisfies_the_real_client(
    hub: FakeHub, tiny_models: TinyModels, tmp_path: Path
) -> None:
    """The fake speaks the protocol as the Hub does: the client's own download path works."""
    from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_download, hf_hub_url

    api = HfApi(endpoint=hub.url)
    tree = {f.path: f for f in api.list_repo_tree("tester/tiny-GGUF")}
    assert tree["tiny-F16.gguf"].lfs.sha256 == hashlib.sha256(tiny_models.f16).hexdigest()
    url = hf_hub_url("tester/tiny-GGUF", "tiny-F16.gguf", endpoint=hub.url)
    metadata = get_hf_file_metadata(url)
    assert metadata.etag == hashlib.sha256(tiny_models.f16).hexdigest()
    assert metadata.size == len(tiny_models.f16)
    assert metadata.commit_hash == hub.repos["tester/tiny-GGUF"].sha
    path = hf_hub_download(
        "tester/tiny-GGUF", "tiny-F16.gguf", endpoint=hub.url, cache_dir=tmp_path / "cache"
    )
    assert Path(path).read_bytes() == tiny_models.f16


def test_quantize_on_pull_refuses_a_quantized_file_before_downloading_it(
    store: Store, hf_settings: Settings, hub: FakeHub
) -> None:
    from localllm import QuantizeError

    with pytest.raises(QuantizeError, match="only supported for F16, BF16 and F32 models"):
        pull(store, f"{REPO}:Q4_K_M", hf_settings, quantize="q4_0")
    assert hub.cdn.requests == []
