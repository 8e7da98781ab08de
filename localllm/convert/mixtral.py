"""Mixtral: Llama with a sparse mixture of experts in place of the feed-forward block.

Each layer's experts (``block_sparse_moe.experts.N.w1/w2/w3``) become one stacked tensor per
projection (``ffn_gate_exps``, ``ffn_down_exps``, ``ffn_up_exps``), the router
``ffn_gate_inp``; llama.cpp softmaxes the router, keeps the top ``num_experts_per_tok`` and
renormalises their weights, as transformers' modeling_mixtral.py does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gguf

from localllm._exceptions import MissingConfigError
from localllm.convert.llama import LlamaFamily

__all__ = ["MixtralFamily"]


class MixtralFamily(LlamaFamily):
    """Mixtral 8x7B / 8x22B (``MixtralForCausalLM``)."""

    name = "mixtral"
    architectures = ("MixtralForCausalLM",)

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        try:
            self.n_experts = int(self.config["num_local_experts"])
            self.n_used = int(self.config["num_experts_per_tok"])
        except (KeyError, TypeError, ValueError) as exc:
            raise MissingConfigError(f"config.json lacks a usable {exc} for Mixtral") from None

    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        """Llama's attention, then the router and every expert's three projections."""
        shapes = {k: v for k, v in super().layer_shapes().items() if not k.startswith("mlp.")}
        moe = "block_sparse_moe"
        shapes[f"{moe}.gate.weight"] = (self.n_experts, self.hidden)
        for e in range(self.n_experts):
            shapes[f"{moe}.experts.{e}.w1.weight"] = (self.ffn, self.hidden)
            shapes[f"{moe}.experts.{e}.w2.weight"] = (self.hidden, self.ffn)
            shapes[f"{moe}.experts.{e}.w3.weight"] = (self.ffn, self.hidden)
        return shapes

    def write_hparams(self, w: gguf.GGUFWriter) -> None:
        """Llama's keys plus the expert counts."""
        super().write_hparams(w)
        w.add_expert_count(self.n_experts)
        w.add_expert_used_count(self.n_used)
