"""Pulling through the Ollama registry protocol from a loopback registry."""

from __future__ import annotations

import hashlib
import json
import socket

import pytest
from fakes.helpers import PARAMS, EventLog, TinyModels, registry_config, registry_layers
from fakes.ollama_registry import FakeRegistry

from localllm import NetworkError, PullError, QuantizeError, RemoteNotFoundError
from localllm.settings import Settings
from localllm.sources import pull
from localllm.starter import starter_gguf_path
from localllm.store.manifest import Manifest
from localllm.store.models import load_model
from localllm.store.store import Store

pytest_plugins = ["fakes.fixtures"]


def _digest(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def test_pull_answers_the_token_challenge_and_keeps_every_layer(
    store: Store, registry_settings: Settings, registry: FakeRegistry, tiny_models: TinyModels
) -> None:
    registry.require_token = True
    log = EventLog()
    entry = pull(store, "tiny", registry_settings, on_progress=log)

    served = Manifest.from_bytes(registry.models[("library/tiny", "latest")].manifest)
    assert entry.manifest == served
    assert entry.name.full == "registry.ollama.ai/library/tiny:latest"
    model = load_model(store, "tiny")
    assert model.parameters == PARAMS  # params became the model's default options
    assert (model.template, model.system, model.license) == (
        "{{ .System }}{{ .Prompt }}",
        "You are tiny.",
        "MIT",
    )
    assert model.gguf_path.read_bytes() == tiny_models.f32
    assert registry.token_requests == [
        {"service": ["fake-registry"], "scope": ["repository:library/tiny:pull"]}
    ]
    blob_requests = [r for r in registry.requests if "/blobs/" in r.path]
    assert blob_requests
    assert all(r.headers.get("authorization") == f"Bearer {registry.token}" for r in blob_requests)
    pulled = [e.digest for e in log.events if e.digest and e.completed == e.total]
    assert set(pulled) == {layer.digest for layer in served.layers} | {served.config.digest}
    assert log.statuses[-1] == "success"


def test_blobs_redirected_to_a_cdn_are_fetched_without_credentials(
    store: Store, registry_settings: Settings, registry: FakeRegistry, tiny_models: TinyModels
) -> None:
    registry.require_token = True
    registry.blobs_on_cdn = True
    gguf_path = f"/blobs/{_digest(tiny_models.f32)}"
    registry.cdn.add_fault("drop", len(tiny_models.f32) // 2, gguf_path)
    pull(store, "tiny", registry_settings)

    assert load_model(store, "tiny").gguf_path.read_bytes() == tiny_models.f32
    assert registry.cdn.requests and all(
        "authorization" not in r.headers for r in registry.cdn.requests
    )
    # The resumed request went through the registry again (a fresh link) and asked for the rest.
    ranges = [r.headers.get("range") for r in registry.cdn.requests_for(gguf_path)]
    assert ranges == [None, f"bytes={len(tiny_models.f32) // 2}-"]
    assert registry.cdn.body_bytes[gguf_path] == len(tiny_models.f32)


def test_a_name_with_its_own_host_uses_that_registry(
    store: Store, home: object, registry: FakeRegistry, tiny_models: TinyModels
) -> None:
    settings = Settings.from_env()  # the default registry is not the fake
    entry = pull(store, f"{registry.host}/library/tiny", settings)
    assert entry.name.host == registry.host
    assert store.exists(f"{registry.host}/library/tiny:latest")


def test_a_manifest_redirected_off_the_registry_is_refused(
    store: Store, registry_settings: Settings, registry: FakeRegistry
) -> None:
    registry.manifest_redirect = f"{registry.cdn.url}/v2/library/tiny/manifests/latest"
    with pytest.raises(PullError, match="only blob downloads may leave the registry"):
        pull(store, "tiny", registry_settings)
    assert registry.cdn.requests == []


def test_unknown_model(store: Store, registry_settings: Settings) -> None:
    with pytest.raises(RemoteNotFoundError, match='model "nothing:latest" was not found'):
        pull(store, "nothing", registry_settings)


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_unreachable_registry_is_a_network_error(
    store: Store, home: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCALLLM_REGISTRY", f"http://127.0.0.1:{_closed_port()}")
    with pytest.raises(NetworkError, match=r"cannot reach the registry 127\.0\.0\.1"):
        pull(store, "tiny", Settings.from_env())


def test_the_starter_model_is_imported_without_network(
    store: Store, home: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCALLLM_REGISTRY", f"http://127.0.0.1:{_closed_port()}")
    path = starter_gguf_path()
    assert path is not None
    log = EventLog()
    entry = pull(store, "smollm2:135m", Settings.from_env(), on_progress=log)
    assert load_model(store, "smollm2:135m").gguf_path.read_bytes() == path.read_bytes()
    assert entry.name.short == "smollm2:135m"
    assert log.statuses[-1] == "success"


def test_quantize_on_pull_refuses_a_quantized_model_before_downloading_it(
    store: Store, registry_settings: Settings, registry: FakeRegistry, tiny_models: TinyModels
) -> None:
    registry.add_model(
        "library/small", "q4", registry_config("Q4_K_M"), registry_layers(tiny_models.other)
    )
    with pytest.raises(QuantizeError, match="only supported for F16, BF16 and F32 models"):
        pull(store, "small:q4", registry_settings, quantize="q8_0")
    gguf_requests = [r for r in registry.requests if _digest(tiny_models.other) in r.path]
    assert gguf_requests == []


def test_quantize_on_pull_replaces_the_download(
    store: Store, registry_settings: Settings, tiny_models: TinyModels
) -> None:
    entry = pull(store, "tiny", registry_settings, quantize="Q8_0")
    model = load_model(store, "tiny")
    assert model.info.file_type == "Q8_0"
    assert model.parameters == PARAMS and model.system == "You are tiny."
    assert entry.digest == store.get("tiny").digest
    # The F32 download is no longer referenced, so it was collected.
    assert not store.has_blob(_digest(tiny_models.f32))
    assert json.loads(store.read_blob(model.entry.manifest.config.digest))["file_type"] == "Q8_0"


def test_a_blob_of_another_size_than_promised_fails_at_once(
    store: Store, registry_settings: Settings, registry: FakeRegistry, tiny_models: TinyModels
) -> None:
    gguf = _digest(tiny_models.f32)
    registry.models[("library/tiny", "latest")].blobs[gguf] = tiny_models.f32 + b"junk"
    size = len(tiny_models.f32)
    with pytest.raises(PullError, match=rf"is {size + 4} bytes at the source, not the {size} "):
        pull(store, "tiny", registry_settings)
    assert len(registry.requests_for(f"/v2/library/tiny/blobs/{gguf}")) == 1
    assert not store.has_blob(gguf)
