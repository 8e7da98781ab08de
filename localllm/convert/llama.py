"""Llama 1–3.x (and SmolLM2, which is Llama): q/k rows reordered, Llama 3.1's rope factors.

transformers' modeling_llama.py applies rope "rotate half" style; llama.cpp's LLAMA graph
rotates adjacent pairs, so the q and k projections' rows are permuted per head on the way
(``Family.permute_qk``). Llama 3.1+ ``rope_scaling: {"rope_type": "llama3"}`` becomes the
``rope_freqs`` tensor of per-frequency divisors, computed as transformers computes them.
"""

from __future__ import annotations

import math

import gguf
import numpy as np

from localllm.convert.base import Family, OutTensor

__all__ = ["LlamaFamily", "llama3_rope_factors"]


def llama3_rope_factors(params: dict, head_dim: int) -> np.ndarray:
    """The per-frequency divisors of Llama 3.1's rope scaling (transformers'
    ``_compute_llama3_parameters``), as the float32 ``rope_freqs`` tensor llama.cpp reads."""
    base = float(params.get("rope_theta", 10000.0))
    factor = float(params.get("factor", 8.0))
    low = float(params.get("low_freq_factor", 1.0))
    high = float(params.get("high_freq_factor", 4.0))
    old_ctx = float(params.get("original_max_position_embeddings", 8192))
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


class LlamaFamily(Family):
    """Llama 1, 2, 3.x and its look-alikes (SmolLM2, TinyLlama...)."""

    name = "llama"
    architectures = ("LlamaForCausalLM", "LLaMAForCausalLM")
    gguf_arch = gguf.MODEL_ARCH.LLAMA
    permute_qk = True
    extra_rope_types = ("llama3",)

    def write_hparams(self, w: gguf.GGUFWriter) -> None:
        """Llama's keys plus the vocabulary size and rope dimensions llama.cpp expects."""
        super().write_hparams(w)
        w.add_vocab_size(self.vocab)
        w.add_rope_dimension_count(self.head_dim)

    def extra_tensors(self) -> list[OutTensor]:
        """``rope_freqs`` for Llama 3.1-style rope scaling."""
        params = self.rope_parameters()
        if str(params.get("rope_type") or "").lower() != "llama3":
            return []
        data = llama3_rope_factors(params, self.head_dim)
        name = gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight"
        return [OutTensor(name=name, shape=data.shape, data=data)]
