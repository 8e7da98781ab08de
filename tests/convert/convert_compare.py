"""Run a converted GGUF in llama.cpp and compare it with the numpy reference of the checkpoint.

Shared by the family tests and by the report's table (``python tests/convert/convert_compare.py``).
The tolerance: the largest absolute logit difference, divided by the reference's largest
absolute logit, stays under ``REL_TOLERANCE``; the greedy token (argmax) is equal at every
position where the reference's top two logits are more than ``TIE_MARGIN`` (of the same scale)
apart.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

if __name__ == "__main__":  # run as a script: the tests' support modules, as conftest adds them
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))

from hf_checkpoint import FAMILIES, Checkpoint, write_checkpoint
from hf_reference import forward

__all__ = ["PROMPT", "REL_TOLERANCE", "TIE_MARGIN", "Comparison", "compare", "reference_ids"]

PROMPT = "The quick brown fox jumps over 12 lazy dogs; she said: 'we'll see!'"
REL_TOLERANCE = 1e-2
TIE_MARGIN = 2e-2


@dataclass
class Comparison:
    """The outcome of one family's check."""

    family: str
    ids_reference: list[int]
    ids_llama: list[int]
    max_abs_diff: float
    scale: float
    greedy_checked: int
    greedy_equal: int

    @property
    def rel_diff(self) -> float:
        """Largest difference relative to the logits' scale."""
        return self.max_abs_diff / self.scale


def reference_ids(ck: Checkpoint, text: str) -> list[int]:
    """The ids the checkpoint's own tokenizer library gives for ``text``, BOS included."""
    if ck.tokenizer == "bpe":
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(ck.folder / "tokenizer.json")).encode(text).ids
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(ck.folder / "tokenizer.model"))
    ids = sp.encode(text)
    return ([ck.bos_id] if ck.add_bos and ck.bos_id is not None else []) + ids


def compare(ck: Checkpoint, gguf_path: Path, text: str = PROMPT) -> Comparison:
    """Tokenize ``text`` in both worlds and compare llama.cpp's logits with the reference's."""
    from llama_cpp import Llama

    llm = Llama(
        model_path=str(gguf_path),
        n_ctx=128,
        n_batch=128,
        n_threads=2,
        logits_all=True,
        verbose=False,
    )
    try:
        ids_llama = llm.tokenize(text.encode(), add_bos=True, special=False)
        ids_ref = reference_ids(ck, text)
        llm.eval(ids_ref)
        got = np.array(llm.scores[: len(ids_ref)], dtype=np.float32)
    finally:
        llm.close()
    want = forward(ck.family, ck.config, ck.weights, ids_ref)
    diff = float(np.max(np.abs(got - want)))
    scale = float(np.max(np.abs(want)))
    top2 = np.sort(want, axis=-1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > TIE_MARGIN * scale
    equal = np.argmax(got, axis=-1) == np.argmax(want, axis=-1)
    return Comparison(
        ck.family,
        ids_ref,
        list(ids_llama),
        diff,
        scale,
        int(clear.sum()),
        int((equal & clear).sum()),
    )


def main() -> None:
    """Print the families table (converted; ids equal; largest difference; greedy equal)."""
    import tempfile

    from localllm.convert import convert_folder

    families = sys.argv[1:] or list(FAMILIES)
    print(
        f"{'family':9} {'converted':9} {'ids equal':9} {'max|dlogit|':>11} {'rel':>8} greedy equal"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for fam in families:
            ck = write_checkpoint(Path(tmp) / fam, fam)
            try:
                out = convert_folder(ck.folder, Path(tmp) / f"{fam}.gguf")
            except Exception as exc:  # the table reports it
                print(f"{fam:9} no: {exc}")
                continue
            c = compare(ck, out.path)
            print(
                f"{fam:9} {'yes':9} {c.ids_llama == c.ids_reference!s:9} "
                f"{c.max_abs_diff:11.2e} {c.rel_diff:8.1e} "
                f"{c.greedy_equal}/{c.greedy_checked}"
            )


if __name__ == "__main__":
    main()
