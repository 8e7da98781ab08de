"""Speculative decoding's pieces that need no llama.cpp: drafting and the decision to draft.

* :class:`NgramDrafter` proposes the tokens that followed the most recent earlier occurrence
  of a slot's last few tokens, in its own prompt and output (prompt-lookup decoding). It costs
  no second model and shines where answers quote their input: edits, code, RAG, summaries.
* :class:`BatchCost` is the cost of a decode of n tokens relative to one token, and
  :class:`DecodeCosts` learns it from the engine's decodes.
* :class:`DraftPolicy` keeps a slot's running estimate of how often a drafted token is
  accepted, and picks the draft length that maximises expected tokens per unit of step time
  (zero when drafting does not pay, which on a CPU is most free text).

The engine adds a slot's pending token plus its draft to the step's batch with logits on, and
the slot's own sampler samples each position in order, accepting while the sample equals the
draft: the output is exactly what plain decoding gives, for any sampler.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["BatchCost", "DecodeCosts", "DraftPolicy", "Drafter", "NgramDrafter"]


class Drafter(Protocol):
    """What the engine asks of a slot's drafter: n-gram lookup, or the draft model's share
    (:class:`~localllm.daemon.speculation.draft_model.DraftModelDrafter`)."""

    def append(self, token: int) -> None:
        """A token was generated (the sequence grew by one)."""

    def propose(self, limit: int) -> list[int]:
        """Up to ``limit`` draft tokens to follow the slot's pending token."""
        ...


class NgramDrafter:
    """Prompt-lookup drafting over one sequence of tokens, updated as tokens are added.

    For every n-gram size up to ``max_ngram`` an index maps each n-gram to the position just
    after its latest occurrence; before the index learns the n-gram that now ends the
    sequence, its previous occurrence is remembered, and that is where a draft is copied from.

    The sequence is indexed when a draft is first asked for, not as it is given: a request's
    drafter is made as the engine admits it and learns the first token before that token
    goes out, and indexing the prompt there (a few microseconds a token) would delay the
    first token, which no draft can help.
    """

    def __init__(self, tokens: list[int], max_ngram: int = 3, min_ngram: int = 2) -> None:
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.tokens: list[int] = []
        self._latest: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_ngram + 1)]
        self._previous: list[int | None] = [None] * (max_ngram + 1)
        self._unindexed: list[int] | None = list(tokens)

    def extend(self, tokens: list[int]) -> None:
        """Add tokens to the end of the sequence."""
        for token in tokens:
            self.append(token)

    def append(self, token: int) -> None:
        """Add one token to the end of the sequence."""
        if self._unindexed is not None:
            self._unindexed.append(token)
        else:
            self._add(token)

    def _index_prompt(self) -> None:
        tokens, self._unindexed = self._unindexed or [], None
        for token in tokens:
            self._add(token)

    def _add(self, token: int) -> None:
        self.tokens.append(token)
        end = len(self.tokens)
        for n in range(1, self.max_ngram + 1):
            if end < n:
                self._previous[n] = None
                continue
            gram = tuple(self.tokens[end - n : end])
            index = self._latest[n]
            self._previous[n] = index.get(gram)
            index[gram] = end

    def propose(self, limit: int) -> list[int]:
        """Up to ``limit`` tokens that followed the longest n-gram match, or none."""
        if limit <= 0:
            return []
        if self._unindexed is not None:
            self._index_prompt()
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            start = self._previous[n]
            if start is not None:
                draft = self.tokens[start : start + limit]
                if draft:
                    return draft
        return []


@dataclass
class BatchCost:
    """Seconds of a decode of n tokens, relative to one token, measured on this machine."""

    relative: dict[int, float] = field(default_factory=lambda: {1: 1.0})
    """Measured points: tokens in the batch → cost relative to a batch of one."""

    def __post_init__(self) -> None:
        # Asked many times a step (every draft length of every drafting slot): sorted once.
        self._points = sorted(self.relative.items())

    def __call__(self, tokens: int) -> float:
        """The cost of ``tokens`` (interpolated between measured points, linear beyond)."""
        points = self._points
        if tokens <= points[0][0]:
            return points[0][1]
        for (n0, c0), (n1, c1) in itertools.pairwise(points):
            if tokens <= n1:
                return c0 + (c1 - c0) * (tokens - n0) / (n1 - n0)
        if len(points) == 1:
            return points[0][1] * tokens
        (n0, c0), (n1, c1) = points[-2], points[-1]
        return c1 + (c1 - c0) / (n1 - n0) * (tokens - n1)


