"""Vision in the store: projectors pulled from Hugging Face, Modelfiles with a second FROM,
the projector layer on ``LocalModel``, images checked from their headers alone."""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

import pytest
from fakes.helpers import EventLog, TinyModels
from fakes.hf_hub import FakeHub
from tiny_mmproj import png_bytes, write_tiny_mmproj

from localllm import PullError
from localllm.images import (
    ImageError,
    ImageLimits,
    check_image,
    decode_base64_image,
    parse_data_url,
)
from localllm.settings import Settings
from localllm.sources import pull
from localllm.store.manifest import MEDIA_PROJECTOR
from localllm.store.modelfile import parse_modelfile, read_modelfile
from localllm.store.models import create_model, load_model, render_modelfile
from localllm.store.store import Store

pytest_plugins = ["fakes.fixtures"]


def _digest(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


@pytest.fixture(scope="module")
def projector_q8(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """Another projector (another seed) to publish under a Q8_0 name."""
    return write_tiny_mmproj(tmp_path_factory.mktemp("p") / "q8.gguf", seed=3).read_bytes()


def test_a_hub_projector_next_to_the_model_is_pulled_as_a_layer(
    store: Store, hf_settings: Settings, tiny_projector: bytes
) -> None:
    log = EventLog()
    pull(store, "hf.co/tester/tiny-GGUF:F32", hf_settings, on_progress=log)
    model = load_model(store, "hf.co/tester/tiny-GGUF:F32")
    assert model.projector_layer is not None
    assert model.projector_layer.digest == _digest(tiny_projector)
    assert model.projector_path is not None and model.projector_path.read_bytes() == tiny_projector
    assert "vision" in model.capabilities()
    # no F32 projector: the F16 one, and the pull says which
    assert "using vision projector mmproj-tiny-F16.gguf (F16)" in log.statuses


def test_the_projector_matching_the_quant_wins(
    store: Store,
    hf_settings: Settings,
    hub: FakeHub,
    tiny_models: TinyModels,
    tiny_projector: bytes,
    projector_q8: bytes,
) -> None:
    hub.add_repo(
        "tester/eyes-GGUF",
        {
            "eyes-Q8_0.gguf": tiny_models.other,
            "eyes-F16.gguf": tiny_models.f16,
            "mmproj-eyes-F16.gguf": tiny_projector,
            "mmproj-eyes-Q8_0.gguf": projector_q8,
            "other/mmproj-elsewhere-Q8_0.gguf": tiny_projector,
        },
    )
    log = EventLog()
    pull(store, "hf.co/tester/eyes-GGUF:Q8_0", hf_settings, on_progress=log)
    model = load_model(store, "hf.co/tester/eyes-GGUF:Q8_0")
    assert model.projector_layer is not None
    assert model.projector_layer.digest == _digest(projector_q8)
    assert "using vision projector mmproj-eyes-Q8_0.gguf (matches the model)" in log.statuses


def test_a_repo_without_projector_pulls_a_text_model(
    store: Store, hf_settings: Settings, hub: FakeHub, tiny_models: TinyModels
) -> None:
    hub.add_repo("tester/plain-GGUF", {"plain-Q8_0.gguf": tiny_models.other})
    log = EventLog()
    pull(store, "hf.co/tester/plain-GGUF", hf_settings, on_progress=log)
    model = load_model(store, "hf.co/tester/plain-GGUF")
    assert model.projector_layer is None and "vision" not in model.capabilities()
    assert not any("projector" in status for status in log.statuses)


def test_an_mmproj_that_is_no_projector_fails_the_pull_clearly(
    store: Store, hf_settings: Settings, hub: FakeHub, tiny_models: TinyModels
) -> None:
    hub.add_repo(
        "tester/fake-GGUF",
        {"fake-Q8_0.gguf": tiny_models.other, "mmproj-fake-F16.gguf": tiny_models.f16},
    )
    with pytest.raises(PullError, match=r"its mmproj file is unusable: .* not 'clip'"):
        pull(store, "hf.co/tester/fake-GGUF", hf_settings)


# -- Modelfiles and create ---------------------------------------------------------------------


def test_a_second_from_is_the_projector(tmp_path: Path) -> None:
    (tmp_path / "Modelfile").write_text("FROM ./model.gguf\nFROM ./mmproj.gguf\n")
    modelfile = read_modelfile(tmp_path / "Modelfile")
    assert modelfile.from_ == str(tmp_path / "model.gguf")
    assert modelfile.projector == str(tmp_path / "mmproj.gguf")
    assert parse_modelfile("FROM m\n").projector is None


def test_create_with_a_projector_and_render_it_back(
    store: Store, tiny_gguf: Path, tmp_path: Path
) -> None:
    projector = write_tiny_mmproj(tmp_path / "mmproj.gguf")
    create_model(store, "eyes", gguf_file=tiny_gguf, projector_file=projector)
    model = load_model(store, "eyes")
    assert model.projector_layer is not None
    assert model.projector_layer.media_type == MEDIA_PROJECTOR
    assert model.details()["families"] == ["llama", "clip"]
    assert model.projector_info is not None and model.projector_info.is_projector
    froms = [line for line in render_modelfile(model).splitlines() if line.startswith("FROM ")]
    assert froms == [f"FROM {model.gguf_path}", f"FROM {model.projector_path}"]
    # a derived model keeps the projector; a text model given as projector is refused
    create_model(store, "eyes2", base="eyes", system="Be brief.")
    assert load_model(store, "eyes2").projector_path == model.projector_path
    with pytest.raises(Exception, match="not a vision projector"):
        create_model(store, "bad", gguf_file=tiny_gguf, projector_file=tiny_gguf)
    with pytest.raises(Exception, match=r"is a vision projector .* not a model"):
        create_model(store, "bad", gguf_file=projector)


# -- images.py: the header decides ------------------------------------------------------------

LIMITS = ImageLimits(max_bytes=1 << 20, max_pixels=1_000_000, max_images=4)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "GIF", "BMP"])
def test_the_formats_llama_cpp_decodes_are_accepted(fmt: str) -> None:
    info = check_image(png_bytes(size=(20, 10), fmt=fmt), "images[0]", LIMITS)
    assert (info.format, info.width, info.height) == (fmt, 20, 10)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (png_bytes(fmt="WEBP"), "images[0]: image format WEBP is not supported; use PNG or JPEG"),
        (png_bytes(fmt="TIFF"), "image format TIFF is not supported"),
        (b"GIF89a" + b"\0" * 4, "is not an image"),
        (png_bytes(size=(1001, 1000)), "1001x1000 pixels, more than the 1000000"),
        (b"\0" * ((1 << 20) + 1), "1.0 MiB, more than the 1.0 MiB"),
    ],
)
def test_what_is_refused_and_why(data: bytes, message: str) -> None:
    with pytest.raises(ImageError, match=re.escape(message)):
        check_image(data, "images[0]", LIMITS)


