"""Prompt log probabilities, read from the prefill that evaluates the prompt.

A scoring request (an evaluation harness's ``echo`` + ``logprobs`` + ``max_tokens: 0``) wants
the log probability of every prompt token given the ones before it. llama.cpp computes the
logits of every batch position that asks for them, so the prefill itself asks for all of its
positions: the logits at position ``p`` give the probability of prompt token ``p + 1``, read
after the step that decoded it, and nothing is evaluated twice. Such a prompt is evaluated
whole (no cached prefix reused: cached cells have no logits left).
"""

from __future__ import annotations

from collections.abc import Callable

from ..runner.protocol import TokenLogprob

__all__ = ["PromptScore"]

Entry = Callable[[int, int], TokenLogprob]
"""``(batch index, token)`` → that token's log probability at that batch position."""


class PromptScore:
    """One prompt's log probabilities, collected step by step as its prefill goes."""

    def __init__(self, prompt: list[int], first: TokenLogprob) -> None:
        self.prompt = prompt
        self.entries: list[TokenLogprob] = [first]
        """One per prompt token: the first has nothing before it (its ``logprob`` is 0.0 and
        means nothing; the APIs report null), the others are log P(token | before)."""
        self._marked: list[tuple[int, int]] = []

    def mark(self, position: int, batch_index: int) -> None:
        """Prompt ``position`` is in this step's batch at ``batch_index`` (with logits)."""
        self._marked.append((position, batch_index))

    def unmark(self) -> None:
        """Forget the marks of a batch that is filled again."""
        self._marked = []

    def collect(self, entry: Entry) -> None:
        """After the step's decode: read the marked positions' logits (each predicts the
        next prompt token), in prompt order."""
        for position, index in self._marked:
            following = position + 1
            if following < len(self.prompt):
                self.entries.append(entry(index, self.prompt[following]))
        self._marked = []
