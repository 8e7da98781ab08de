"""A reasoning budget, ended as llama-server ends it: when a model has reasoned for its budget
of tokens, the reasoning block's close tag is inserted (its tokens are forced in place of
sampled ones) and the model goes on with the answer.

:func:`grammar_after` makes a grammar (a format, a forced call) wait for the reasoning to end:
lazy, triggered by the close tag, constraining the answer after it.

The budget follows the output's text: reasoning starts where the prompt opened the block (a
template that writes ``<think>`` itself) or where the output opens it first thing; it ends at
the close tag, written by the model or inserted here. Output that begins with anything else
has no reasoning block, and the budget has nothing to do.
"""

from __future__ import annotations

import json
import re

__all__ = ["ReasoningBudget", "grammar_after"]

# Enough of the recent output to find a tag that spans several tokens.
_WINDOW = 256


class ReasoningBudget:
    """One request's reasoning budget."""

    def __init__(
        self, open_tag: str, close_tag: str, budget: int, close_tokens: list[int], inside: bool
    ) -> None:
        self.open_tag = open_tag
        self.close_tag = close_tag
        self.budget = max(budget, 0)
        self.close_tokens = close_tokens
        self._state = "inside" if inside else "before"
        self._recent = ""
        self.spent = 0
        """Tokens generated inside the reasoning block so far."""
        self.forced: list[int] = list(close_tokens) if inside and self.budget == 0 else []
        """Tokens to put in place of the next samples (the close tag, once due)."""
        self.exhausted = bool(self.forced)
        """Whether the budget ran out (and the close tag was inserted)."""
        if self.forced:
            self._state = "done"

    def next_forced(self) -> int | None:
        """The token to force instead of sampling, if one is due."""
        return self.forced.pop(0) if self.forced else None

    def abandon(self) -> None:
        """The sampler refused a forced token (a grammar): sample normally from here."""
        self.forced = []

    def take(self, piece: bytes) -> None:
        """Account one generated token whose bytes are ``piece``."""
        if self._state == "done":
            return
        self._recent = (self._recent + piece.decode("utf-8", errors="ignore"))[-_WINDOW:]
        if self._state == "before":
            head = self._recent.lstrip()
            if head.startswith(self.open_tag):
                self._state, self._recent = "inside", head[len(self.open_tag) :]
            elif head and not self.open_tag.startswith(head):
                self._state = "done"  # the output starts with the answer: no reasoning
            return
        if self.close_tag in self._recent:
            self._state = "done"
            return
        self.spent += 1
        if self.spent >= self.budget:
            self._state = "done"
            self.exhausted = True
            self.forced = list(self.close_tokens)


def grammar_after(grammar: str, close_tag: str) -> tuple[str, str]:
    """(grammar, trigger) constraining what follows the reasoning block: a lazy grammar that
    ``close_tag`` triggers. llama.cpp feeds the trigger's captured text (the tag itself) to
    the grammar, so the grammar begins with the tag, a little whitespace, then ``grammar``'s
    own root (renamed)."""
    body = re.sub(r"^root\s*::=", "reasoned-answer ::=", grammar, count=1, flags=re.MULTILINE)
    head = "root ::= " + json.dumps(close_tag) + r" [ \t\n]{0,8} reasoned-answer" + "\n"
    trigger = r"^[\s\S]*?(" + re.escape(close_tag) + r")[\s\S]*"
    return head + body, trigger
