"""The families the converter knows, and which one a config.json belongs to."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from localllm._exceptions import MissingConfigError, UnsupportedArchitectureError
from localllm.convert.base import Family
from localllm.convert.gemma2 import Gemma2Family
from localllm.convert.gemma3 import Gemma3Family
from localllm.convert.llama import LlamaFamily
from localllm.convert.mistral import MistralFamily
from localllm.convert.mixtral import MixtralFamily
from localllm.convert.phi3 import Phi3Family
from localllm.convert.qwen2 import Qwen2Family
from localllm.convert.qwen3 import Qwen3Family
from localllm.convert.qwen3moe import Qwen3MoeFamily

__all__ = ["FAMILIES", "SUPPORTED_ARCHITECTURES", "family_for", "family_name"]

FAMILIES: tuple[type[Family], ...] = (
    LlamaFamily,
    MistralFamily,
    Qwen2Family,
    Qwen3Family,
    Gemma2Family,
    Gemma3Family,
    Phi3Family,
    MixtralFamily,
    Qwen3MoeFamily,
)

SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(
    arch for fam in FAMILIES for arch in fam.architectures
)


def family_for(config: Mapping[str, Any]) -> Family:
    """The family instance for a config.json, or a clear refusal naming what is supported."""
    archs = config.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise MissingConfigError(
            'config.json has no "architectures" list: cannot tell which '
            "model family the weights belong to"
        )
    arch = archs[0]
    for fam in FAMILIES:
        if arch in fam.architectures:
            return fam(config)
    raise UnsupportedArchitectureError(arch, SUPPORTED_ARCHITECTURES)


def family_name(config: Mapping[str, Any]) -> str:
    """The converter family of a config.json alone (``llama``, ``qwen2``...): for deciding
    before a download whether a repository can be converted. Raises as a conversion would."""
    return family_for(config).name
