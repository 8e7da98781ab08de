"""Gemma 2: norms stored as ``w`` for a scale of ``1 + w``, four norms a layer, GeGLU,
soft-capped attention and final logits, sliding-window attention on every other layer.

The embedding scale (``sqrt(hidden)``) is part of llama.cpp's Gemma graph, so nothing is
written for it. llama.cpp scales queries by ``1/sqrt(head_dim)`` (``hidden/heads`` for the 27B
model) and has no key for ``query_pre_attn_scalar``: a checkpoint with another value is refused
rather than converted into a model that attends differently.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gguf

from localllm._exceptions import ConvertError
from localllm.convert.base import Family

__all__ = ["Gemma2Family"]


class Gemma2Family(Family):
    """Gemma 2 (``Gemma2ForCausalLM``)."""

    name = "gemma2"
    architectures = ("Gemma2ForCausalLM",)
    gguf_arch = gguf.MODEL_ARCH.GEMMA2
    norm_offset = 1.0

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        # Gemma ties the output to the embeddings whatever the config says (llama.cpp too).
        self.tied = True
        scalar = self.config.get("query_pre_attn_scalar")
        allowed = {self.head_dim}
        if self.n_layers == 46:  # llama.cpp's 27B rule
            allowed.add(self.hidden // self.n_head)
        if scalar is not None and int(scalar) not in allowed:
            raise ConvertError(
                f"query_pre_attn_scalar {scalar} cannot be expressed in a GGUF: llama.cpp "
                f"scales queries by 1/sqrt({self.head_dim}) for this {self.name} model"
            )

    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        """Llama's layer plus the norms before and after the feed-forward block."""
        shapes = super().layer_shapes()
        shapes["pre_feedforward_layernorm.weight"] = (self.hidden,)
        shapes["post_feedforward_layernorm.weight"] = (self.hidden,)
        return shapes

    def optional_layer_shapes(self) -> dict[str, tuple[int, ...]]:
        """None: Gemma has no biases."""
        return {}

    def write_hparams(self, w: gguf.GGUFWriter) -> None:
        """The common keys, the head size, soft-capping and the sliding window."""
        super().write_hparams(w)
        if self.head_dim == self.hidden // self.n_head:
            w.add_key_length(self.head_dim)
            w.add_value_length(self.head_dim)
        self.write_window_and_caps(w)

    def write_window_and_caps(self, w: gguf.GGUFWriter) -> None:
        """Soft-capping values and the sliding window, where the config has them."""
        if cap := self.config.get("attn_logit_softcapping"):
            w.add_attn_logit_softcapping(float(cap))
        if cap := self.config.get("final_logit_softcapping"):
            w.add_final_logit_softcapping(float(cap))
        if window := self.config.get("sliding_window"):
            w.add_sliding_window(int(window))
