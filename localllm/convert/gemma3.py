"""Gemma 3 (text): Gemma 2's layout plus RMS norms on queries and keys (also ``1 + w``), no
attention soft-capping, local layers with their own rope base, five local layers to one global.

llama.cpp fixes the pattern at five sliding-window layers then one global; a checkpoint whose
``sliding_window_pattern`` or ``layer_types`` says otherwise is refused, not converted wrong.
The multimodal ``Gemma3ForConditionalGeneration`` (vision tower) is not converted here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gguf

from localllm._exceptions import ConvertError
from localllm.convert.gemma2 import Gemma2Family

__all__ = ["Gemma3Family"]

_PATTERN = 6  # llama.cpp: every sixth layer global


class Gemma3Family(Gemma2Family):
    """Gemma 3 text models (``Gemma3ForCausalLM``: 270M, 1B, and text-only exports)."""

    name = "gemma3"
    architectures = ("Gemma3ForCausalLM",)
    gguf_arch = gguf.MODEL_ARCH.GEMMA3

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        if self.config.get("attn_logit_softcapping"):
            raise ConvertError("a Gemma 3 checkpoint with attention soft-capping: llama.cpp's "
                               "Gemma 3 graph has none")
        kinds = self.config.get("layer_types")
        if kinds is None:
            n = int(self.config.get("sliding_window_pattern") or _PATTERN)
            kinds = ["full_attention" if (i + 1) % n == 0 else "sliding_attention"
                     for i in range(self.n_layers)]
        expected = ["full_attention" if (i + 1) % _PATTERN == 0 else "sliding_attention"
                    for i in range(self.n_layers)]
        if list(kinds) != expected:
            raise ConvertError(
                "this Gemma 3 checkpoint's sliding-window layers differ from llama.cpp's fixed "
                f"pattern (every {_PATTERN}th layer global): cannot convert it faithfully"
            )

    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        """Gemma 2's layer plus ``q_norm`` and ``k_norm`` over one head."""
        shapes = super().layer_shapes()
        shapes["self_attn.q_norm.weight"] = (self.head_dim,)
        shapes["self_attn.k_norm.weight"] = (self.head_dim,)
        return shapes

    def write_hparams(self, w: gguf.GGUFWriter) -> None:
        """Gemma 2's keys plus the local layers' rope base."""
        super().write_hparams(w)
        if local := self.config.get("rope_local_base_freq"):
            w.add_rope_freq_base_swa(float(local))
