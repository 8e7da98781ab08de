"""Random-weight GGUF models with the shapes of published ones, written without a network.

The speed of a model depends on its shapes and weight types, not on what its weights say, so
the speed benchmarks (``predict.py``) measure models of several architectures that nobody can
download here: each is written with ``gguf.GGUFWriter`` in F16 (a few random rows repeated to
fill each matrix: a 3B model is written in seconds, without holding it in memory), then
quantized by ``localllm create --quantize`` (llama.cpp's quantizer: the K-quant mixes put
some tensors in Q6_K, rows not divisible by 256 fall back to legacy types, as in files on the
Hub).

The vocabulary is synthetic: SentencePiece-style with byte fallback (three controls, the 256
bytes, then ``t0``, ``t1`` ... up to the published size), so text tokenizes to about one token
per byte. The control tokens' rows of the output head are zero: their logit is 0 while the
best of the others is positive, so greedy decoding never ends a generation by itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

__all__ = ["SHAPES", "Shape", "write_shape"]


@dataclass(frozen=True)
class Shape:
    """An architecture's shapes (what a published model's config says)."""

    name: str
    arch: str
    embd: int
    layers: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = True
    experts: int = 0
    experts_used: int = 0
    expert_ffn: int = 0
    qk_norm: bool = False
    post_norms: bool = False
    sliding_window: int = 0
    rope_base: float = 10000.0
    published: str = ""
    """The model whose shapes these are."""

    @property
    def parameters(self) -> int:
        """Weights in the file (all experts counted)."""
        attention = self.embd * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        if self.experts:
            ffn = 3 * self.embd * self.expert_ffn * self.experts + self.embd * self.experts
        else:
            ffn = 3 * self.embd * self.ffn
        head = 0 if self.tied else self.vocab * self.embd
        return self.layers * (attention + ffn) + self.vocab * self.embd + head


SHAPES: dict[str, Shape] = {
    shape.name: shape
    for shape in (
        Shape(
            "llama3.2-1b", "llama", 2048, 16, 8192, 32, 8, 64, 128256,
            rope_base=500000.0, published="meta-llama/Llama-3.2-1B",
        ),
        Shape(
            "llama3.2-3b", "llama", 3072, 28, 8192, 24, 8, 128, 128256,
            rope_base=500000.0, published="meta-llama/Llama-3.2-3B",
        ),
        Shape(
            "qwen3-0.6b", "qwen3", 1024, 28, 3072, 16, 8, 128, 151936,
            qk_norm=True, rope_base=1000000.0, published="Qwen/Qwen3-0.6B",
        ),
        Shape(
            "gemma3-270m", "gemma3", 640, 18, 2048, 4, 1, 256, 262144,
            qk_norm=True, post_norms=True, sliding_window=512, rope_base=1000000.0,
            published="google/gemma-3-270m",
        ),
        Shape(
            # Qwen3-30B-A3B's layer design (128 experts, 8 routed, 768 wide) at a size this
            # machine holds: 32 experts, 4 routed, 12 layers of 1024.
            "qwen3moe-mini", "qwen3moe", 1024, 12, 0, 16, 4, 64, 151936,
            experts=32, experts_used=4, expert_ffn=768, qk_norm=True, rope_base=1000000.0,
            published="Qwen3-30B-A3B's design, scaled down (no published model)",
        ),
    )
}  # fmt: skip
"""The shapes the benchmarks use, by name."""


class _Tiled:
    """A ``rows`` x ``cols`` F16 matrix made of a few random rows repeated, written to the
    file block by block (what ``GGUFWriter`` asks of a tensor: shape, dtype, nbytes, tofile)."""

    _BLOCK = 64

    def __init__(self, shape: Sequence[int], rng: np.random.Generator, zero_rows: int = 0) -> None:
        self.shape = tuple(shape)
        self.dtype = np.dtype(np.float16)
        cols = self.shape[-1]
        self._rows = int(np.prod(self.shape[:-1]))
        self.nbytes = self._rows * cols * 2
        self._zero_rows = zero_rows
        self._block = (rng.standard_normal((self._BLOCK, cols)) * 0.05).astype(np.float16)

    def tofile(self, out: Any) -> None:
        block = self._block
        if self._zero_rows:
            np.zeros((self._zero_rows, block.shape[1]), dtype=np.float16).tofile(out)
        done = self._zero_rows
        whole = np.tile(block, (max(1, 4096 // self._BLOCK), 1))
        while done < self._rows:
            part = whole[: self._rows - done]
            part.tofile(out)
            done += len(part)


def _vocabulary(size: int) -> tuple[list[str], list[int]]:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"t{i}" for i in range(size - len(tokens))]
    types = [int(gguf.TokenType.CONTROL)] * 3 + [int(gguf.TokenType.BYTE)] * 256
    return tokens, types + [int(gguf.TokenType.NORMAL)] * (size - len(types))


def write_shape(path: Path, shape: Shape, context: int = 8192) -> Path:
    """Write ``shape`` as an F16 GGUF at ``path`` (norms F32, as converted models have)."""
    rng = np.random.default_rng(0)
    arch = shape.arch
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"random {shape.name}")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_context_length(context)
    writer.add_embedding_length(shape.embd)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.ffn or shape.expert_ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(shape.rope_base)
    writer.add_layer_norm_rms_eps(1e-6)
    if shape.sliding_window:
        writer.add_sliding_window(shape.sliding_window)
    if shape.experts:
        writer.add_expert_count(shape.experts)
        writer.add_expert_used_count(shape.experts_used)
        writer.add_expert_feed_forward_length(shape.expert_ffn)
    tokens, types = _vocabulary(shape.vocab)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)

    def matrix(name: str, *dims: int, zero_rows: int = 0) -> None:
        tensor = _Tiled(dims, rng, zero_rows)
        writer.add_tensor(name, tensor, raw_shape=tensor.shape)  # type: ignore[arg-type]

    def norm(name: str, width: int) -> None:
        writer.add_tensor(name, np.ones(width, dtype=np.float32))

    q_width, kv_width = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    # Tied: the embedding is the head, and its control rows are zero (see the docstring).
    matrix("token_embd.weight", shape.vocab, shape.embd, zero_rows=3 if shape.tied else 0)
    norm("output_norm.weight", shape.embd)
    if not shape.tied:
        matrix("output.weight", shape.vocab, shape.embd, zero_rows=3)
    for layer in range(shape.layers):
        block = f"blk.{layer}"
        norm(f"{block}.attn_norm.weight", shape.embd)
        matrix(f"{block}.attn_q.weight", q_width, shape.embd)
        matrix(f"{block}.attn_k.weight", kv_width, shape.embd)
        matrix(f"{block}.attn_v.weight", kv_width, shape.embd)
        matrix(f"{block}.attn_output.weight", shape.embd, q_width)
        if shape.qk_norm:
            norm(f"{block}.attn_q_norm.weight", shape.head_dim)
            norm(f"{block}.attn_k_norm.weight", shape.head_dim)
        if shape.post_norms:
            norm(f"{block}.post_attention_norm.weight", shape.embd)
            norm(f"{block}.post_ffw_norm.weight", shape.embd)
        norm(f"{block}.ffn_norm.weight", shape.embd)
        if shape.experts:
            matrix(f"{block}.ffn_gate_inp.weight", shape.experts, shape.embd)
            for part in ("gate", "up"):
                matrix(
                    f"{block}.ffn_{part}_exps.weight", shape.experts, shape.expert_ffn, shape.embd
                )
            matrix(f"{block}.ffn_down_exps.weight", shape.experts, shape.embd, shape.expert_ffn)
        else:
            matrix(f"{block}.ffn_gate.weight", shape.ffn, shape.embd)
            matrix(f"{block}.ffn_up.weight", shape.ffn, shape.embd)
            matrix(f"{block}.ffn_down.weight", shape.embd, shape.ffn)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
