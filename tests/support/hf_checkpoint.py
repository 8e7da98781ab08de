"""Write tiny random-weight checkpoints the way the Hugging Face Hub ships them.

A folder per model: ``config.json``; the weights in bf16, split over two safetensors shards
written by the ``safetensors`` library with ``model.safetensors.index.json``; a tokenizer
trained here (no network): a byte-level BPE ``tokenizer.json`` (``tokenizers``) or a
SentencePiece ``tokenizer.model`` (``sentencepiece``); ``tokenizer_config.json`` and
``generation_config.json``. The float32 values of the bf16 weights are returned too, for the
numpy reference forward pass (:mod:`hf_reference`).

Families: llama, llama31 (tied embeddings and Llama 3.1 rope scaling), mistral, qwen2, qwen3,
gemma2, gemma3, phi3. Every model is tiny: hidden 64, 2 layers (Gemma 3: 6, its sliding
window pattern's length, so one layer is global).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import safetensors

__all__ = [
    "CORPUS",
    "FAMILIES",
    "Checkpoint",
    "bf16_bits",
    "store_as_int32",
    "write_checkpoint",
    "write_shards",
]

FAMILIES = (
    "llama",
    "llama31",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma2",
    "gemma3",
    "phi3",
    "mixtral",
    "qwen3moe",
)

CORPUS = [
    "The quick brown fox jumps over the lazy dog while the cat sleeps in the sun.",
    "Models as the Hub ships them are folders of safetensors shards and a tokenizer.",
    "In 1984 there were 12 apples, 345 pears and 6789 plums on the market stall!",
    "She said: 'I've been there, you're sure?' and we'll see what they'd do.",
    'def convert(folder): return folder.read_text() + "\\n"  # code, too',
    "Numbers like 3.14159 and 2,718 and 1e-5 appear in papers about language models.",
    "Über café naïve résumé — unicode text with accents, dashes and emojis 🦙🚀.",
    "Hello world! Hello again, world. Goodbye for now, world of tiny models.",
]

LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + "
    "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass
class Checkpoint:
    """A written checkpoint: its folder, config, the weights' float32 values and tokenizer."""

    folder: Path
    family: str
    config: dict[str, Any]
    weights: dict[str, np.ndarray]
    tokenizer: str
    """``"bpe"`` or ``"spm"``."""
    bos_id: int | None
    add_bos: bool
    eos_id: int
    stop_ids: list[int] = field(default_factory=list)


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 → bf16 bits, rounding to nearest even (as torch's ``.to(torch.bfloat16)``)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
    return (rounded >> np.uint32(16)).astype(np.uint16)


def _from_bits(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def write_shards(
    folder: Path, tensors: dict[str, np.ndarray], n_shards: int = 2, dtype: str = "bf16"
) -> dict[str, np.ndarray]:
    """Write ``tensors`` as ``n_shards`` safetensors files plus the index; returns the values
    as stored (bf16-rounded float32)."""
    names = list(tensors)
    per = -(-len(names) // n_shards)
    weight_map: dict[str, str] = {}
    stored: dict[str, np.ndarray] = {}
    total = 0
    for s in range(n_shards):
        fname = f"model-{s + 1:05d}-of-{n_shards:05d}.safetensors"
        specs, keep = {}, []
        for name in names[s * per : (s + 1) * per]:
            arr = np.ascontiguousarray(tensors[name], dtype=np.float32)
            if dtype == "bf16":
                raw = bf16_bits(arr)
                stored[name] = _from_bits(raw)
                st_dtype = "bfloat16"
            elif dtype == "f16":
                raw = arr.astype(np.float16)
                stored[name] = raw.astype(np.float32)
                st_dtype = "float16"
            else:
                raw = arr
                stored[name] = arr
                st_dtype = "float32"
            keep.append(raw)
            specs[name] = safetensors.TensorSpec(
                dtype=st_dtype, shape=raw.shape, data_ptr=raw.ctypes.data, data_len=raw.nbytes
            )
            weight_map[name] = fname
            total += raw.nbytes
        safetensors.serialize_file(specs, str(folder / fname), metadata={"format": "pt"})
        del keep
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return stored


def store_as_int32(folder: Path, tensor: str) -> Path:
    """Rewrite the shard holding ``tensor`` with that one tensor stored as int32 (a dtype no
    config implies), the others' bytes unchanged; returns the shard."""
    for shard in sorted(folder.glob("*.safetensors")):
        raw = shard.read_bytes()
        n = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8 : 8 + n])
        if tensor in header:
            break
    else:
        raise AssertionError(f"no shard holds {tensor}")
    header.pop("__metadata__", None)
    keep, specs = [], {}
    for name, spec in header.items():
        if name == tensor:
            arr, st_dtype = np.zeros(spec["shape"], dtype=np.int32), "int32"
        else:
            begin, end = spec["data_offsets"]
            arr = np.frombuffer(raw[8 + n + begin : 8 + n + end], dtype=np.uint8).copy()
            st_dtype = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}[spec["dtype"]]
        keep.append(arr)
        specs[name] = safetensors.TensorSpec(
            dtype=st_dtype, shape=spec["shape"], data_ptr=arr.ctypes.data, data_len=arr.nbytes
        )
    safetensors.serialize_file(specs, str(shard))
    return shard


