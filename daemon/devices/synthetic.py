"""Synthetic llama-architecture GGUF models for the probes (:mod:`.cpu`'s, the speed probe's):
a byte-level SentencePiece vocabulary, norms of ones, a random token embedding, and weight
matrices of whatever type the caller makes them. llama.cpp loads and runs them like any model;
what they say is noise."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["LAYER_MATRICES", "Matrix", "fill_batch", "write_llama"]

LAYER_MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
"""The weight matrices of a llama layer, in the order :func:`write_llama` asks for them."""

Matrix = Callable[[str, int, int, int], tuple[Any, Any]]
"""``(name, layer, rows, cols) -> (data, ggml type)`` for each weight matrix (layer -1 for the
output head): a float32/float16 array with type ``None``, or quantized bytes and their
``gguf.GGMLQuantizationType``."""


def _shape(part: str, embd: int, ffn: int) -> tuple[int, int]:
    if part in ("ffn_gate", "ffn_up"):
        return ffn, embd
    if part == "ffn_down":
        return embd, ffn
    return embd, embd


def write_llama(
    path: Path,
    *,
    embd: int,
    ffn: int,
    heads: int,
    layers: int,
    vocab: int,
    matrix: Matrix,
    context: int = 4096,
    name: str | None = None,
    file_type: Any = None,
    experts: int = 0,
    experts_used: int = 0,
) -> None:
    """Write a ``layers``-layer llama of width ``embd`` (FFN ``ffn``, ``heads`` heads, no GQA)
    with a ``vocab``-token vocabulary (at least 259: three controls and the 256 bytes).

    With ``experts``, each layer's FFN is that many experts of width ``ffn`` (a Mixtral-style
    llama), each token routed to ``experts_used`` of them (0: every one, so that each expert
    multiplies exactly the tokens of a batch: the speed probe times llama.cpp's expert kernel
    at a per-expert batch it chooses). ``matrix`` is asked for one expert's matrix, used by
    all of them."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(0)
    from localllm.convert.writer import GGUFWriter  # gguf's, its vocabulary packed in bulk

    writer = GGUFWriter(str(path), "llama")
    if name:
        writer.add_name(name)
    writer.add_context_length(context)
    writer.add_embedding_length(embd)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(heads)
    writer.add_rope_dimension_count(embd // heads)
    writer.add_layer_norm_rms_eps(1e-5)
    if experts:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(experts_used or experts)
    if file_type is not None:
        writer.add_file_type(file_type)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"t{i}" for i in range(vocab - len(tokens))]
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    types = [gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.BYTE] * 256
    writer.add_token_types(types + [gguf.TokenType.NORMAL] * (len(tokens) - len(types)))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)

    def add(name: str, layer: int, rows: int, cols: int) -> None:
        data, kind = matrix(name, layer, rows, cols)
        if kind is None:
            writer.add_tensor(name, data)
        else:
            writer.add_tensor(name, data, raw_dtype=kind)

    ones = np.ones(embd, dtype=np.float32)
    # A few random rows repeated, in Q8_0: a 131,072-token embedding costs no seconds of
    # random numbers and no quarter gigabyte of F32 to write (a lookup's speed is the same).
    rows = (rng.standard_normal((64, embd)) * 0.05).astype(np.float32)
    q8_0 = gguf.GGMLQuantizationType.Q8_0
    block = gguf.quants.quantize(rows, q8_0)
    embedding = np.tile(block, (-(-vocab // 64), 1))[:vocab]
    writer.add_tensor("token_embd.weight", embedding, raw_dtype=q8_0)
    writer.add_tensor("output_norm.weight", ones)
    add("output.weight", -1, vocab, embd)
    for layer in range(layers):
        block = f"blk.{layer}"
        writer.add_tensor(f"{block}.attn_norm.weight", ones)
        writer.add_tensor(f"{block}.ffn_norm.weight", ones)
        for part in LAYER_MATRICES:
            if experts and part.startswith("ffn_"):
                data, kind = matrix(f"{block}.{part}.weight", layer, *_shape(part, embd, ffn))
                stacked = np.stack([data] * experts)
                tensor = f"{block}.{part}_exps.weight"
                if kind is None:
                    writer.add_tensor(tensor, stacked)
                else:
                    writer.add_tensor(tensor, stacked, raw_dtype=kind)
                continue
            add(f"{block}.{part}.weight", layer, *_shape(part, embd, ffn))
        if experts:
            # The router's logits are all 0 (with every expert used, none is left out).
            router = np.zeros((experts, embd), dtype=np.float32)
            writer.add_tensor(f"{block}.ffn_gate_inp.weight", router)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def fill_batch(batch: Any, start: int, count: int) -> None:
    """Put ``count`` tokens at positions ``start``... of sequence 0 in a ``llama_batch``
    (byte tokens, logits for the last one only): a probe's prompt or decode step."""
    batch.n_tokens = count
    for i in range(count):
        batch.token[i] = 3 + (start + i) % 256
        batch.pos[i] = start + i
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = 0
        batch.logits[i] = i == count - 1
