"""Each family: a tiny Hub-shaped checkpoint converted, run by llama.cpp, and compared with a
numpy reference forward pass of the same weights (see ``convert_compare`` for the tolerance),
and the prompt's token ids compared with the tokenizer library's (BOS included)."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from convert_compare import REL_TOLERANCE, compare
from hf_checkpoint import FAMILIES, bf16_bits, write_checkpoint

from localllm.convert import SUPPORTED_ARCHITECTURES, convert_folder, inspect_folder


@pytest.mark.parametrize("family", FAMILIES)
def test_family_matches_reference(family: str, tmp_path: Path) -> None:
    ck = write_checkpoint(tmp_path / family, family)
    assert ck.config["architectures"][0] in SUPPORTED_ARCHITECTURES
    seen: list[tuple[int, int]] = []
    result = convert_folder(
        ck.folder, tmp_path / "out" / "model.gguf", progress=lambda d, t: seen.append((d, t))
    )
    assert result.path.is_file() and result.bytes_written == result.path.stat().st_size
    assert not [p for p in result.path.parent.iterdir() if p.name != "model.gguf"]
    total = sum(ck.weights[n].size * 2 for n in ck.weights)
    assert seen[-1] == (total, total) and all(a <= b for (a, _), (b, _) in pairwise(seen))

    c = compare(ck, result.path)
    assert c.ids_llama == c.ids_reference, "llama.cpp tokenizes the prompt differently"
    assert len(c.ids_reference) >= 8
    assert c.rel_diff < REL_TOLERANCE, f"max |dlogit| {c.max_abs_diff} of scale {c.scale}"
    assert c.greedy_checked >= len(c.ids_reference) // 2
    assert c.greedy_equal == c.greedy_checked


def test_inspect_folder_reads_headers_only(tmp_path: Path) -> None:
    ck = write_checkpoint(tmp_path / "llama", "llama")
    info = inspect_folder(ck.folder)
    assert info.architecture == "LlamaForCausalLM" and info.family == "llama"
    assert info.dtype == "bf16"
    assert info.parameter_count == sum(w.size for w in ck.weights.values())
    assert info.tensor_bytes == 2 * info.parameter_count
    assert info.context_length == 256
    assert "model-00001-of-00002.safetensors" in info.files
    assert "tokenizer.json" in info.files and "config.json" in info.files


@pytest.mark.parametrize(
    ("outtype", "matrix", "tolerance"),
    [
        ("f32", "F32", REL_TOLERANCE),
        ("bf16", "BF16", REL_TOLERANCE),
        # q8_0 rounds each weight to 8 bits: a looser bound, still far below a wrong conversion.
        ("q8_0", "Q8_0", 5e-2),
    ],
)
def test_outtypes(tmp_path: Path, outtype: str, matrix: str, tolerance: float) -> None:
    import gguf

    ck = write_checkpoint(tmp_path / "m", "qwen2")
    result = convert_folder(ck.folder, tmp_path / f"m-{outtype}.gguf", outtype=outtype)
    kinds = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(result.path)).tensors}
    assert kinds["blk.0.attn_q.weight"] == matrix and kinds["token_embd.weight"] == matrix
    assert kinds["blk.0.attn_norm.weight"] == "F32" and kinds["blk.0.attn_q.bias"] == "F32"
    assert "output.weight" not in kinds  # tied embeddings: llama.cpp reuses token_embd
    c = compare(ck, result.path)
    assert c.rel_diff < tolerance
    assert c.greedy_equal >= c.greedy_checked - (1 if outtype == "q8_0" else 0)


def _bits(t: Any) -> np.ndarray:
    """A GGUF tensor's 16-bit values as raw bits, rows first."""
    return np.asarray(t.data).view(np.uint16).reshape(tuple(reversed(t.shape.tolist())))


