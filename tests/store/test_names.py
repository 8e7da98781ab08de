"""Model names: Ollama's grammar, Hugging Face names, and hostile input."""

from __future__ import annotations

import pytest

from localllm import InvalidNameError
from localllm.store.names import ModelName, parse_name


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("smollm2", ("registry.ollama.ai", "library", "smollm2", "latest")),
        ("smollm2:135m", ("registry.ollama.ai", "library", "smollm2", "135m")),
        ("jmorgan/mixtral:8x7b", ("registry.ollama.ai", "jmorgan", "mixtral", "8x7b")),
        (
            "registry.ollama.ai/library/llama3.2:1b",
            ("registry.ollama.ai", "library", "llama3.2", "1b"),
        ),
        ("localhost:5000/me/model:v1.0", ("localhost:5000", "me", "model", "v1.0")),
        (
            "hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M",
            ("hf.co", "bartowski", "Llama-3.2-1B-Instruct-GGUF", "Q4_K_M"),
        ),
        ("huggingface.co/unsloth/gemma-3-GGUF", ("hf.co", "unsloth", "gemma-3-GGUF", "latest")),
        ("hf.co/u/r:model-Q8_0.gguf", ("hf.co", "u", "r", "model-Q8_0.gguf")),
        ("https://hf.co/u/r:q4_k_m", ("hf.co", "u", "r", "q4_k_m")),
        ("  padded:tag  ", ("registry.ollama.ai", "library", "padded", "tag")),
        ("_under_score", ("registry.ollama.ai", "library", "_under_score", "latest")),
    ],
)
def test_valid_names_fill_defaults(text: str, expected: tuple[str, str, str, str]) -> None:
    assert parse_name(text).path_parts == expected


def test_short_and_full_forms() -> None:
    name = parse_name("smollm2:135m")
    assert name.short == "smollm2:135m"
    assert name.full == "registry.ollama.ai/library/smollm2:135m"
    assert str(parse_name("me/m")) == "me/m:latest"
    hf = parse_name("hf.co/user/repo:Q4_K_M")
    assert hf.is_huggingface and hf.repo_id == "user/repo"
    assert hf.short == "hf.co/user/repo:Q4_K_M"
    assert parse_name(name.full) == name
    assert name.with_tag("1b") == ModelName("registry.ollama.ai", "library", "smollm2", "1b")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("..", 'cannot be ".."'),
        ("../../etc/passwd", 'cannot be ".."'),
        ("library/..:latest", 'cannot be ".."'),
        ("model:..", 'cannot be ".."'),
        ("/etc/passwd", "absolute path"),
        ("a\\b", "backslash"),
        ("evil\x00name", "NUL"),
        ("model:", "tag is empty"),
        ("a/b/c/d", 'too many "/"'),
        ("host//model", "namespace is empty"),
        ("x" * 81, "81 characters"),
        ("m:" + "t" * 81, "81 characters"),
        ("model name", "' '"),
        ("model:tag/x", "namespace"),
        ("-dash", "must start with"),
        (".hidden", "must start with"),
        ("mo$del", "'$'"),
        ("modèle", "'è'"),
        ("hf.co/repo", "hf.co/<user>/<repo>"),
        ("ns:1/model", "':'"),
    ],
)
def test_hostile_and_malformed_names_are_rejected_with_a_reason(text: str, fragment: str) -> None:
    with pytest.raises(InvalidNameError) as info:
        parse_name(text)
    assert fragment in str(info.value)


def test_non_string_is_rejected() -> None:
    with pytest.raises(InvalidNameError):
        parse_name(42)  # type: ignore[arg-type]


def test_parsed_parts_never_escape_a_directory() -> None:
    # Every accepted part is a single, non-dot path component.
    for text in ["a.b/c..d:e..f", "x_/y-/z.:t-"]:
        for part in parse_name(text).path_parts:
            assert "/" not in part and "\\" not in part and part not in (".", "..")
