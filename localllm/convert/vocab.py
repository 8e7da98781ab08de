"""The tokenizer of a safetensors folder, as llama.cpp's GGUF keys hold it.

Two kinds, as llama.cpp's converter tells them apart: a SentencePiece model (``tokenizer.model``:
pieces, scores, token types, byte fallback, the dummy space prefix) read with ``sentencepiece``;
else a byte-level BPE (``tokenizer.json``) read with ``tokenizers``, whose llama.cpp
pre-tokenizer is identified by hashing the ids of a fixed text (:mod:`.bpe_pre`). Special tokens,
add-BOS/EOS, merges and the chat template come from ``gguf.SpecialVocab`` (the gguf package's
reading of tokenizer_config.json, as llama.cpp's converter uses it); ``generation_config.json``'s
extra end-of-generation ids become the end-of-turn/end-of-message tokens.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf

from localllm._exceptions import ConvertError, MissingTokenizerError, TensorMismatchError
from localllm.convert.bpe_pre import CHECK_TEXT, KNOWN_HASHES, SPLIT_REGEXES

__all__ = ["Vocab", "has_tokenizer", "load_vocab", "write_vocab"]

_T = gguf.TokenType


@dataclass
class Vocab:
    """A tokenizer ready for the GGUF: one entry per embedding row."""

    model: str
    """``"llama"`` (SentencePiece) or ``"gpt2"`` (byte-level BPE), llama.cpp's names."""
    tokens: list[str]
    types: list[int]
    scores: list[float] | None = None
    pre: str | None = None
    """llama.cpp's pre-tokenizer name for BPE (``llama-bpe``, ``qwen2``...)."""
    add_space_prefix: bool | None = None
    special: gguf.SpecialVocab | None = None
    eot_ids: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def has_tokenizer(folder: Path) -> bool:
    """Whether the folder holds a tokenizer the converter reads."""
    return (folder / "tokenizer.model").is_file() or (folder / "tokenizer.json").is_file()


def _looks_special(text: str) -> bool:
    # As llama.cpp's converter: some added tokens meant as control are not marked special.
    return (
        text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
        or (text.startswith("<|") and text.endswith("|>"))
        or (text.startswith("<unused") and text.endswith(">"))
    )


def _added_tokens(folder: Path) -> dict[int, tuple[str, bool]]:
    """id → (content, special) from tokenizer_config.json and tokenizer.json's added tokens."""
    out: dict[int, tuple[str, bool]] = {}
    tj = folder / "tokenizer.json"
    if tj.is_file():
        for item in _json(tj).get("added_tokens") or []:
            out[int(item["id"])] = (str(item["content"]), bool(item.get("special")))
    tc = folder / "tokenizer_config.json"
    if tc.is_file():
        for key, item in (_json(tc).get("added_tokens_decoder") or {}).items():
            out[int(key)] = (str(item["content"]), bool(item.get("special")))
    return out


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise MissingTokenizerError(f"{path.name}: cannot be read as JSON ({exc})") from None
    if not isinstance(data, dict):
        raise MissingTokenizerError(f"{path.name}: not a JSON object")
    return data