def test_auto_copies_a_bf16_checkpoints_weights_bit_for_bit(tmp_path: Path) -> None:
    """``auto`` (the store's type for a conversion it quantizes next) keeps bf16 matrices
    BF16: each GGUF tensor holds exactly the checkpoint's bits (q/k rows in llama.cpp's
    order), the vectors f32 of the same values."""
    import gguf

    from localllm.convert.base import llama_rope_permutation

    ck = write_checkpoint(tmp_path / "m", "llama")
    result = convert_folder(ck.folder, tmp_path / "m.gguf", outtype="auto")
    tensors = {t.name: t for t in gguf.GGUFReader(str(result.path)).tensors}
    w, n_head, n_kv = ck.weights, ck.config["num_attention_heads"], ck.config["num_key_value_heads"]
    pairs = {
        "token_embd.weight": bf16_bits(w["model.embed_tokens.weight"]),
        "output.weight": bf16_bits(w["lm_head.weight"]),
        "blk.1.ffn_down.weight": bf16_bits(w["model.layers.1.mlp.down_proj.weight"]),
        "blk.0.attn_v.weight": bf16_bits(w["model.layers.0.self_attn.v_proj.weight"]),
    }
    for kind, heads in (("q", n_head), ("k", n_kv)):
        source = bf16_bits(w[f"model.layers.0.self_attn.{kind}_proj.weight"])
        pairs[f"blk.0.attn_{kind}.weight"] = source[llama_rope_permutation(len(source), heads)]
    for name, expected in pairs.items():
        assert tensors[name].tensor_type.name == "BF16", name
        assert np.array_equal(_bits(tensors[name]), expected), name
    norm = tensors["blk.0.attn_norm.weight"]
    assert norm.tensor_type.name == "F32"
    assert np.array_equal(np.asarray(norm.data), w["model.layers.0.input_layernorm.weight"])
    c = compare(ck, result.path)
    assert c.rel_diff < REL_TOLERANCE and c.greedy_equal == c.greedy_checked


@pytest.mark.parametrize("family", FAMILIES)
def test_auto_holds_the_values_of_an_exact_conversion(family: str, tmp_path: Path) -> None:
    """Every family (fused, stacked-expert, permuted, offset tensors included): the ``auto``
    GGUF's BF16 tensors, copied from the shards, hold exactly the values of the f32
    conversion (exact for a bf16 checkpoint), and its other tensors equal it."""
    import gguf

    ck = write_checkpoint(tmp_path / family, family)
    auto = convert_folder(ck.folder, tmp_path / "auto.gguf", outtype="auto").path
    exact = convert_folder(ck.folder, tmp_path / "f32.gguf", outtype="f32").path
    wide = {t.name: t for t in gguf.GGUFReader(str(exact)).tensors}
    copied = 0
    for t in gguf.GGUFReader(str(auto)).tensors:
        reference = np.asarray(wide[t.name].data, dtype=np.float32).reshape(-1)
        if t.tensor_type.name == "BF16":
            values = np.asarray(t.data).view(np.uint16).reshape(-1).astype(np.uint32) << 16
            assert np.array_equal(values.view(np.float32), reference), t.name
            copied += 1
        else:
            assert t.tensor_type.name == "F32", t.name
            assert np.array_equal(np.asarray(t.data).reshape(-1), reference), t.name
    assert copied > 3 * ck.config["num_hidden_layers"]  # the matrices, every layer's


@pytest.mark.parametrize("outtype", ["f16", "auto", "q8_0"])
def test_the_file_is_hashed_as_it_is_written(outtype: str, tmp_path: Path) -> None:
    """``sha256=True``: the digest the store names the blob by, computed by the writer thread
    (the header read back, arrays, padding, spans of the shards) is the file's."""
    import hashlib

    ck = write_checkpoint(tmp_path / "m", "qwen3moe")
    result = convert_folder(ck.folder, tmp_path / "m.gguf", outtype=outtype, sha256=True)
    assert result.sha256 == "sha256:" + hashlib.sha256(result.path.read_bytes()).hexdigest()
    assert convert_folder(ck.folder, tmp_path / "n.gguf", outtype=outtype).sha256 is None


@pytest.mark.parametrize(("stored", "matrix"), [("f16", "F16"), ("f32", "F16")])
def test_auto_for_other_checkpoints(tmp_path: Path, stored: str, matrix: str) -> None:
    """``auto``: an f16 checkpoint stays F16 (copied); an f32 one becomes F16."""
    import gguf

    ck = write_checkpoint(tmp_path / "m", "qwen2", dtype=stored)
    result = convert_folder(ck.folder, tmp_path / "m.gguf", outtype="auto")
    kinds = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(result.path)).tensors}
    assert kinds["blk.0.attn_q.weight"] == matrix and kinds["token_embd.weight"] == matrix
    assert kinds["blk.0.attn_q.bias"] == "F32"
    c = compare(ck, result.path)
    assert c.rel_diff < REL_TOLERANCE and c.greedy_equal == c.greedy_checked


