"""Pytest fixtures for the pull and quantize tests (``pytest_plugins = ["fakes.fixtures"]``).

GGUF files are written once per session; servers and homes are fresh for every test.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tiny_gguf import write_tiny_gguf
from tiny_mmproj import write_tiny_mmproj

from localllm.settings import Settings

from .gguf_split import split_gguf
from .helpers import TinyModels, registry_config, registry_layers
from .hf_hub import FakeHub
from .ollama_registry import FakeRegistry


@pytest.fixture(scope="session")
def tiny_models(
    tiny_gguf: Path, tiny_gguf_f16: Path, tmp_path_factory: pytest.TempPathFactory
) -> TinyModels:
    """The tiny F32, F16, another-seed and split models, as bytes."""
    folder = tmp_path_factory.mktemp("pull-models")
    other = write_tiny_gguf(folder / "other.gguf", seed=7)
    parts = split_gguf(tiny_gguf, folder / "split", 3)
    return TinyModels(
        f32=tiny_gguf.read_bytes(),
        f16=tiny_gguf_f16.read_bytes(),
        other=other.read_bytes(),
        split=tuple(p.read_bytes() for p in parts),
        f32_path=tiny_gguf,
    )


@pytest.fixture(scope="session")
def tiny_projector(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A tiny vision projector (mmproj GGUF) for the tiny models."""
    folder = tmp_path_factory.mktemp("pull-projector")
    return write_tiny_mmproj(folder / "mmproj.gguf").read_bytes()


@pytest.fixture
def hub(tiny_models: TinyModels, tiny_projector: bytes) -> Iterator[FakeHub]:
    """A fake Hub with ``tester/tiny-GGUF``: F32, F16, Q8_0, Q4_K_M files, a projector, a README."""
    with FakeHub() as server:
        server.add_repo(
            "tester/tiny-GGUF",
            {
                "README.md": b"# tiny\n",
                "tiny-F32.gguf": tiny_models.f32,
                "tiny-F16.gguf": tiny_models.f16,
                "tiny-Q8_0.gguf": tiny_models.other,
                "tiny.Q4_K_M.gguf": tiny_models.other[:-1] + b"\x01",
                "mmproj-tiny-F16.gguf": tiny_projector,
            },
        )
        yield server


@pytest.fixture
def hf_settings(home: Path, hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings whose Hub is the fake (through HF_ENDPOINT, as a user would set it)."""
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    return Settings.from_env()


@pytest.fixture
def registry(tiny_models: TinyModels) -> Iterator[FakeRegistry]:
    """A fake registry with ``library/tiny:latest``: an F32 GGUF and the text layers."""
    with FakeRegistry() as server:
        server.add_model(
            "library/tiny", "latest", registry_config("F32"), registry_layers(tiny_models.f32)
        )
        yield server


@pytest.fixture
def registry_settings(
    home: Path, registry: FakeRegistry, monkeypatch: pytest.MonkeyPatch
) -> Settings:
    """Settings whose default registry is the fake."""
    monkeypatch.setenv("LOCALLLM_REGISTRY", registry.url)
    return Settings.from_env()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Callable[[int], Path]]:
    """Mount a tmpfs of the given size (bytes); unmounted after the test."""
    mounted: list[Path] = []

    def mount(size: int) -> Path:
        if os.geteuid() != 0:
            pytest.skip("a real full disk needs root to mount a small tmpfs")
        target = tmp_path / f"disk{len(mounted)}"
        target.mkdir()
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(target)],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
        mounted.append(target)
        return target

    yield mount
    for target in mounted:
        subprocess.run(["umount", "-l", str(target)], check=False)
