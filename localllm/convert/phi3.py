"""Phi-3: fused ``qkv_proj`` and ``gate_up_proj`` (llama.cpp keeps them fused: ``attn_qkv`` and
a double-height ``ffn_up`` it splits as gate then up), NEOX rope, long-rope factors.

The 128k variants' ``longrope`` scaling becomes the ``rope_factors_long``/``_short`` tensors and
the attention factor, as llama.cpp's converter computes it.
"""

from __future__ import annotations

import math

import gguf
import numpy as np

from localllm._exceptions import ConvertError
from localllm.convert.base import Family, OutTensor

__all__ = ["Phi3Family"]


class Phi3Family(Family):
    """Phi-3 and Phi-3.5 mini/medium (``Phi3ForCausalLM``)."""

    name = "phi3"
    architectures = ("Phi3ForCausalLM",)
    gguf_arch = gguf.MODEL_ARCH.PHI3
    extra_rope_types = ("longrope", "su")

    def check_vocab(self, tokens: list[str]) -> None:
        """llama.cpp's Phi-3 vocabulary needs ``<|endoftext|>`` (it fails to load without)."""
        if "<|endoftext|>" not in tokens:
            raise ConvertError(
                "this Phi-3 tokenizer has no <|endoftext|> token, which "
                "llama.cpp requires to load a Phi-3 model"
            )

    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        """One fused attention input and one fused gate/up projection a layer."""
        q, kv = self.n_head * self.head_dim, self.n_kv * self.head_dim
        return {
            "input_layernorm.weight": (self.hidden,),
            "self_attn.qkv_proj.weight": (q + 2 * kv, self.hidden),
            "self_attn.o_proj.weight": (self.hidden, q),
            "post_attention_layernorm.weight": (self.hidden,),
            "mlp.gate_up_proj.weight": (2 * self.ffn, self.hidden),
            "mlp.down_proj.weight": (self.hidden, self.ffn),
        }

    def optional_layer_shapes(self) -> dict[str, tuple[int, ...]]:
        """None: Phi-3 has no biases."""
        return {}

    def _rope_dims(self) -> int:
        pct = float(
            self.rope_parameters().get("partial_rotary_factor")
            or self.config.get("partial_rotary_factor")
            or 1.0
        )
        return int(pct * self.hidden) // self.n_head

    def _orig_ctx(self) -> int:
        p = self.rope_parameters()
        return int(
            p.get("original_max_position_embeddings")
            or self.config.get("original_max_position_embeddings")
            or self.context_length
            or 4096
        )

    def write_hparams(self, w: gguf.GGUFWriter) -> None:
        """Phi-3's keys, as llama.cpp's converter writes them."""
        super().write_hparams(w)
        w.add_rope_dimension_count(self._rope_dims())
        w.add_rope_scaling_orig_ctx_len(self._orig_ctx())
        # 0 tells llama.cpp "no sliding window" (Phi-4 exports), as its converter writes it.
        w.add_sliding_window(int(self.config.get("sliding_window") or 0))
        p = self.rope_parameters()
        if p.get("long_factor"):
            scale = (self.context_length or self._orig_ctx()) / self._orig_ctx()
            factor = (
                math.sqrt(1 + math.log(scale) / math.log(self._orig_ctx())) if scale > 1.0 else 1.0
            )
            w.add_rope_scaling_attn_factors(factor)

    def extra_tensors(self) -> list[OutTensor]:
        """``rope_factors_long`` and ``rope_factors_short`` for long-rope checkpoints."""
        p = self.rope_parameters()
        long, short = p.get("long_factor"), p.get("short_factor")
        if not long:
            return []
        half = self._rope_dims() // 2
        if not short or len(long) != half or len(short) != half:
            raise ConvertError(
                f"rope_scaling's long_factor and short_factor must both have "
                f"{half} values for this Phi-3 model"
            )
        out = []
        for kind, values in (
            (gguf.MODEL_TENSOR.ROPE_FACTORS_LONG, long),
            (gguf.MODEL_TENSOR.ROPE_FACTORS_SHORT, short),
        ):
            data = np.asarray(values, dtype=np.float32)
            out.append(OutTensor(gguf.TENSOR_NAMES[kind] + ".weight", data.shape, data=data))
        return out
