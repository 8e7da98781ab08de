"""Tokens of prompt pieces seen before: a chat's system prompt, its earlier turns and the
template's headers are tokenized once, not at every request.

llama.cpp tokenizes a text with ``parse_special`` in two passes: it first cuts the text at
every special token (``tokenizer_st_partition`` in ``llama-vocab.cpp``), then tokenizes each
plain fragment on its own. So a text cut just before a special token tokenizes, piece by
piece, to exactly what the whole text does, provided llama.cpp's first pass cuts there too:
the token is never part of a longer special token's match (it is not inside one, and no
special token's head or tail overlaps it) and it does not strip the spaces before it
(``LSTRIP``, which would reach into the piece before). :func:`split_markers` keeps the special
tokens of the chat template that meet those conditions; :class:`PieceCache` cuts each text
before them and keeps each piece's tokens (least recently used first out, bounded by tokens).

Only byte-level BPE and SentencePiece vocabularies are cut (their fragments are tokenized
independently; SentencePiece's space prefix follows a special token in both ways), and only
when the vocabulary adds no end-of-sequence token (that goes after the last fragment). A
self-check at preparation compares both ways on texts made of the markers; any difference
turns the cache off for the model, with a log line.

Tokenizing costs ~1 µs a token here (a 30k-token conversation: 28 ms a turn, every turn);
llama-server tokenizes the whole prompt at every request.
"""

from __future__ import annotations

import logging
import re
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Generator, Iterable, Mapping

__all__ = ["LSTRIP", "PieceCache", "prepare", "prepared", "self_check_texts", "split_markers"]

log = logging.getLogger(__name__)

LSTRIP = 128
"""``LLAMA_TOKEN_ATTR_LSTRIP``: the token takes the spaces before it (llama.h)."""

Tokenize = Callable[[str, bool], list[int]]
"""The whole-text tokenizer: ``(text, add_special) -> tokens``, special tokens parsed."""

_BUDGET_TOKENS = 1 << 18
"""Tokens kept in all (4 bytes each: 1 MiB)."""

_STEP_TOKENS = 4096
"""Tokens whose attributes one step of :func:`prepare` reads (~1.2 ms: what a request that
arrives meanwhile waits at most)."""


def split_markers(specials: Mapping[str, int], template: str) -> list[str]:
    """The special tokens (``text → llama.cpp's attribute bits``, every special token of the
    vocabulary) that occur in ``template`` and that llama.cpp always cuts a text at exactly
    where they occur: none lies inside another special token, overlaps one's head or tail, or
    strips the spaces before it."""
    prefixes: set[str] = set()
    suffixes: set[str] = set()
    for text in specials:
        for end in range(1, len(text)):
            prefixes.add(text[:end])
            suffixes.add(text[end:])
    chosen = []
    for marker, attributes in specials.items():
        if len(marker) < 2 or marker not in template or attributes & LSTRIP:
            continue
        if any(marker != other and marker in other for other in specials):
            continue  # inside a longer special token, which llama.cpp matches first
        heads = (marker[:end] for end in range(1, len(marker)))
        tails = (marker[start:] for start in range(1, len(marker)))
        if any(head in suffixes for head in heads) or any(tail in prefixes for tail in tails):
            continue  # a special token ending with its head (or starting with its tail)
        chosen.append(marker)
    return sorted(chosen)


class PieceCache:
    """Tokenizes texts piece by piece, each piece cut before a marker and remembered."""

    def __init__(self, tokenize: Tokenize, markers: Iterable[str], budget: int = _BUDGET_TOKENS):
        self._tokenize = tokenize
        markers = sorted(set(markers), key=len, reverse=True)
        self.markers = markers
        """What texts are cut before."""
        self._cut = re.compile("(?=" + "|".join(map(re.escape, markers)) + ")") if markers else None
        self._pieces: OrderedDict[tuple[str, bool], array[int]] = OrderedDict()
        self._held = 0
        self._budget = budget
        self._lock = threading.Lock()
        self.hits = 0
        """Pieces found (their tokenizing saved)."""
        self.misses = 0
        """Pieces tokenized."""

    def pieces(self, text: str) -> list[str]:
        """``text`` cut before every marker (the pieces joined are the text)."""
        if self._cut is None:
            return [text] if text else []
        return [piece for piece in self._cut.split(text) if piece]

    def tokenize(self, text: str, add_special: bool) -> list[int]:
        """The tokens of ``text`` (``add_special``: BOS first when the vocabulary adds it),
        equal to the whole text's."""
        tokens: list[int] = []
        for index, piece in enumerate(self.pieces(text)):
            tokens.extend(self._piece(piece, add_special and index == 0))
        if not tokens and add_special:
            return self._tokenize(text, add_special)  # BOS alone, as the whole text gives
        return tokens

    def _piece(self, piece: str, add_special: bool) -> array[int]:
        key = (piece, add_special)
        with self._lock:
            found = self._pieces.get(key)
            if found is not None:
                self._pieces.move_to_end(key)
                self.hits += 1
                return found
        made = array("i", self._tokenize(piece, add_special))
        if len(made) > self._budget // 2:
            return made  # too large to keep without pushing everything else out
        with self._lock:
            self.misses += 1
            if key not in self._pieces:
                self._pieces[key] = made
                self._held += len(made)
                while self._held > self._budget:
                    _, dropped = self._pieces.popitem(last=False)
                    self._held -= len(dropped)
        return made

    def agrees(self, samples: Iterable[str]) -> str | None:
        """None when every sample tokenizes piece by piece as it does whole (both with and
        without BOS); else the first that does not."""
        for text in samples:
            for add_special in (True, False):
                if self.tokenize(text, add_special) != self._tokenize(text, add_special):
                    return text
        return None


