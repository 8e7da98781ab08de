"""The tokenizer keys of converted GGUFs: llama.cpp's pre-tokenizer identified by its hash on a
real vocabulary, BOS/EOS/add-BOS and the chat template as tokenizer_config.json says, the
generation config's stop ids, SentencePiece scores, types and space prefix."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from hf_checkpoint import CHATML, write_checkpoint, write_shards

from localllm.convert import convert_folder
from localllm.gguf_info import inspect_gguf
from localllm.starter import starter_gguf_path


def _field(reader: gguf.GGUFReader, key: str) -> object:
    f = reader.fields[key]
    if f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode()
    if f.types[0] == gguf.GGUFValueType.ARRAY:
        return [
            f.parts[i].tolist()[0]
            if f.types[-1] != gguf.GGUFValueType.STRING
            else bytes(f.parts[i]).decode()
            for i in f.data
        ]
    return f.parts[f.data[0]].tolist()[0]


def _smollm2_tokenizer_json(folder: Path) -> tuple[int, list[str]]:
    """SmolLM2's byte-level BPE rebuilt from the bundled GGUF: the same vocabulary, merges and
    pre-tokenizer (individual digits, then GPT-2's byte level) as its tokenizer.json."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    r = gguf.GGUFReader(str(starter_gguf_path()))
    tokens = _field(r, "tokenizer.ggml.tokens")
    types = _field(r, "tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in _field(r, "tokenizer.ggml.merges")]
    assert isinstance(tokens, list) and isinstance(types, list)
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    specials = [t for t, k in zip(tokens, types, strict=True) if k == gguf.TokenType.CONTROL]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tok.save(str(folder / "tokenizer.json"))
    return len(tokens), specials


def test_real_vocabulary_is_identified_by_llama_cpp_hash(tmp_path: Path) -> None:
    """SmolLM2's own vocabulary hashes to llama.cpp's "smollm" entry: no fallback, no note;
    llama.cpp then tokenizes text (digits, code, unicode) exactly as ``tokenizers`` does."""
    from llama_cpp import Llama
    from tokenizers import Tokenizer

    ck = write_checkpoint(tmp_path / "base", "llama")
    folder = ck.folder
    n_vocab, specials = _smollm2_tokenizer_json(folder)
    assert "<|im_start|>" in specials
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(vocab_size=n_vocab, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": "<|im_start|>",
                "eos_token": "<|im_end|>",
                "add_bos_token": False,
                "chat_template": CHATML,
            }
        )
    )
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    for p in folder.glob("model-*.safetensors"):
        p.unlink()
    weights = {k: v for k, v in ck.weights.items() if k != "lm_head.weight"}
    weights["model.embed_tokens.weight"] = (
        np.random.default_rng(1).normal(size=(n_vocab, 64)).astype(np.float32)
    )
    write_shards(folder, weights)

    result = convert_folder(folder, tmp_path / "smollm.gguf")
    # The header reader: gguf's GGUFReader takes ~2 s to build views of a 49k vocabulary.
    assert inspect_gguf(result.path).metadata["tokenizer.ggml.pre"] == "smollm"
    assert not [n for n in result.notes if "pre-tokenizer" in n]

    text = "Converting 12345 models in 2026: def f(x): return x**2  # Ünïcödé 🦙\n\n  done"
    llm = Llama(model_path=str(result.path), n_ctx=256, n_threads=2, verbose=False)
    try:
        got = llm.tokenize(text.encode(), add_bos=True, special=False)
    finally:
        llm.close()
    want = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(text).ids
    assert got == want
    assert len(want) > 20


def test_bpe_keys_follow_the_tokenizer_config(tmp_path: Path) -> None:
    ck = write_checkpoint(tmp_path / "m", "llama")
    result = convert_folder(ck.folder, tmp_path / "m.gguf")
    r = gguf.GGUFReader(str(result.path))
    assert _field(r, "tokenizer.ggml.model") == "gpt2"
    # The trained vocabulary is in no table: the Split regex names Llama 3's, and it says so.
    assert _field(r, "tokenizer.ggml.pre") == "llama-bpe"
    assert any("llama-bpe" in n for n in result.notes)
    assert _field(r, "tokenizer.ggml.bos_token_id") == ck.bos_id
    assert _field(r, "tokenizer.ggml.eos_token_id") == ck.eos_id
    assert _field(r, "tokenizer.ggml.eot_token_id") == ck.stop_ids[0]
    assert _field(r, "tokenizer.chat_template") == CHATML
    tokens = _field(r, "tokenizer.ggml.tokens")
    types = _field(r, "tokenizer.ggml.token_type")
    assert isinstance(tokens, list) and isinstance(types, list)
    assert len(tokens) == ck.config["vocab_size"]
    assert types[ck.bos_id] == gguf.TokenType.CONTROL
    assert tokens[-1] == f"[PAD{len(tokens) - 1}]" and types[-1] == gguf.TokenType.UNUSED
    assert len(_field(r, "tokenizer.ggml.merges")) > 50  # type: ignore[arg-type]