def test_base64_and_data_urls_are_strict() -> None:
    png = png_bytes()
    text = base64.b64encode(png).decode()
    assert decode_base64_image(text, "f", LIMITS) == png
    # MIME line breaks are fine; stray characters are not
    assert decode_base64_image(text[:10] + "\n" + text[10:], "f", LIMITS) == png
    with pytest.raises(ImageError, match="f is not valid base64"):
        decode_base64_image(text[:10] + "*" + text[10:], "f", LIMITS)
    with pytest.raises(ImageError, match="f must be a base64 string, got int"):
        decode_base64_image(5, "f", LIMITS)
    assert parse_data_url(f"data:image/png;base64,{text}", "u", LIMITS) == png
    with pytest.raises(ImageError, match="u must be a data: URL with base64"):
        parse_data_url("data:image/png,rawbytes", "u", LIMITS)
    with pytest.raises(ImageError, match="does not fetch images from the internet"):
        parse_data_url("HTTPS://example.com/a.png", "u", LIMITS)
    # a string far over the limit is refused before it is decoded
    with pytest.raises(ImageError, match=r"more than the 1\.0 MiB"):
        decode_base64_image("A" * (3 << 20), "f", LIMITS)


def test_import_ollama_keeps_the_projector(tmp_path: Path, tiny_gguf: Path) -> None:
    from test_import_ollama import OllamaStore

    from localllm.store.manifest import MEDIA_MODEL
    from localllm.store.ollama_import import OllamaImporter

    ollama = OllamaStore(tmp_path / "ollama" / "models")
    projector = write_tiny_mmproj(tmp_path / "mmproj.gguf").read_bytes()
    ollama.model(
        "llava:tiny",
        [ollama.blob(tiny_gguf.read_bytes(), MEDIA_MODEL), ollama.blob(projector, MEDIA_PROJECTOR)],
    )
    local = Store(tmp_path / "localllm")
    report = OllamaImporter(ollama.root, local).run()
    assert [o.status for o in report.outcomes] == ["imported"]
    model = load_model(local, "llava:tiny")
    assert model.projector_path is not None and model.projector_path.read_bytes() == projector
    assert "vision" in model.capabilities()
