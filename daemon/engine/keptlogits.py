"""The logits of a slot's last prompt token, kept for the same prompt sent again.

A prompt whose every token is cached still costs a step: llama.cpp gives logits only for
tokens it evaluates, so llama-server (and vLLM, SGLang) evaluates the last prompt token once
more for the first sample, a step that reads every weight: on a CPU that step is most of the
time to first token of a repeated message. The logits of a prompt are the model's function of
its tokens and the LoRA adapter set alone, so a slot keeps the row its first token was sampled
from, and a request whose prompt is exactly that prompt, admitted to a slot whose cells still
hold it, samples from the kept row without a step: "regenerate" (the same messages, sampled
again), a retried request, the same question in a new chat. Its answer starts from the very
logits the first request's did, so a greedy repeat begins as the first one did.

The row is copied once the step's events are handed over (off the first token's way), one row
of ``n_vocab`` floats per slot (196 KiB for a 49k vocabulary). Prompts with images are not
kept (their pseudo-tokens name positions, not pictures).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .sampling import logits_at

__all__ = ["KeptLogits"]


class KeptLogits:
    """One slot's kept row: the logits that followed a prompt, under an adapter set."""

    def __init__(self) -> None:
        self._row: np.ndarray | None = None
        self._prompt: Sequence[int] = ()
        """The prompt the row follows (empty: no row kept)."""
        self._adapters = ""
        self._pending: tuple[int, Sequence[int], str] | None = None
        """(batch index, prompt, adapters) of a row to copy once the step's events are out."""

    def note(self, batch_index: int, prompt: Sequence[int], adapters: str) -> None:
        """The first token of ``prompt`` was just sampled from the batch's ``batch_index``:
        keep that row once the step is over (:meth:`take`)."""
        self._pending = (batch_index, prompt, adapters)

    def take(self, ctx: Any, n_vocab: int) -> None:
        """Copy the noted row out of llama.cpp's logits (before the next decode replaces
        them)."""
        if self._pending is None:
            return
        batch_index, prompt, adapters = self._pending
        self._pending = None
        if self._row is None or self._row.shape[0] != n_vocab:
            self._row = np.empty(n_vocab, dtype=np.float32)
        np.copyto(self._row, logits_at(ctx, batch_index, n_vocab))
        self._prompt, self._adapters = prompt, adapters

    def forget(self) -> None:
        """Drop the kept row's claim (its cells are gone, or were never its prompt's)."""
        self._prompt, self._pending = (), None

    def row_for(
        self, prompt: Sequence[int], cache: Sequence[int], adapters: str
    ) -> np.ndarray | None:
        """The kept row when it follows exactly ``prompt`` under ``adapters`` and the slot's
        ``cache`` still holds every token of it (so decoding goes on from its cells); else
        None."""
        kept = self._prompt
        count = len(prompt)
        if (
            not count
            or count != len(kept)
            or adapters != self._adapters
            or len(cache) < count
            or self._row is None
        ):
            return None
        if kept != prompt or cache[:count] != prompt:
            return None
        return self._row
