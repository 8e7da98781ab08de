"""Gemma 3 (text): Gemma 2's layout plus RMS norms on queries and keys (also ``1 + w``), no
attention soft-capping, local layers with their own rope base, five local layers to one global.

llama.cpp fixes the pattern at five sliding-window layers then one global; a checkpoint whose
``sliding_window_pattern`` or ``layer_types`` says otherwise is refused, not converted wrong.
The multimodal ``Gemma3ForConditionalGeneration`` checkpoints (4B, 12B, 27B) convert to their
text model: the config's ``text_config`` (with transformers' defaults for what it omits), the
language model's tensors under their text names; the vision tower and projector are left out,
and the conversion says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gguf

from localllm._exceptions import ConvertError
from localllm.convert.gemma2 import Gemma2Family

__all__ = ["Gemma3Family"]

_PATTERN = 6  # llama.cpp: every sixth layer global

# Gemma3TextConfig's defaults: text_config in a multimodal config.json omits what equals them.
_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "query_pre_attn_scalar": 256,
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
    "sliding_window": 4096,
    "sliding_window_pattern": 6,
    "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-6,
    "final_logit_softcapping": None,
    "attn_logit_softcapping": None,
    "tie_word_embeddings": True,
}
_VISION = (
    "vision_tower.",
    "multi_modal_projector.",
    "model.vision_tower.",
    "model.multi_modal_projector.",
)
_TEXT_PREFIXES = (
    ("language_model.model.", "model."),
    ("model.language_model.", "model."),
    ("language_model.lm_head.", "lm_head."),
)


class Gemma3Family(Gemma2Family):
    """Gemma 3 text models (``Gemma3ForCausalLM``: 270M, 1B, and text-only exports)."""

    name = "gemma3"
    architectures = ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")
    gguf_arch = gguf.MODEL_ARCH.GEMMA3

    def __init__(self, config: Mapping[str, Any]) -> None:
        text = config.get("text_config")
        multimodal = isinstance(text, Mapping)
        if multimodal:
            config = {
                **_TEXT_DEFAULTS,
                **text,
                "architectures": config.get("architectures"),
                "torch_dtype": config.get("torch_dtype") or text.get("torch_dtype"),
            }
        super().__init__(config)
        if multimodal:
            self.notes.append(
                "multimodal Gemma 3: the text model is converted; the vision "
                "tower and projector are left out (images are not supported)"
            )
        if self.config.get("attn_logit_softcapping"):
            raise ConvertError(
                "a Gemma 3 checkpoint with attention soft-capping: llama.cpp's "
                "Gemma 3 graph has none"
            )
        kinds = self.config.get("layer_types")
        if kinds is None:
            n = int(self.config.get("sliding_window_pattern") or _PATTERN)
            kinds = [
                "full_attention" if (i + 1) % n == 0 else "sliding_attention"
                for i in range(self.n_layers)
            ]
        expected = [
            "full_attention" if (i + 1) % _PATTERN == 0 else "sliding_attention"
            for i in range(self.n_layers)
        ]
        if list(kinds) != expected:
            raise ConvertError(
                "this Gemma 3 checkpoint's sliding-window layers differ from llama.cpp's fixed "
                f"pattern (every {_PATTERN}th layer global): cannot convert it faithfully"
            )

    def rename(self, hf_name: str) -> str | None:
        """Text names for a multimodal checkpoint's language model; vision tensors left out."""
        if hf_name.startswith(_VISION):
            return None
        for old, new in _TEXT_PREFIXES:
            if hf_name.startswith(old):
                return new + hf_name[len(old) :]
        return hf_name

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
