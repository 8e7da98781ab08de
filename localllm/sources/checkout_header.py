"""The GGUF header a checkout would convert to, made from its ``config.json`` alone: what
``show hf.co/<user>/<repo>`` plans and prices before a safetensors repository is downloaded,
as it plans a GGUF repository from the header it reads with Range requests.

The tensors are llama.cpp's (``token_embd``, ``blk.N.attn_q``... at their shapes from the
config: hidden size, heads, KV heads, head size, feed-forward size, experts, vocabulary,
tied embeddings), typed as llama.cpp's quantizer stores them (``Q4_K`` for Q4_K_M with its
Q6_K output head and Q6_K ``attn_v``/``ffn_down`` in the layers it gives more bits, F32 for
norms); the header is written by ``gguf.GGUFWriter`` and read back by
:func:`~localllm.gguf_info.inspect_gguf_header`, so the memory plan and the speed model see
what they see for any GGUF. Family details that move few bytes (biases, q/k norms) are
counted; sliding-window layers are not (the plan then counts their KV in full: more, not
less, than they need).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from .._exceptions import GGUFError
from ..gguf_info import GGUFInfo, inspect_gguf_header

__all__ = ["GGUF_ARCHITECTURES", "checkout_header"]

GGUF_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "MixtralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3moe",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
    "Gemma3ForConditionalGeneration": "gemma3",
    "Phi3ForCausalLM": "phi3",
}
"""Hugging Face architectures and the GGUF architecture they convert to (others: ``llama``'s
layout stands in for the estimate)."""
# The ggml type most matrices of a quantization have (the file type llama.cpp records).
_MAIN = {
    "Q4_0": ("Q4_0", 2),
    "Q4_K_S": ("Q4_K", 14),
    "Q4_K_M": ("Q4_K", 15),
    "Q5_K_M": ("Q5_K", 17),
    "Q6_K": ("Q6_K", 18),
    "Q8_0": ("Q8_0", 7),
    "F16": ("F16", 1),
}


_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


def _int(config: dict[str, Any], *keys: str, default: int = 0) -> int:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return default


def _more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's ``use_more_bits``: the layers whose ``attn_v`` and ``ffn_down`` a _M
    quantization keeps at Q6_K (the first and last eighth, every third between)."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def _wanted(quant: str, name: str, layers: int, tied: bool) -> str:
    """The type llama.cpp's quantizer gives the matrix ``name`` for ``quant`` (its main
    rules: the output head, or the embedding that is also the head, at Q6_K; the _M mixes'
    attn_v, fused qkv and ffn_down)."""
    main = _MAIN[quant][0]
    if main in ("F16", "Q8_0"):
        return main
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        return "Q6_K"
    if quant in ("Q4_K_M", "Q5_K_M") and any(
        part in name for part in (".attn_v.", ".attn_qkv.", ".ffn_down")
    ):
        return "Q6_K" if _more_bits(int(name.split(".")[1]), layers) else main
    return main


def _matrix_type(
    quant: str, columns: int, name: str = "", layers: int = 0, tied: bool = False
) -> Any:
    """The type a matrix of ``columns`` per row gets: the quant's own where its blocks fit
    the row, else llama.cpp's fallback (Q5_0 for Q4_K...), else F16."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    wanted = GGMLQuantizationType[_wanted(quant, name, layers, tied)]
    # llama.cpp's fallback for a row its k-quant blocks do not divide
    fallback = GGMLQuantizationType[_FALLBACK.get(wanted.name, "Q8_0")]
    for kind in (wanted, fallback, GGMLQuantizationType.F16):
        if columns % GGML_QUANT_SIZES[kind][0] == 0:
            return kind
    return GGMLQuantizationType.F16