def self_check_texts(markers: list[str]) -> list[str]:
    """Texts that put every marker where chats put them and where they do not: at the start,
    after and before spaces and newlines, twice in a row, inside words, at the end."""
    words = ["Hello", " there", "\n", "  two spaces", "\n\nlines\n", "x", " ", "é ü 中文", "42"]
    texts = []
    for index, marker in enumerate(markers):
        other = markers[(index + 1) % len(markers)]
        texts += [
            marker + "user\nHello" + other + "\n" + marker + "assistant\n",
            "system text " + marker + " spaced " + marker + marker + "end",
            "".join(w + marker for w in words) + " tail",
            "a" + marker + "b" + other + " c " + other,
            marker,
            " " + marker + " ",
        ]
    return texts


_SPECIAL = 8 | 16 | 1
"""``CONTROL | USER_DEFINED | UNKNOWN``: what llama.cpp cuts a text at (``parse_special``)."""


def prepare(
    vocab: object, template: str, tokenize: Tokenize
) -> Generator[None, None, PieceCache | None]:
    """Make a cache for the llama.cpp vocabulary ``vocab`` in steps: each ``next()`` reads
    ``_STEP_TOKENS`` tokens' attributes (~1 ms) and the last step runs the self-check; the
    generator's return value is the cache, None where it cannot be exact. Its markers come from
    ``template`` (the chat templates the model renders with).

    In steps because reading every token's attributes takes ~0.3 µs a token (80 ms for
    Gemma 3's 262k tokens): on a thread beside a model's first request it took a core from the
    prefill (2 threads on 2 cores: that prompt 11 % slower than the next), so the engine takes
    a step at a time while no request waits (:meth:`.model.LlamaModel.prepare_pieces_step`)."""
    import llama_cpp

    kind = llama_cpp.llama_vocab_type(vocab)
    if kind not in (llama_cpp.LLAMA_VOCAB_TYPE_SPM, llama_cpp.LLAMA_VOCAB_TYPE_BPE):
        return None
    if llama_cpp.llama_vocab_get_add_eos(vocab):
        return None
    get_attr, get_text = llama_cpp.llama_vocab_get_attr, llama_cpp.llama_vocab_get_text
    specials: dict[str, int] = {}
    count = int(llama_cpp.llama_vocab_n_tokens(vocab))
    for first in range(0, count, _STEP_TOKENS):
        for token in range(first, min(first + _STEP_TOKENS, count)):
            attributes = int(get_attr(vocab, token))
            if attributes & _SPECIAL:
                text = (get_text(vocab, token) or b"").decode("utf-8", errors="replace")
                specials[text] = specials.get(text, 0) | attributes
        yield
    cache = PieceCache(tokenize, split_markers(specials, template))
    # every special token the templates write, markers or not, in the texts checked
    written = sorted(m for m in specials if len(m) >= 2 and m in template)
    differs = cache.agrees(self_check_texts(written)) if written else None
    if differs is not None:
        log.warning(
            "prompt pieces are not cached for this model: %r tokenizes differently in pieces",
            differs,
        )
        return None
    return PieceCache(tokenize, cache.markers)  # without the check's pieces


def prepared(vocab: object, template: str, tokenize: Tokenize) -> PieceCache | None:
    """:func:`prepare` all at once."""
    steps = prepare(vocab, template, tokenize)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
