"""Qwen2 and Qwen2.5: biases on the q, k and v projections; NEOX rope (no row permutation)."""

from __future__ import annotations

import gguf

from localllm.convert.base import Family

__all__ = ["Qwen2Family"]


class Qwen2Family(Family):
    """Qwen2 / Qwen2.5 (``Qwen2ForCausalLM``), tied embeddings in the small sizes."""

    name = "qwen2"
    architectures = ("Qwen2ForCausalLM",)
    gguf_arch = gguf.MODEL_ARCH.QWEN2

    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        """Llama's layer plus the three attention biases, which Qwen2 always has."""
        shapes = super().layer_shapes()
        shapes.update(super().optional_layer_shapes())
        return shapes

    def optional_layer_shapes(self) -> dict[str, tuple[int, ...]]:
        """None: the biases are required."""
        return {}
