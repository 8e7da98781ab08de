"""Speculative decoding's decisions for the engine: which decoding slots draft in a step, how
many tokens, and with what (n-gram lookup in the request's own tokens, or the draft model for
all drafting slots in one batched decode per draft position).

Drafts pay only where verifying k tokens costs less than k plain steps; the cost of a batch of
n tokens is learnt from the engine's own decodes (seeded by a measurement on a scratch sequence
when the runner starts), and each slot's :class:`.speculative.DraftPolicy` weighs it against
the acceptance it has seen. Everything here runs on the engine thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence

from ..engine.model import LlamaModel
from ..engine.slots import Slot, SlotState
from ..kv.tiers import PrefixTiers
from .draft_model import DraftModel, DraftModelDrafter
from .policy import BatchCost, DecodeCosts, Drafter, NgramDrafter

__all__ = ["Speculation"]

log = logging.getLogger("localllm.runner.engine")

# Draft lengths whose decode cost is measured (the rest is interpolated).
_COST_POINTS = (1, 2, 4, 8)
# What an exhausted measurement gives back (see Speculation.measure_piece).
_DONE = object()
# A slot whose policy keeps the draft model idle still drafts one token this often, so that
# its acceptance estimate (learnt only from drafts) can recover.
_PROBE_EVERY = 16


class Speculation:
    """The engine's speculative decoding (``num_draft`` 0 and no draft model: none)."""

    def __init__(
        self,
        model: LlamaModel,
        slots: Sequence[Slot],
        tiers: PrefixTiers,
        num_draft: int = 0,
        draft: DraftModel | None = None,
    ) -> None:
        self.model = model
        self.slots = slots
        self.tiers = tiers
        self.num_draft = num_draft
        """Default most draft tokens per step for speculation (0: off)."""
        self.draft = draft
        """The draft model drafting for every speculating slot (None: n-gram lookup)."""
        self.draft_cost: float | None = None
        """Drafting one token's cost relative to a one-token target decode, when fixed (for
        tests and benchmarks); None: measured from the draft model's decodes."""
        self.fixed_cost: BatchCost | None = None
        """A fixed decode-cost curve (for tests); None: the one learnt in :attr:`costs`."""
        self.costs = DecodeCosts()
        """The decode cost of n tokens, learnt from the engine's decodes."""
        self._measured = False
        self._pieces: Iterator[None] | None = None
        self.interrupted = 0
        """Measuring decodes stopped because a request arrived (each is measured again)."""

    def measure(self) -> None:
        """Measure what drafting costs now, all at once (see :meth:`measure_piece`)."""
        while self.measure_piece():
            pass

    def measure_piece(self) -> bool:
        """One decode of the measurement of what drafting costs; False once it is done.

        The engine takes it a piece at a time while no request waits, rather than in the
        middle of the first request that would draft, nor in front of the first request of a
        model just loaded: that one waits for one decode, not for all of them (on a busy
        machine the whole measurement held a cold model's first token for seconds)."""
        if self._pieces is None:
            self._pieces = self._measure_pieces()
        return next(self._pieces, _DONE) is not _DONE

    def _measure_pieces(self) -> Iterator[None]:
        if self.num_draft <= 0:
            return
        if self.fixed_cost is None and not self._measured:
            yield from self._cost_pieces(self.model.decode_unless_interrupted)
        if self.draft is not None:
            while not self.draft.measure():
                yield None  # stopped by a request: again at the next idle moment
            yield None

    def plan(self, decoding: list[Slot], prefill_tokens: int) -> int:
        """Give each decoding slot a draft as long as the policy says it pays; returns the
        draft tokens planned."""
        capacity = self.model.batch.capacity - len(decoding) - prefill_tokens // 2
        tokens, outputs = len(decoding) + prefill_tokens, float(len(decoding))
        planned = 0
        # With a KV stream per slot llama.cpp computes a batch in one pass per run of
        # consecutive sequences holding equally many tokens: a draft in a batch of several
        # sequences costs a pass of its own (eight drafting streams made a step nine passes).
        # There drafts go only into batches of one sequence.
        may_draft = self.model.unified_kv or (len(decoding) == 1 and prefill_tokens == 0)
        if self.draft is not None:
            if may_draft:
                self._draft_with_model(decoding, capacity, tokens, outputs)
            else:
                for slot in decoding:
                    if isinstance(slot.drafter, DraftModelDrafter):
                        slot.drafter.drafted = []
        for slot in decoding:
            job, drafter, policy = slot.job, slot.drafter, slot.policy
            slot.proposal = []
            if job is None or drafter is None or policy is None:
                continue
            limit = job.options.num_predict if job.options.num_predict > 0 else 1 << 30
            room = min(
                policy.max_draft,
                self.model.n_ctx_per_slot - len(slot.cache) - 3,  # never shift mid-draft
                limit - slot.generated - 1,
                capacity - planned,
            )
            slot.proposal = drafter.propose(policy.max_draft)
            if not may_draft or room <= 0 or not slot.proposal:
                continue  # an unverified proposal still teaches the policy
            proposal = min(room, len(slot.proposal))
            k = policy.length(proposal, tokens, outputs, self.batch_cost())
            if k == 0:
                k = policy.explore(proposal)
            else:
                policy.unverified = 0
            if k == 0:
                continue
            slot.draft = slot.proposal[:k]
            slot.state = SlotState.SPECULATING
            planned += k
            tokens += k
            outputs += sum(policy.acceptance**i for i in range(1, k + 1))
        return planned

    def drafter(self, text: list[int], images: bool) -> Drafter:
        """A new request's drafter: its share of the draft model, or n-gram lookup over the
        prompt's text tokens. A request with images drafts by n-gram: the draft model has no
        projector, so it cannot follow a sequence that holds image embeddings."""
        if self.draft is not None and not images:
            return DraftModelDrafter(self.draft)
        return NgramDrafter(text)

    def _draft_cost(self) -> float:
        """Drafting one token with the draft model, relative to a one-token target decode."""
        if self.draft_cost is not None:
            return self.draft_cost
        seconds = self.draft.seconds_per_token if self.draft is not None else None
        one_token = self.costs.seconds.get(1)
        if seconds is None or not one_token:
            return 0.0  # unknown until the first draft is measured: try it
        return seconds / one_token

    def _draft_with_model(
        self, decoding: list[Slot], capacity: int, tokens: int, outputs: float
    ) -> None:
        """Before the step's drafts are planned: run the draft model for every slot whose
        policy says drafting pays counting the draft model's own time (one batched decode
        per draft position for all of them), and hand each its draft."""
        assert self.draft is not None
        draft_cost = self._draft_cost()
        wants: list[tuple[int, list[int], int]] = []
        probing: list[DraftModelDrafter] = []
        planned = 0
        for slot in decoding:
            job, drafter, policy = slot.job, slot.drafter, slot.policy
            if job is None or policy is None or not isinstance(drafter, DraftModelDrafter):
                continue
            drafter.drafted = []
            limit = job.options.num_predict if job.options.num_predict > 0 else 1 << 30
            room = min(
                policy.max_draft,
                self.model.n_ctx_per_slot - len(slot.cache) - 3,
                limit - slot.generated - 1,
                capacity - planned,
            )
            if room <= 0:
                continue
            cost = self.batch_cost()
            k = policy.length(room, tokens, outputs, cost, draft_cost)
            if k == 0:
                drafter.skipped += 1
                # A probe lets the acceptance estimate recover; not where even drafts that
                # are always accepted would lose (a draft model nearly as slow as the target).
                # Each probe makes the draft model catch up on every token since the last
                # one, so probes that keep failing come ever less often.
                # Each probe also stays within a small share of the request's time.
                if (
                    drafter.skipped < _PROBE_EVERY << drafter.misses
                    or not policy.best_case.length(room, tokens, outputs, cost, draft_cost)
                    or not drafter.may_probe(
                        self.draft.catch_up_cost(slot.seq_id, len(slot.cache) + 1),
                        time.perf_counter(),
                    )
                ):
                    continue
                drafter.probe(slot.accepted)
                probing.append(drafter)
                k = 1
            drafter.skipped = 0
            wants.append((slot.seq_id, [*slot.cache, slot.pending], k))  # type: ignore[list-item]
            planned += k
            tokens += k
            outputs += sum(policy.acceptance**i for i in range(1, k + 1))
        started = time.perf_counter()
        drafted_by_seq = self.draft.draft(wants)
        if probing:
            # Charged whole to each probing slot: a bound, never an underestimate.
            spent = time.perf_counter() - started
            for drafter in probing:
                drafter.probe_seconds += spent
        for seq_id, drafted in drafted_by_seq.items():
            drafter = self.slots[seq_id].drafter
            if isinstance(drafter, DraftModelDrafter):
                drafter.drafted = drafted

    def _scratch(self) -> tuple[int, int] | None:
        """Where to measure decodes: a sequence and the first free position in it. The
        unified cache's scratch sequence, else a free slot, after the prefix it caches (the
        measurement's cells are dropped from there: the prefix stays for the next request of
        that conversation, as with one slot and no RAM tier it had nowhere else to go); a
        slot whose context has no room left behind its prefix is emptied first (its cells go
        to the prefix cache). None when every slot is busy."""
        model = self.model
        if model.scratch_seq is not None:
            return model.scratch_seq, 0
        free = [slot for slot in self.slots if not slot.busy]
        if not free:
            return None
        slot = min(free, key=lambda s: (len(s.cache) > 0, s.last_used))
        start = model.seq_pos_max(slot.seq_id) + 1
        if start > 0 and start + max(_COST_POINTS) > model.n_ctx_per_slot:
            self.tiers.evict(slot)
            start = 0
        return slot.seq_id, max(start, 0)

    def batch_cost(self) -> BatchCost:
        """Decode cost of n tokens relative to one: learnt from the engine's decodes, seeded
        by a measurement on a scratch sequence (until then linear: drafting never pays)."""
        if self.fixed_cost is not None:
            return self.fixed_cost
        if not self._measured:
            self._measure_costs()
        return self.costs.curve()

    def _measure_costs(self) -> None:
        """Decode 1, 2, 4 and 8 tokens on a scratch sequence, twice each after a warm-up,
        and seed the learnt costs with the fastest of each (at once, inside a step)."""
        for _ in self._cost_pieces(self.model.decode):
            pass

    def _cost_pieces(self, decode: Callable[[], int]) -> Iterator[None]:
        """:meth:`_measure_costs` a decode at a time (the scratch sequence is chosen again
        for each: requests may have taken slots in between). A decode that ``decode`` stops
        (status 2: a request arrived while idle) is measured again at the next piece."""
        if self._scratch() is None:
            return
        self._measured = True
        model, batch = self.model, self.model.batch
        points = [n for n in _COST_POINTS if n <= batch.capacity]
        seconds: dict[int, float] = {}
        todo = [1, *points, *points]  # the first decode warms up
        while todo:
            place = self._scratch()
            if place is None:
                break
            scratch, start = place
            n = todo[0]
            batch.clear()
            for position in range(start, start + n):
                batch.add(max(model.bos_id, 0), position, scratch, True)
            started = time.perf_counter()
            status = decode()
            elapsed = time.perf_counter() - started
            model.seq_remove(scratch, start)
            batch.clear()
            if status == 2:
                self.interrupted += 1
            elif status != 0:
                break
            else:
                todo.pop(0)
                seconds[n] = min(seconds.get(n, elapsed), elapsed)
            yield None
        batch.clear()
        for n, elapsed in seconds.items():
            self.costs.observe(n, elapsed)
        log.info("decode cost of n tokens relative to 1: %s", self.costs.curve().relative)

    def drafter_name(self, slot: Slot) -> str:
        if self.draft is not None and isinstance(slot.drafter, DraftModelDrafter):
            return f"draft:{self.draft.name}"
        return "ngram"