def test_qwen_adds_no_bos_and_stops_on_both_ids(tmp_path: Path) -> None:
    ck = write_checkpoint(tmp_path / "q", "qwen2")
    result = convert_folder(ck.folder, tmp_path / "q.gguf")
    r = gguf.GGUFReader(str(result.path))
    assert _field(r, "tokenizer.ggml.pre") == "qwen2"
    assert _field(r, "tokenizer.ggml.eos_token_id") == ck.eos_id
    assert _field(r, "tokenizer.ggml.eot_token_id") == ck.stop_ids[0]
    assert "tokenizer.ggml.bos_token_id" not in r.fields or not _field(
        r, "tokenizer.ggml.add_bos_token"
    )


@pytest.mark.parametrize(("family", "prefix"), [("mistral", True), ("gemma2", False)])
def test_sentencepiece_keys(tmp_path: Path, family: str, prefix: bool) -> None:
    import sentencepiece as spm

    ck = write_checkpoint(tmp_path / family, family)
    result = convert_folder(ck.folder, tmp_path / f"{family}.gguf")
    r = gguf.GGUFReader(str(result.path))
    sp = spm.SentencePieceProcessor(model_file=str(ck.folder / "tokenizer.model"))
    assert _field(r, "tokenizer.ggml.model") == "llama"
    assert _field(r, "tokenizer.ggml.add_space_prefix") is prefix
    assert _field(r, "tokenizer.ggml.add_bos_token") is True
    tokens = _field(r, "tokenizer.ggml.tokens")
    scores = _field(r, "tokenizer.ggml.scores")
    types = _field(r, "tokenizer.ggml.token_type")
    assert isinstance(tokens, list) and isinstance(scores, list) and isinstance(types, list)
    byte_a = sp.piece_to_id("<0x41>")
    assert types[byte_a] == gguf.TokenType.BYTE and tokens[byte_a] == "<0x41>"
    assert types[0] == gguf.TokenType.UNKNOWN and types[1] == gguf.TokenType.CONTROL
    some = sp.vocab_size() - 1
    assert scores[some] == pytest.approx(sp.GetScore(some))
    assert _field(r, "tokenizer.ggml.eot_token_id") == ck.stop_ids[0]


def test_generation_config_stop_ids_end_generation_in_llama_cpp(tmp_path: Path) -> None:
    import llama_cpp

    ck = write_checkpoint(tmp_path / "m", "llama")
    result = convert_folder(ck.folder, tmp_path / "m.gguf")
    llm = llama_cpp.Llama(model_path=str(result.path), n_ctx=64, n_threads=1, verbose=False)
    try:
        vocab = llama_cpp.llama_model_get_vocab(llm.model)
        assert llama_cpp.llama_vocab_is_eog(vocab, ck.eos_id)
        assert llama_cpp.llama_vocab_is_eog(vocab, ck.stop_ids[0])
        assert not llama_cpp.llama_vocab_is_eog(vocab, 100)
        assert llama_cpp.llama_vocab_bos(vocab) == ck.bos_id
    finally:
        llm.close()


def test_chat_template_from_its_own_file(tmp_path: Path) -> None:
    ck = write_checkpoint(tmp_path / "m", "qwen3")
    config = json.loads((ck.folder / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (ck.folder / "tokenizer_config.json").write_text(json.dumps(config))
    template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    (ck.folder / "chat_template.jinja").write_text(template)
    result = convert_folder(ck.folder, tmp_path / "m.gguf")
    assert _field(gguf.GGUFReader(str(result.path)), "tokenizer.chat_template") == template


def test_tokenizer_config_add_prefix_space_wins(tmp_path: Path) -> None:
    ck = write_checkpoint(tmp_path / "m", "mistral")
    config = json.loads((ck.folder / "tokenizer_config.json").read_text())
    config["add_prefix_space"] = False
    (ck.folder / "tokenizer_config.json").write_text(json.dumps(config))
    result = convert_folder(ck.folder, tmp_path / "m.gguf")
    assert _field(gguf.GGUFReader(str(result.path)), "tokenizer.ggml.add_space_prefix") is False
