"""Write tiny but real llama-architecture GGUF models with ``gguf.GGUFWriter``.

The model has a byte-level BPE vocabulary (all 256 bytes, a few merges, ChatML and FIM special
tokens), a ChatML chat template and random weights scaled so that logits are well separated:
greedy decoding is deterministic and does not flip on floating-point noise between batched and
unbatched evaluation. llama.cpp loads it and generates from it in milliseconds.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

__all__ = [
    "CHATML_TEMPLATE",
    "HERMES_TEMPLATE",
    "SPECIAL_TOKENS",
    "byte_to_unicode",
    "write_tiny_gguf",
]

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# A Qwen 2.5-style template: tools in the system turn, calls as <tool_call> JSON, results as
# <tool_response> in a user turn.
HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nYou may call functions.\n<tools>"
    "{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n"
    "For each function call, return a json object within <tool_call></tool_call> XML tags."
    "<|im_end|>\n{% endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant\n"
    "{% for call in message.tool_calls %}<tool_call>\n"
    '{{ {"name": call.function.name, "arguments": call.function.arguments} | tojson }}\n'
    "</tool_call>{% endfor %}<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n"
    "{{ message.content }}\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<fim_prefix>",
    "<fim_suffix>",
    "<fim_middle>",
]

# Common English pieces, so ordinary text tokenizes into fewer tokens than bytes.
_MERGES = [
    ("Ġ", "t"),
    ("h", "e"),
    ("Ġt", "he"),
    ("i", "n"),
    ("Ġ", "a"),
    ("e", "r"),
    ("o", "n"),
    ("Ġ", "s"),
    ("r", "e"),
    ("Ġ", "w"),
    ("a", "t"),
    ("e", "n"),
    ("Ġ", "b"),
    ("o", "r"),
    ("Ġ", "c"),
    ("i", "s"),
    ("Ġ", "o"),
    ("Ġ", "i"),
    ("l", "l"),
    ("Ġ", "h"),
    ("e", "s"),
    ("a", "n"),
    ("Ġ", "m"),
    ("Ġ", "f"),
    ("Ġ", "p"),
    ("Ġ", "d"),
    ("i", "t"),
    ("o", "u"),
    ("Ġs", "ky"),
    ("s", "k"),
    ("sk", "y"),
    ("Ġb", "l"),
    ("u", "e"),
    ("Ġbl", "ue"),
]


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible mapping of bytes to printable characters (what byte-level BPE uses)."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def _vocabulary(extra_tokens: int = 0) -> tuple[list[str], list[int], list[str]]:
    tokens = [byte_to_unicode()[b] for b in range(256)]
    merges = []
    for left, right in _MERGES:
        merged = left + right
        merges.append(f"{left} {right}")
        if merged not in tokens:
            tokens.append(merged)
    tokens += [f"<extra_{i}>" for i in range(extra_tokens)]
    token_types = [gguf.TokenType.NORMAL] * len(tokens)
    for special in SPECIAL_TOKENS:
        tokens.append(special)
        token_types.append(gguf.TokenType.CONTROL)
    return tokens, [int(t) for t in token_types], merges


def write_tiny_gguf(
    path: str | Path,
    *,
    n_embd: int = 256,
    n_layers: int = 2,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 512,
    context_length: int = 4096,
    dtype: str = "f32",
    seed: int = 0,
    chat_template: str | None = CHATML_TEMPLATE,
    name: str = "tiny-llama",
    license: str | None = "MIT",
    never_ends: bool = False,
    extra_tokens: int = 0,
    reranker: bool = False,
) -> Path:
    """Write a tiny llama model to ``path`` and return the path.

    ``dtype`` is ``f32`` or ``f16`` for the weight matrices (norms stay F32, as in real files).
    n_embd defaults to 256 so every K-quant's 256-wide blocks apply when quantizing it.
    ``never_ends`` zeroes the special tokens' output rows: their logit is then 0 while the
    best of the others is around +20, so greedy decoding never ends a generation by itself.
    ``extra_tokens`` adds that many ordinary tokens before the special ones (another
    vocabulary, for draft-model compatibility checks).
    ``reranker`` writes a Qwen3-architecture reranker instead (as Qwen3-Reranker's GGUFs are):
    per-head Q/K norms, a two-label classifier head (``cls.output``), rank pooling (llama.cpp
    scores each sequence with the head at its last token) and a rerank prompt.
    """
    path = Path(path)
    rng = np.random.default_rng(seed)
    tokens, token_types, merges = _vocabulary(extra_tokens)
    n_vocab = len(tokens)
    head_dim = n_embd // n_head
    matrix_type = {"f32": np.float32, "f16": np.float16}[dtype]

    writer = gguf.GGUFWriter(str(path), "qwen3" if reranker else "llama")
    writer.add_name(name)
    writer.add_context_length(context_length)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layers)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(
        gguf.LlamaFileType.ALL_F32 if dtype == "f32" else gguf.LlamaFileType.MOSTLY_F16
    )
    if license is not None:
        writer.add_license(license)

    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(merges)
    special = {token: tokens.index(token) for token in SPECIAL_TOKENS}
    writer.add_bos_token_id(special["<|endoftext|>"])
    writer.add_eos_token_id(special["<|im_end|>"])
    writer.add_pad_token_id(special["<|endoftext|>"])
    writer.add_add_bos_token(False)
    writer.add_uint32(gguf.Keys.Tokenizer.FIM_PRE_ID, special["<fim_prefix>"])
    writer.add_uint32(gguf.Keys.Tokenizer.FIM_SUF_ID, special["<fim_suffix>"])
    writer.add_uint32(gguf.Keys.Tokenizer.FIM_MID_ID, special["<fim_middle>"])
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    if reranker:
        writer.add_pooling_type(gguf.PoolingType.RANK)
        # Qwen3-Reranker's labels: llama.cpp soft-maxes the head's outputs, the first is the
        # score; and its rerank prompt, which llama-server fills with the query and document.
        writer.add_array("qwen3.classifier.output_labels", ["yes", "no"])
        writer.add_string(
            "tokenizer.chat_template.rerank",
            "<|im_start|>system\nJudge the document.<|im_end|>\n<|im_start|>user\n"
            "<Query>: {query}\n<Document>: {document}<|im_end|>\n<|im_start|>assistant\n",
        )

    def matrix(rows: int, cols: int, scale: float) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale).astype(matrix_type)

    def norm() -> np.ndarray:
        return np.ones(n_embd, dtype=np.float32)

    # numpy shape is (rows, cols) = ggml (ne1, ne0): token_embd is ne {n_embd, n_vocab}.
    writer.add_tensor("token_embd.weight", matrix(n_vocab, n_embd, 1.0))
    for layer in range(n_layers):
        prefix = f"blk.{layer}"
        attn_scale = 1.0 / np.sqrt(n_embd)
        writer.add_tensor(f"{prefix}.attn_norm.weight", norm())
        writer.add_tensor(f"{prefix}.attn_q.weight", matrix(n_embd, n_embd, attn_scale))
        writer.add_tensor(
            f"{prefix}.attn_k.weight", matrix(n_head_kv * head_dim, n_embd, attn_scale)
        )
        writer.add_tensor(
            f"{prefix}.attn_v.weight", matrix(n_head_kv * head_dim, n_embd, attn_scale)
        )
        writer.add_tensor(f"{prefix}.attn_output.weight", matrix(n_embd, n_embd, attn_scale))
        if reranker:
            writer.add_tensor(f"{prefix}.attn_q_norm.weight", np.ones(head_dim, np.float32))
            writer.add_tensor(f"{prefix}.attn_k_norm.weight", np.ones(head_dim, np.float32))
        writer.add_tensor(f"{prefix}.ffn_norm.weight", norm())
        writer.add_tensor(f"{prefix}.ffn_gate.weight", matrix(n_ff, n_embd, attn_scale))
        writer.add_tensor(f"{prefix}.ffn_up.weight", matrix(n_ff, n_embd, attn_scale))
        writer.add_tensor(f"{prefix}.ffn_down.weight", matrix(n_embd, n_ff, 1.0 / np.sqrt(n_ff)))
    writer.add_tensor("output_norm.weight", norm())
    # Large output weights spread the logits (std ~ 0.5 * sqrt(n_embd)) so greedy choices
    # have wide margins.
    output = matrix(n_vocab, n_embd, 0.5)
    if never_ends:
        output[len(tokens) - len(SPECIAL_TOKENS) :] = 0
    writer.add_tensor("output.weight", output)
    if reranker:
        writer.add_tensor("cls.output.weight", matrix(2, n_embd, 1.0 / np.sqrt(n_embd)))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