class DecodeCosts:
    """Seconds of a decode of n tokens, learnt from the engine's own decodes.

    Seeded by a measurement when the runner starts and updated by every decode the engine
    runs (keyed by the tokens in its batch), so the curve follows this machine as it is now:
    a curve measured once, on a machine that was busy for a moment, could forbid drafting
    (or allow it where it loses) for the runner's whole life. An observation moves the
    estimate by ``weight``, and by at most a factor of two, so one stalled decode cannot
    swing it.
    """

    def __init__(self, weight: float = 0.1, largest: int = 64) -> None:
        self.weight = weight
        self.largest = largest
        """Batches above this many tokens (prefill chunks) are not tracked."""
        self.seconds: dict[int, float] = {}
        """Tokens in a batch → the estimate of its decode seconds."""
        self._curve: BatchCost | None = None

    def observe(self, tokens: int, seconds: float) -> None:
        """One decode of ``tokens`` tokens took ``seconds``."""
        if not 1 <= tokens <= self.largest or seconds <= 0:
            return
        old = self.seconds.get(tokens)
        if old is None:
            self.seconds[tokens] = seconds
        else:
            seen = min(max(seconds, old / 2), old * 2)
            self.seconds[tokens] = old + self.weight * (seen - old)
        self._curve = None

    @property
    def ready(self) -> bool:
        """Whether the one-token cost is known (the curve is relative to it)."""
        return 1 in self.seconds

    def curve(self) -> BatchCost:
        """The cost of n tokens relative to one; linear until the one-token cost is known,
        which never makes drafting look worthwhile.

        Noise must not make more tokens look cheaper than fewer: n tokens cost at most what
        any larger batch was seen to cost (and at least one token's cost). Erring that way
        is optimistic, which corrects itself (drafts get verified, their decodes observed);
        a pessimistic estimate would stop the drafting that could correct it.
        """
        if self._curve is None:
            base = self.seconds.get(1)
            if not base:
                return BatchCost()
            relative, lowest = {}, float("inf")
            for tokens in sorted(self.seconds, reverse=True):
                lowest = min(lowest, self.seconds[tokens])
                relative[tokens] = max(lowest / base, 1.0)
            self._curve = BatchCost(dict(sorted(relative.items())))
        return self._curve


@dataclass
class DraftPolicy:
    """One slot's drafting statistics and decisions."""

    max_draft: int
    """Most drafted tokens per step (the request's ``num_draft``)."""
    acceptance: float = 0.5
    """Running estimate of the chance that a drafted token is accepted."""
    drafted: int = 0
    """Tokens drafted for verification so far."""
    accepted: int = 0
    """Drafted tokens the sampler accepted so far."""
    unverified: int = 0
    """Steps in a row with a proposal the cost curve said not to verify."""

    # How fast the estimate follows recent outcomes.
    _WEIGHT = 0.15
    # Probes (see explore): after this many unverified proposals in a row, while the
    # acceptance estimate is at least this, verify this many drafted tokens anyway.
    PROBE_EVERY = 16
    PROBE_ACCEPTANCE = 0.6
    PROBE_DRAFT = 4

    @property
    def best_case(self) -> DraftPolicy:
        """This policy if every drafted token were accepted: drafting can pay at all only
        where the best case's :meth:`length` is above 0."""
        return DraftPolicy(max_draft=self.max_draft, acceptance=1.0)

    def explore(self, proposal: int) -> int:
        """The draft length of a probe, or 0: decode costs are learnt only from decodes that
        hold drafts, so a cost curve measured too high (on a machine busy for a moment)
        would never be corrected if the policy never drafted. Every :attr:`PROBE_EVERY`
        steps with a proposal left unverified, while the acceptance estimate says drafts
        would mostly be accepted (so a probe costs little), a few tokens are verified."""
        if proposal <= 0:
            return 0
        self.unverified += 1
        if self.unverified < self.PROBE_EVERY or self.acceptance < self.PROBE_ACCEPTANCE:
            return 0
        self.unverified = 0
        return min(proposal, self.PROBE_DRAFT)

    def learn(self, proposal: list[int], produced: list[int]) -> None:
        """Update the estimate from a proposal and the tokens really produced after it (also
        when the proposal was not verified: comparing costs nothing)."""
        for guess, actual in zip(proposal, produced, strict=False):
            hit = 1.0 if guess == actual else 0.0
            self.acceptance += self._WEIGHT * (hit - self.acceptance)
            if not hit:
                break

    def length(
        self,
        proposal: int,
        batch_tokens: int,
        batch_outputs: float,
        cost: BatchCost,
        draft_cost: float = 0.0,
    ) -> int:
        """How many of ``proposal`` drafted tokens to verify in a step that already holds
        ``batch_tokens`` tokens producing ``batch_outputs`` tokens: the k maximising
        expected outputs per unit of step time (0 when nothing beats plain decoding).
        ``draft_cost`` is the time of drafting one token, relative to a one-token decode of
        the target (0 for n-gram lookup; the draft model's measured cost otherwise)."""
        best_k, best_rate = 0, batch_outputs / cost(max(batch_tokens, 1))
        expected, chance = 0.0, 1.0
        for k in range(1, min(proposal, self.max_draft) + 1):
            chance *= self.acceptance
            expected += chance
            rate = (batch_outputs + expected) / (cost(batch_tokens + k) + k * draft_cost)
            if rate > best_rate * 1.05:  # a margin: the estimates are noisy
                best_k, best_rate = k, rate
        return best_k