def _train_bpe(folder: Path, regex: str, specials: list[str], bos: str | None) -> dict[str, int]:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(ignore_merges=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    tok.add_special_tokens(specials)
    ids = {s: tok.token_to_id(s) for s in specials}
    if bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, ids[bos])]
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.save(str(folder / "tokenizer.json"))
    return ids


def _train_spm(folder: Path, *, dummy_prefix: bool, specials: list[str]) -> None:
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS * 4),
        model_writer=model,
        vocab_size=400,
        hard_vocab_limit=False,
        model_type="bpe",
        byte_fallback=True,
        character_coverage=1.0,
        add_dummy_prefix=dummy_prefix,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        user_defined_symbols=[],
        control_symbols=specials,
        minloglevel=2,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        split_digits=True,
        allow_whitespace_only_pieces=True,
    )
    (folder / "tokenizer.model").write_bytes(model.getvalue())


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2))


def _config(family: str, vocab: int) -> dict[str, Any]:
    base: dict[str, Any] = {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": vocab,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "hidden_act": "silu",
    }
    extra: dict[str, dict[str, Any]] = {
        "llama": {"architectures": ["LlamaForCausalLM"], "model_type": "llama"},
        "llama31": {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "tie_word_embeddings": True,
            "rope_theta": 500000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
        "mistral": {
            "architectures": ["MistralForCausalLM"],
            "model_type": "mistral",
            "sliding_window": None,
        },
        "qwen2": {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "tie_word_embeddings": True,
            "rope_theta": 1000000.0,
            "rms_norm_eps": 1e-6,
        },
        "qwen3": {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "head_dim": 32,
            "rope_theta": 1000000.0,
            "rms_norm_eps": 1e-6,
            "attention_bias": False,
        },
        "gemma2": {
            "architectures": ["Gemma2ForCausalLM"],
            "model_type": "gemma2",
            "head_dim": 16,
            "tie_word_embeddings": True,
            "rms_norm_eps": 1e-6,
            "hidden_activation": "gelu_pytorch_tanh",
            "hidden_act": "gelu_pytorch_tanh",
            "query_pre_attn_scalar": 16,
            "attn_logit_softcapping": 50.0,
            "final_logit_softcapping": 30.0,
            "sliding_window": 4,
        },
        "gemma3": {
            "architectures": ["Gemma3ForCausalLM"],
            "model_type": "gemma3_text",
            "head_dim": 16,
            "tie_word_embeddings": True,
            "rms_norm_eps": 1e-6,
            "num_hidden_layers": 6,
            "hidden_activation": "gelu_pytorch_tanh",
            "query_pre_attn_scalar": 16,
            "rope_theta": 1000000.0,
            "rope_local_base_freq": 10000.0,
            "sliding_window": 4,
            "sliding_window_pattern": 6,
            "attn_logit_softcapping": None,
            "final_logit_softcapping": None,
        },
        "mixtral": {
            "architectures": ["MixtralForCausalLM"],
            "model_type": "mixtral",
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": None,
        },
        "qwen3moe": {
            "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe",
            "head_dim": 32,
            "rope_theta": 1000000.0,
            "rms_norm_eps": 1e-6,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "norm_topk_prob": True,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
        },
        "phi3": {
            "architectures": ["Phi3ForCausalLM"],
            "model_type": "phi3",
            "num_key_value_heads": 4,
            "sliding_window": 2047,
            "original_max_position_embeddings": 256,
            "pad_token_id": 0,
        },
    }
    return {**base, **extra[family]}


def _weights(family: str, cfg: dict[str, Any], rng: np.random.Generator) -> dict[str, np.ndarray]:
    h, ffn, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    gemma = family.startswith("gemma")

    def mat(rows: int, cols: int) -> np.ndarray:
        return rng.normal(0.0, 1.0 / np.sqrt(cols), (rows, cols)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        # Gemma stores w for a scale of 1 + w; the others store the scale itself.
        centre = 0.0 if gemma else 1.0
        return (centre + 0.1 * rng.normal(size=n)).astype(np.float32)

    w: dict[str, np.ndarray] = {
        "model.embed_tokens.weight": rng.normal(0.0, 1.0, (vocab, h)).astype(np.float32)
    }
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(h)
        if family == "phi3":
            w[p + "self_attn.qkv_proj.weight"] = mat(q + 2 * kv, h)
        else:
            w[p + "self_attn.q_proj.weight"] = mat(q, h)
            w[p + "self_attn.k_proj.weight"] = mat(kv, h)
            w[p + "self_attn.v_proj.weight"] = mat(kv, h)
        w[p + "self_attn.o_proj.weight"] = mat(h, q)
        if family == "qwen2":
            for n, size in (("q", q), ("k", kv), ("v", kv)):
                w[p + f"self_attn.{n}_proj.bias"] = (0.5 * rng.normal(size=size)).astype(np.float32)
        if family in ("qwen3", "gemma3", "qwen3moe"):
            w[p + "self_attn.q_norm.weight"] = norm(hd)
            w[p + "self_attn.k_norm.weight"] = norm(hd)
        w[p + "post_attention_layernorm.weight"] = norm(h)
        if gemma:
            w[p + "pre_feedforward_layernorm.weight"] = norm(h)
            w[p + "post_feedforward_layernorm.weight"] = norm(h)
        if family == "phi3":
            w[p + "mlp.gate_up_proj.weight"] = mat(2 * ffn, h)
        elif family == "mixtral":
            w[p + "block_sparse_moe.gate.weight"] = mat(cfg["num_local_experts"], h) * 4.0
            for e in range(cfg["num_local_experts"]):
                x = p + f"block_sparse_moe.experts.{e}."
                w[x + "w1.weight"], w[x + "w3.weight"] = mat(ffn, h), mat(ffn, h)
                w[x + "w2.weight"] = mat(h, ffn)
        elif family == "qwen3moe":
            eff = cfg["moe_intermediate_size"]
            w[p + "mlp.gate.weight"] = mat(cfg["num_experts"], h) * 4.0
            for e in range(cfg["num_experts"]):
                x = p + f"mlp.experts.{e}."
                w[x + "gate_proj.weight"], w[x + "up_proj.weight"] = mat(eff, h), mat(eff, h)
                w[x + "down_proj.weight"] = mat(h, eff)
        else:
            w[p + "mlp.gate_proj.weight"] = mat(ffn, h)
            w[p + "mlp.up_proj.weight"] = mat(ffn, h)
        if family not in ("mixtral", "qwen3moe"):
            w[p + "mlp.down_proj.weight"] = mat(h, ffn)
    w["model.norm.weight"] = norm(h)
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = mat(vocab, h) * 4.0
    return w


def write_checkpoint(
    folder: Path, family: str, *, seed: int = 0, dtype: str = "bf16"
) -> Checkpoint:
    """Write a tiny ``family`` checkpoint into ``folder`` (created) and describe it."""
    folder.mkdir(parents=True, exist_ok=True)
    tok_cfg: dict[str, Any] = {"model_max_length": 256, "clean_up_tokenization_spaces": False}
    stop: list[int] = []
    if family in ("mistral", "mixtral", "gemma2", "gemma3", "phi3"):
        gemma = family.startswith("gemma")
        specials = (
            ["<start_of_turn>", "<end_of_turn>"]
            if gemma
            else ["<|endoftext|>", "<|user|>", "<|end|>"]
        )
        _train_spm(folder, dummy_prefix=not gemma, specials=specials)
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
        vocab = sp.vocab_size() + (8 if family == "phi3" else 0)  # padded embedding rows
        bos, eos, kind, add_bos = 1, 2, "spm", True
        tok_cfg.update(
            {
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "add_bos_token": True,
                "add_eos_token": False,
                "tokenizer_class": "LlamaTokenizer",
            }
        )
        stop = [sp.piece_to_id(specials[-1])]
    else:
        qwen = family.startswith("qwen")
        if qwen:
            names = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
            ids = _train_bpe(folder, QWEN2_REGEX, names, None)
            bos, eos, add_bos = None, ids["<|endoftext|>"], False
            tok_cfg.update(
                {
                    "bos_token": None,
                    "eos_token": "<|im_end|>",
                    "pad_token": "<|endoftext|>",
                    "add_bos_token": False,
                    "chat_template": CHATML,
                }
            )
            eos = ids["<|im_end|>"]
            stop = [ids["<|endoftext|>"]]
        else:
            names = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
            ids = _train_bpe(folder, LLAMA3_REGEX, names, "<|begin_of_text|>")
            bos, eos, add_bos = ids["<|begin_of_text|>"], ids["<|end_of_text|>"], True
            tok_cfg.update(
                {
                    "bos_token": "<|begin_of_text|>",
                    "eos_token": "<|end_of_text|>",
                    "chat_template": CHATML,
                }
            )
            stop = [ids["<|eot_id|>"]]
        kind = "bpe"
        from tokenizers import Tokenizer

        vocab = Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab_size() + 16
    cfg = _config(family, vocab)
    cfg.update({"bos_token_id": bos, "eos_token_id": eos})
    _write_json(folder / "config.json", cfg)
    _write_json(folder / "tokenizer_config.json", tok_cfg)
    _write_json(
        folder / "generation_config.json",
        {"bos_token_id": bos, "eos_token_id": [eos, *stop], "do_sample": False},
    )
    rng = np.random.default_rng(seed)
    weights = write_shards(folder, _weights(family, cfg, rng), dtype=dtype)
    return Checkpoint(folder, family, cfg, weights, kind, bos, add_bos, eos, stop)