def test_multimodal_gemma3_converts_its_text_model(tmp_path: Path) -> None:
    """A Gemma3ForConditionalGeneration folder (as the 4B-27B ship): text_config, the language
    model under ``language_model.model.*``, a vision tower left out with a note."""
    import json

    from hf_checkpoint import write_shards

    ck = write_checkpoint(tmp_path / "g", "gemma3")
    for p in ck.folder.glob("model-*.safetensors"):
        p.unlink()
    text = {k: v for k, v in ck.config.items() if k not in ("architectures", "torch_dtype")}
    (ck.folder / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["Gemma3ForConditionalGeneration"],
                "model_type": "gemma3",
                "torch_dtype": "bfloat16",
                "text_config": text,
                "vision_config": {"hidden_size": 32, "model_type": "siglip_vision_model"},
            }
        )
    )
    renamed = {"language_model." + k: v for k, v in ck.weights.items()}
    rng = np.random.default_rng(3)
    renamed["vision_tower.vision_model.embeddings.patch_embedding.weight"] = rng.normal(
        size=(32, 3, 14, 14)
    ).astype(np.float32)
    renamed["multi_modal_projector.mm_input_projection_weight"] = rng.normal(size=(32, 64)).astype(
        np.float32
    )
    write_shards(ck.folder, renamed)

    info = inspect_folder(ck.folder)
    assert info.family == "gemma3" and info.architecture == "Gemma3ForConditionalGeneration"
    result = convert_folder(ck.folder, tmp_path / "g.gguf")
    assert any("vision tower" in n for n in result.notes)
    c = compare(ck, result.path)
    assert c.ids_llama == c.ids_reference
    assert c.rel_diff < REL_TOLERANCE
    assert c.greedy_equal == c.greedy_checked > 0


def test_phi3_long_rope(tmp_path: Path) -> None:
    """Phi-3.5's long-rope scaling: factor tensors and the attention factor, checked against
    the reference within the original context (where the short factors apply)."""
    import json

    import gguf

    ck = write_checkpoint(tmp_path / "p", "phi3")
    half = ck.config["hidden_size"] // ck.config["num_attention_heads"] // 2
    scaling = {
        "type": "longrope",
        "short_factor": [1.0 + 0.25 * i for i in range(half)],
        "long_factor": [2.0 + 0.5 * i for i in range(half)],
    }
    ck.config.update(rope_scaling=scaling, max_position_embeddings=1024)
    (ck.folder / "config.json").write_text(json.dumps(ck.config))
    result = convert_folder(ck.folder, tmp_path / "p.gguf")
    names = {t.name for t in gguf.GGUFReader(str(result.path)).tensors}
    assert {"rope_factors_long.weight", "rope_factors_short.weight"} <= names
    c = compare(ck, result.path)
    assert c.rel_diff < REL_TOLERANCE
    assert c.greedy_equal == c.greedy_checked > 0


def test_converted_model_quantizes_with_the_store_quantizer(tmp_path: Path) -> None:
    """The path `create --from ./folder --quantize` takes: convert, then localllm's own
    quantizer (llama.cpp in a child process); the result still matches the reference."""
    from localllm.store.quantize import quantize_file

    ck = write_checkpoint(tmp_path / "m", "llama")
    # ``auto``: BF16, as the store converts a checkout it quantizes next
    converted = convert_folder(ck.folder, tmp_path / "m.gguf", outtype="auto").path
    q8 = tmp_path / "m-q8_0.gguf"
    quantize_file(converted, q8, "q8_0", threads=1)
    assert 0 < q8.stat().st_size < converted.stat().st_size
    c = compare(ck, q8)
    assert c.ids_llama == c.ids_reference
    assert c.rel_diff < 5e-2  # q8_0's rounding, as in test_outtypes
    assert c.greedy_equal >= c.greedy_checked - 1
