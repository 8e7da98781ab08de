"""Qwen3-MoE: Qwen3's attention (q/k norms) with a sparse mixture of experts in every layer.

Experts are stacked per projection as for Mixtral; the experts' own width is
``moe_intermediate_size``. llama.cpp renormalises the top-k routing weights, so a checkpoint
with ``norm_topk_prob: false``, dense layers between sparse ones, or shared experts is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gguf

from localllm._exceptions import ConvertError, MissingConfigError
from localllm.convert.qwen3 import Qwen3Family

__all__ = ["Qwen3MoeFamily"]


class Qwen3MoeFamily(Qwen3Family):
    """Qwen3 mixture-of-experts models (``Qwen3MoeForCausalLM``: 30B-A3B, 235B-A22B)."""

    name = "qwen3moe"
    architectures = ("Qwen3MoeForCausalLM",)
    gguf_arch = gguf.MODEL_ARCH.QWEN3MOE

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        c = self.config
        try:
            self.n_experts = int(c["num_experts"])
            self.n_used = int(c["num_experts_per_tok"])
            self.expert_ffn = int(c["moe_intermediate_size"])
        except (KeyError, TypeError, ValueError) as exc:
            raise MissingConfigError(f"config.json lacks a usable {exc} for Qwen3-MoE") from None
        if c.get("norm_topk_prob") is False:
            raise ConvertError(
                "norm_topk_prob false: llama.cpp's Qwen3-MoE graph always "
                "renormalises the chosen experts' weights"
            )
        if int(c.get("decoder_sparse_step") or 1) != 1 or c.get("mlp_only_layers"):
            raise ConvertError(
                "dense layers among the sparse ones (decoder_sparse_step, "
                "mlp_only_layers) are not supported by llama.cpp's Qwen3-MoE"
            )

    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        """Qwen3's attention, then the router and every expert's three projections."""
        shapes = {k: v for k, v in super().layer_shapes().items() if not k.startswith("mlp.")}
        shapes["mlp.gate.weight"] = (self.n_experts, self.hidden)
        for e in range(self.n_experts):
            shapes[f"mlp.experts.{e}.gate_proj.weight"] = (self.expert_ffn, self.hidden)
            shapes[f"mlp.experts.{e}.up_proj.weight"] = (self.expert_ffn, self.hidden)
            shapes[f"mlp.experts.{e}.down_proj.weight"] = (self.hidden, self.expert_ffn)
        return shapes

    def write_hparams(self, w: gguf.GGUFWriter) -> None:
        """Qwen3's keys plus the expert counts and width."""
        super().write_hparams(w)
        w.add_expert_count(self.n_experts)
        w.add_expert_used_count(self.n_used)
        w.add_expert_feed_forward_length(self.expert_ffn)