def _sentencepiece(folder: Path, n_vocab: int) -> Vocab:
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor()
    try:
        sp.LoadFromFile(str(folder / "tokenizer.model"))
    except (OSError, RuntimeError) as exc:
        raise MissingTokenizerError(
            f"tokenizer.model is not a SentencePiece model ({exc})"
        ) from None
    size = sp.vocab_size()
    if size > n_vocab:
        raise TensorMismatchError(
            f"tokenizer.model has {size} pieces but the embeddings only "
            f"{n_vocab} rows (config.json vocab_size)"
        )
    tokens: list[str] = []
    scores: list[float] = []
    types: list[int] = []
    for i in range(size):
        tokens.append(sp.IdToPiece(i))
        scores.append(sp.GetScore(i))
        kind = _T.NORMAL
        if sp.IsUnknown(i):
            kind = _T.UNKNOWN
        elif sp.IsControl(i):
            kind = _T.CONTROL
        elif sp.IsUnused(i):
            kind = _T.UNUSED
        elif sp.IsByte(i):
            kind = _T.BYTE
        types.append(int(kind))
    _pad(tokens, types, n_vocab, scores)
    for tid, (content, special) in _added_tokens(folder).items():
        if tid >= n_vocab:
            raise TensorMismatchError(
                f"added token {content!r} has id {tid}, beyond the {n_vocab} embedding rows"
            )
        if tid < size and tokens[tid] == content:
            if special and types[tid] == _T.NORMAL:
                types[tid] = int(_T.CONTROL)
            continue
        special = special or _looks_special(content)
        tokens[tid] = content if special else content.replace("\u2581", " ")
        types[tid] = int(_T.CONTROL if special else _T.USER_DEFINED)
        scores[tid] = -1000.0
    # The dummy prefix, read from what the model does (a piece starting with "▁" for "a"),
    # so no protobuf parser is needed.
    first = sp.EncodeAsPieces("a")
    prefix = bool(first) and first[0].startswith("\u2581")
    return Vocab("llama", tokens, types, scores, add_space_prefix=prefix)


def _pad(tokens: list[str], types: list[int], n: int, scores: list[float] | None = None) -> None:
    for i in range(len(tokens), n):
        tokens.append(f"[PAD{i}]")
        types.append(int(_T.UNUSED))
        if scores is not None:
            scores.append(-1000.0)


def _bpe_pre(tok: Any, spec: dict[str, Any]) -> tuple[str, str | None]:
    """(pre-tokenizer name, note) as llama.cpp identifies it, else from the Split regex."""
    ids = tok.encode(CHECK_TEXT).ids
    digest = hashlib.sha256(str(ids).encode()).hexdigest()
    if digest in KNOWN_HASHES:
        return KNOWN_HASHES[digest], None
    pre = spec.get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers") or [pre]
    for part in parts:
        if part.get("type") == "Split":
            regex = (part.get("pattern") or {}).get("Regex")
            if regex in SPLIT_REGEXES:
                name = SPLIT_REGEXES[regex]
                return name, (
                    f"tokenizer.json's vocabulary is not in llama.cpp's table "
                    f"(hash {digest[:12]}); its pre-tokenizer regex is {name}'s"
                )
    if len(parts) == 1 and parts[0].get("type") == "ByteLevel" and parts[0].get("use_regex", True):
        return "gpt-2", (
            f"tokenizer.json's vocabulary is not in llama.cpp's table "
            f"(hash {digest[:12]}); its pre-tokenizer is GPT-2's byte level"
        )
    raise ConvertError(
        f"the BPE pre-tokenizer of tokenizer.json is not one llama.cpp knows (hash {digest}); "
        "converting it anyway would tokenize text differently from the original model"
    )


def _bpe(folder: Path, n_vocab: int) -> Vocab:
    import tokenizers

    spec = _json(folder / "tokenizer.json")
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        raise MissingTokenizerError(
            f"tokenizer.json holds a {model.get('type')} model and no "
            "tokenizer.model is present: only BPE and SentencePiece "
            "tokenizers are supported"
        )
    if model.get("byte_fallback"):
        raise MissingTokenizerError(
            "tokenizer.json is a SentencePiece-style BPE (byte "
            "fallback) but tokenizer.model is missing: add it"
        )
    try:
        tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    except Exception as exc:  # the Rust library raises a bare Exception for bad files
        raise MissingTokenizerError(f"tokenizer.json cannot be loaded ({exc})") from None
    vocab = tok.get_vocab(with_added_tokens=True)
    if vocab and max(vocab.values()) >= n_vocab:
        raise TensorMismatchError(
            f"tokenizer.json has ids up to {max(vocab.values())} but the "
            f"embeddings only {n_vocab} rows (config.json vocab_size)"
        )
    added = tok.get_added_tokens_decoder()
    reverse = {i: t for t, i in vocab.items()}
    tokens: list[str] = []
    types: list[int] = []
    for i in range(n_vocab):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(int(_T.UNUSED))
            continue
        text = reverse[i]
        if i in added:
            special = added[i].special or _looks_special(text)
            types.append(int(_T.CONTROL if special else _T.USER_DEFINED))
        else:
            types.append(int(_T.NORMAL))
        tokens.append(text)
    pre, note = _bpe_pre(tok, spec)
    return Vocab("gpt2", tokens, types, pre=pre, notes=[note] if note else [])


