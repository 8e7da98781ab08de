"""Qwen3: RMS norms on each head's queries and keys, no biases, head size set explicitly."""

from __future__ import annotations

import gguf

from localllm.convert.base import Family

__all__ = ["Qwen3Family"]


class Qwen3Family(Family):
    """Qwen3 dense models (``Qwen3ForCausalLM``)."""

    name = "qwen3"
    architectures = ("Qwen3ForCausalLM",)
    gguf_arch = gguf.MODEL_ARCH.QWEN3

    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        """Llama's layer plus ``q_norm`` and ``k_norm`` over one head."""
        shapes = super().layer_shapes()
        shapes["self_attn.q_norm.weight"] = (self.head_dim,)
        shapes["self_attn.k_norm.weight"] = (self.head_dim,)
        return shapes

    def write_hparams(self, w: gguf.GGUFWriter) -> None:
        """The common keys; the head size always (Qwen3's is not hidden / heads)."""
        super().write_hparams(w)
        if self.head_dim == self.hidden // self.n_head:
            w.add_key_length(self.head_dim)
            w.add_value_length(self.head_dim)
