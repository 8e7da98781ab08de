"""Each family: a tiny Hub-shaped checkpoint converted, run by llama.cpp, and compared with a
numpy reference forward pass of the same weights (see ``convert_compare`` for the tolerance),
and the prompt's token ids compared with the tokenizer library's (BOS included)."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest
from convert_compare import REL_TOLERANCE, compare
from hf_checkpoint import write_checkpoint

from localllm.convert import SUPPORTED_ARCHITECTURES, convert_folder, inspect_folder

FAMILIES = ["llama", "llama31", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3",
            "mixtral", "qwen3moe"]


@pytest.mark.parametrize("family", FAMILIES)
def test_family_matches_reference(family: str, tmp_path: Path) -> None:
    ck = write_checkpoint(tmp_path / family, family)
    assert ck.config["architectures"][0] in SUPPORTED_ARCHITECTURES
    seen: list[tuple[int, int]] = []
    result = convert_folder(ck.folder, tmp_path / "out" / "model.gguf",
                            progress=lambda d, t: seen.append((d, t)))
    assert result.path.is_file() and result.bytes_written == result.path.stat().st_size
    assert not [p for p in result.path.parent.iterdir() if p.name != "model.gguf"]
    total = sum(ck.weights[n].size * 2 for n in ck.weights)
    assert seen[-1] == (total, total) and all(
        a <= b for (a, _), (b, _) in pairwise(seen))

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


@pytest.mark.parametrize(("outtype", "matrix", "tolerance"), [
    ("f32", "F32", REL_TOLERANCE), ("bf16", "BF16", REL_TOLERANCE),
    # q8_0 rounds each weight to 8 bits: a looser bound, still far below a wrong conversion.
    ("q8_0", "Q8_0", 5e-2),
])
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


def test_multimodal_gemma3_converts_its_text_model(tmp_path: Path) -> None:
    """A Gemma3ForConditionalGeneration folder (as the 4B-27B ship): text_config, the language
    model under ``language_model.model.*``, a vision tower left out with a note."""
    import json

    import numpy as np
    from hf_checkpoint import write_shards

    ck = write_checkpoint(tmp_path / "g", "gemma3")
    for p in ck.folder.glob("model-*.safetensors"):
        p.unlink()
    text = {k: v for k, v in ck.config.items() if k not in ("architectures", "torch_dtype")}
    (ck.folder / "config.json").write_text(json.dumps({
        "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
        "torch_dtype": "bfloat16", "text_config": text,
        "vision_config": {"hidden_size": 32, "model_type": "siglip_vision_model"}}))
    renamed = {"language_model." + k: v for k, v in ck.weights.items()}
    rng = np.random.default_rng(3)
    renamed["vision_tower.vision_model.embeddings.patch_embedding.weight"] = rng.normal(
        size=(32, 3, 14, 14)).astype(np.float32)
    renamed["multi_modal_projector.mm_input_projection_weight"] = rng.normal(
        size=(32, 64)).astype(np.float32)
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
    scaling = {"type": "longrope",
               "short_factor": [1.0 + 0.25 * i for i in range(half)],
               "long_factor": [2.0 + 0.5 * i for i in range(half)]}
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
    f16 = convert_folder(ck.folder, tmp_path / "m-f16.gguf").path
    q8 = tmp_path / "m-q8_0.gguf"
    quantize_file(f16, q8, "q8_0", threads=1)
    assert 0 < q8.stat().st_size < f16.stat().st_size
    c = compare(ck, q8)
    assert c.ids_llama == c.ids_reference
    assert c.rel_diff < 5e-2  # q8_0's rounding, as in test_outtypes
    assert c.greedy_equal >= c.greedy_checked - 1
