"""Mistral 7B and its fine-tunes: Llama's graph in llama.cpp (``llama`` architecture).

The only difference from Llama that reaches the GGUF is the sliding window of the first
releases (v0.1: 4096), which llama.cpp's Llama graph does not apply, exactly as llama.cpp's own
converter; prompts within the window are unaffected, and the conversion says so in its notes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from localllm.convert.llama import LlamaFamily

__all__ = ["MistralFamily"]


class MistralFamily(LlamaFamily):
    """Mistral 7B v0.1–v0.3 (``MistralForCausalLM``)."""

    name = "mistral"
    architectures = ("MistralForCausalLM",)

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        window = self.config.get("sliding_window")
        if window and self.context_length and int(window) < self.context_length:
            self.notes.append(
                f"sliding window {window} is not applied by llama.cpp's llama graph (as with "
                f"llama.cpp's own converter): prompts longer than {window} tokens attend to "
                "all earlier tokens"
            )