def _stop_ids(folder: Path, special: gguf.SpecialVocab) -> tuple[list[int], list[str]]:
    """generation_config.json's eos ids other than the tokenizer's EOS (end-of-turn tokens)."""
    path = folder / "generation_config.json"
    if not path.is_file():
        return [], []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return [], ["generation_config.json is not JSON: its stop tokens were not read"]
    ids = data.get("eos_token_id") if isinstance(data, dict) else None
    ids = [ids] if isinstance(ids, int) else [i for i in ids or [] if isinstance(i, int)]
    eos = special.special_token_ids.get("eos")
    if eos is None and ids:
        special.special_token_ids["eos"] = ids[0]
        eos = ids[0]
    return [i for i in ids if i != eos], []


def load_vocab(folder: Path, n_vocab: int, *, prefer_sentencepiece: bool = True) -> Vocab:
    """Read the folder's tokenizer for an embedding of ``n_vocab`` rows."""
    if prefer_sentencepiece and (folder / "tokenizer.model").is_file():
        vocab = _sentencepiece(folder, n_vocab)
    elif (folder / "tokenizer.json").is_file():
        vocab = _bpe(folder, n_vocab)
    elif (folder / "tokenizer.model").is_file():
        vocab = _sentencepiece(folder, n_vocab)
    else:
        raise MissingTokenizerError(
            f"{folder} has no tokenizer: neither tokenizer.json nor tokenizer.model (copy the "
            "tokenizer files of the repository next to the weights)"
        )
    config = folder / "tokenizer_config.json"
    if vocab.model == "llama" and config.is_file():
        # The HF tokenizer's own switch wins over the model file's, as in llama.cpp's converter.
        flag = _json(config).get("add_prefix_space")
        if isinstance(flag, bool):
            vocab.add_space_prefix = flag
    try:
        vocab.special = gguf.SpecialVocab(
            folder, load_merges=vocab.model == "gpt2", n_vocab=n_vocab
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise MissingTokenizerError(
            f"the tokenizer's files cannot be read ({exc}): "
            "tokenizer.json / tokenizer_config.json damaged?"
        ) from None
    vocab.eot_ids, notes = _stop_ids(folder, vocab.special)
    vocab.notes.extend(notes)
    return vocab


def write_vocab(w: gguf.GGUFWriter, vocab: Vocab) -> list[str]:
    """Write the tokenizer keys; returns notes on what was decided (unmapped stop tokens)."""
    w.add_tokenizer_model(vocab.model)
    if vocab.pre:
        w.add_tokenizer_pre(vocab.pre)
    w.add_token_list(vocab.tokens)
    if vocab.scores is not None:
        w.add_token_scores(vocab.scores)
    w.add_token_types(vocab.types)
    if vocab.add_space_prefix is not None:
        w.add_add_space_prefix(vocab.add_space_prefix)
    notes = list(vocab.notes)
    if vocab.special is not None:
        vocab.special.add_to_gguf(w, quiet=True)
    taken = set(vocab.special.special_token_ids) if vocab.special is not None else set()
    extra = list(vocab.eot_ids)
    for kind, add in (("eot", w.add_eot_token_id), ("eom", w.add_eom_token_id)):
        if extra and kind not in taken:
            add(extra.pop(0))
    if extra:
        notes.append(
            f"generation_config.json stop ids {extra} have no GGUF key left; llama.cpp "
            "still stops on them when their text marks an end of turn"
        )
    return notes