def _tensors(config: dict[str, Any], arch: str) -> list[tuple[str, tuple[int, ...], bool]]:
    """``(name, numpy-order shape, is_matrix)`` of every tensor the conversion writes."""
    hidden = _int(config, "hidden_size", "n_embd", "d_model")
    layers = _int(config, "num_hidden_layers", "n_layer")
    heads = _int(config, "num_attention_heads", "n_head", default=1)
    kv_heads = _int(config, "num_key_value_heads", default=heads)
    head_dim = _int(config, "head_dim", default=hidden // max(heads, 1))
    ff = _int(config, "intermediate_size", "n_inner", default=4 * hidden)
    vocab = _int(config, "vocab_size", default=32000)
    experts = _int(config, "num_local_experts", "num_experts")
    expert_ff = _int(config, "moe_intermediate_size", default=ff)
    if not (hidden and layers):
        raise GGUFError("config.json gives no hidden_size or num_hidden_layers")
    q, kv = heads * head_dim, kv_heads * head_dim
    found: list[tuple[str, tuple[int, ...], bool]] = [("token_embd.weight", (vocab, hidden), True)]
    scaling = config.get("rope_scaling")
    if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type")) == "llama3":
        found.append(("rope_freqs.weight", (head_dim // 2,), False))  # Llama 3.1's factors
    for n in range(layers):
        block = f"blk.{n}"
        found.append((f"{block}.attn_norm.weight", (hidden,), False))
        if arch == "phi3":
            found.append((f"{block}.attn_qkv.weight", (q + 2 * kv, hidden), True))
        else:
            found += [
                (f"{block}.attn_q.weight", (q, hidden), True),
                (f"{block}.attn_k.weight", (kv, hidden), True),
                (f"{block}.attn_v.weight", (kv, hidden), True),
            ]
        found.append((f"{block}.attn_output.weight", (hidden, q), True))
        if arch == "qwen2":
            found += [
                (f"{block}.attn_{x}.bias", (size,), False)
                for x, size in (("q", q), ("k", kv), ("v", kv))
            ]
        if arch in ("qwen3", "qwen3moe", "gemma3"):
            found += [(f"{block}.attn_{x}_norm.weight", (head_dim,), False) for x in ("q", "k")]
        if arch in ("gemma2", "gemma3"):
            found.append((f"{block}.post_attention_norm.weight", (hidden,), False))
            found.append((f"{block}.post_ffw_norm.weight", (hidden,), False))
        found.append((f"{block}.ffn_norm.weight", (hidden,), False))
        if experts:
            found.append((f"{block}.ffn_gate_inp.weight", (experts, hidden), False))
            found += [
                (f"{block}.ffn_gate_exps.weight", (experts, expert_ff, hidden), True),
                (f"{block}.ffn_up_exps.weight", (experts, expert_ff, hidden), True),
                (f"{block}.ffn_down_exps.weight", (experts, hidden, expert_ff), True),
            ]
        elif arch == "phi3":
            found.append((f"{block}.ffn_up.weight", (2 * ff, hidden), True))
            found.append((f"{block}.ffn_down.weight", (hidden, ff), True))
        else:
            found += [
                (f"{block}.ffn_gate.weight", (ff, hidden), True),
                (f"{block}.ffn_up.weight", (ff, hidden), True),
                (f"{block}.ffn_down.weight", (hidden, ff), True),
            ]
    found.append(("output_norm.weight", (hidden,), False))
    if not config.get("tie_word_embeddings", arch in ("gemma2", "gemma3")):
        found.append(("output.weight", (vocab, hidden), True))
    return found


def checkout_header(config: dict[str, Any], architecture: str, quant: str) -> GGUFInfo:
    """The header of ``quant`` (one of :data:`~.checkout.CONVERTED_QUANTS`) for a checkout
    whose ``config.json`` is ``config``; raises :class:`GGUFError` for a config without the
    sizes it needs."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter

    arch = GGUF_ARCHITECTURES.get(architecture, "llama")
    hidden = _int(config, "hidden_size", "n_embd", "d_model")
    heads = _int(config, "num_attention_heads", "n_head", default=1)
    head_dim = _int(config, "head_dim", default=hidden // max(heads, 1))
    layers = _int(config, "num_hidden_layers", "n_layer")
    with tempfile.TemporaryDirectory(prefix="localllm-header-") as folder:
        path = Path(folder) / "header.gguf"
        writer = GGUFWriter(path, arch)
        writer.add_block_count(layers)
        writer.add_embedding_length(hidden)
        writer.add_feed_forward_length(_int(config, "intermediate_size", default=4 * hidden))
        writer.add_head_count(heads)
        writer.add_head_count_kv(_int(config, "num_key_value_heads", default=heads))
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
        writer.add_context_length(_int(config, "max_position_embeddings", default=4096))
        writer.add_file_type(_MAIN[quant][1])
        if experts := _int(config, "num_local_experts", "num_experts"):
            writer.add_expert_count(experts)
            writer.add_expert_used_count(_int(config, "num_experts_per_tok", default=2))
        data = 0
        tensors = _tensors(config, arch)
        tied = not any(name == "output.weight" for name, _, _ in tensors)
        for name, shape, matrix in tensors:
            if name.endswith("ffn_gate_inp.weight"):
                kind = GGMLQuantizationType.F16  # the router: never quantized
            elif matrix:
                kind = _matrix_type(quant, shape[-1], name, layers, tied)
            else:
                kind = GGMLQuantizationType.F32
            block, size = GGML_QUANT_SIZES[kind]
            elements = int(np.prod(shape))
            nbytes = elements // block * size
            writer.add_tensor_info(name, shape, np.dtype(np.float16), nbytes, raw_dtype=kind)
            data += nbytes + 32  # the data section aligns each tensor to 32 bytes
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        writer.close()
        header = path.read_bytes()
    return inspect_gguf_header(header, len(header) + data + 32, f"{quant} (converted)")
