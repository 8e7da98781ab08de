"""Which file of a Hugging Face repository a tag picks (pure logic, no server)."""

from __future__ import annotations

import pytest

from localllm import PullError, RemoteNotFoundError
from localllm.sources.gguf_files import HubFile, choose_gguf, quant_of, split_of


def _files(*paths: str) -> list[HubFile]:
    return [HubFile(path, 100, "ab" * 32) for path in paths]


@pytest.mark.parametrize(
    ("path", "quant"),
    [
        ("Llama-3.2-1B-Instruct-Q4_K_M.gguf", "Q4_K_M"),
        ("tinyllama-1.1b-chat-v1.0.Q8_0.gguf", "Q8_0"),
        ("qwen2.5-0.5b-instruct-q4_k_m.gguf", "Q4_K_M"),
        ("gemma-3-1b-it-UD-Q4_K_XL.gguf", "UD-Q4_K_XL"),
        ("Phi-3-mini-4k-instruct-fp16.gguf", "F16"),
        ("Qwen3-8B-BF16.gguf", "BF16"),
        ("Qwen2.5-7B-IQ4_XS.gguf", "IQ4_XS"),
        ("Q6_K/model-00001-of-00002.gguf", "Q6_K"),
        ("smollm2-135m.gguf", None),
    ],
)
def test_quant_names_are_read_from_paths(path: str, quant: str | None) -> None:
    assert quant_of(path) == quant


def test_split_names() -> None:
    assert split_of("a/model-Q8_0-00002-of-00003.gguf") == ("a/model-Q8_0", 2, 3)
    assert split_of("model-Q8_0.gguf") is None


def test_projectors_and_imatrix_files_are_never_the_model() -> None:
    files = _files("mmproj-model-F16.gguf", "model-imatrix.gguf", "model-Q8_0.gguf")
    choice = choose_gguf(files, "latest", "u/r")
    assert [f.path for f in choice.files] == ["model-Q8_0.gguf"]
    assert choice.note == "Q4_K_M is not available, using Q8_0 (model-Q8_0.gguf)"


def test_aliases_and_case() -> None:
    files = _files("m-Q4_K_M.gguf", "m-UD-Q4_K_XL.gguf", "m-F16.gguf")
    assert choose_gguf(files, "q4_k", "u/r").files[0].path == "m-Q4_K_M.gguf"
    assert choose_gguf(files, "ud-q4_k_xl", "u/r").files[0].path == "m-UD-Q4_K_XL.gguf"
    assert choose_gguf(files, "fp16", "u/r").files[0].path == "m-F16.gguf"
    assert choose_gguf(files, "M-f16.GGUF", "u/r").files[0].path == "m-F16.gguf"


def test_a_split_set_is_chosen_whole_in_order() -> None:
    files = _files(
        "Q8_0/m-Q8_0-00002-of-00002.gguf", "Q8_0/m-Q8_0-00001-of-00002.gguf", "m-F16.gguf"
    )
    choice = choose_gguf(files, "Q8_0", "u/r")
    assert [f.path for f in choice.files] == [
        "Q8_0/m-Q8_0-00001-of-00002.gguf",
        "Q8_0/m-Q8_0-00002-of-00002.gguf",
    ]
    by_second_part = choose_gguf(files, "m-Q8_0-00002-of-00002.gguf", "u/r")
    assert by_second_part.files == choice.files


def test_an_incomplete_split_set_is_an_error() -> None:
    with pytest.raises(PullError, match="part 00002 of 00003 is missing"):
        choose_gguf(
            _files("m-Q8_0-00001-of-00003.gguf", "m-Q8_0-00003-of-00003.gguf"), "Q8_0", "u/r"
        )


def test_a_repository_without_gguf_files() -> None:
    with pytest.raises(RemoteNotFoundError, match="has no GGUF model files"):
        choose_gguf(_files("model.safetensors", "README.md"), "latest", "u/r")
