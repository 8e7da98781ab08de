"""One engine step's batch: which tokens go in (:func:`plan_batch`) and writing them into
llama.cpp's batch (:func:`fill_batch`).

A step holds one token for every slot that is generating (followed by its draft when it
speculates), then prompt chunks of slots still prefilling, oldest request first, until the
batch is full: a long prompt never stalls other streams' decoding.

A step that runs a LoRA adapter set keeps a reproducible request's arithmetic what it would
be alone: an adapter's float weights are multiplied by one CPU kernel for a ubatch of one
token and by another for several (see :func:`.slots.fresh_tokens`), so such a sequence must
not share its ubatch with its neighbours (llama.cpp computes sequences of consecutive ids in
one pass), and no prompt has a single token split off by the batch's budget. Requests that
sample without a seed of their own stay batched together: their answers are draws, as good
beside neighbours as alone, and a pass per sequence would cost them a third of the decode
rate (``benchmarks/lora.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..speculation.drafting import Speculation
from .model import Batch
from .slots import Slot, SlotState

__all__ = ["BatchPlan", "fill_batch", "plan_batch", "reproducible", "ubatch_order"]

_Entry = tuple[Slot, int]
"""A slot and the prompt tokens it puts in the batch (-1: it generates)."""


@dataclass
class BatchPlan:
    """What one step's batch holds: every generating slot's pending token (followed by its
    draft, when it speculates), then prompt chunks of slots still prefilling."""

    decoding: list[Slot]
    """Slots generating, in batch order."""
    prefill: list[tuple[Slot, int]]
    """Slots prefilling and how many prompt tokens each puts in."""

    @property
    def empty(self) -> bool:
        """True when there is nothing to decode."""
        return not self.decoding and not any(count for _, count in self.prefill)


def plan_batch(
    slots: Sequence[Slot],
    batch: Batch,
    speculation: Speculation,
    prefill_budget: int,
    drafting: bool,
    adapted: bool = False,
) -> BatchPlan:
    """Choose this step's tokens: pending tokens (and drafts), then prompt chunks, oldest
    request first, within the batch size.

    ``adapted`` (the step runs a LoRA adapter set): a prompt chunk that is not the rest of
    its prompt holds two tokens at least and leaves two at least, while anything else is in
    the batch (a lone token alone would be multiplied by another kernel than in a cold
    prefill; when nothing else can go in, it goes in all the same: the engine never stalls).
    """
    decoding = [slot for slot in slots if slot.decoding]
    for slot in decoding:
        slot.draft = []
        slot.state = SlotState.DECODING
    prefilling = sorted(
        (slot for slot in slots if slot.state is SlotState.PREFILLING),
        key=lambda slot: slot.job.arrived,  # type: ignore[union-attr]
    )
    capacity = batch.capacity - len(decoding)
    if drafting:
        wanted = sum(slot.remaining_prompt for slot in prefilling)
        capacity -= speculation.plan(decoding, min(wanted, prefill_budget, capacity))
    budget = min(capacity, prefill_budget)
    prefill = []
    for slot in prefilling:
        count = max(min(slot.remaining_prompt, budget), 0)
        if slot.job is not None and slot.job.images:
            count = min(count, slot.job.text_run(len(slot.cache)))
        if adapted and 0 < count < slot.remaining_prompt:
            whole = min(count, slot.remaining_prompt - 2)
            if whole >= 2:
                count = whole
            elif decoding or any(taken for _, taken in prefill):
                count = 0  # the next step's budget takes it with more of its prompt
        prefill.append((slot, count))
        budget -= count
    return BatchPlan(decoding=decoding, prefill=prefill)


def fill_batch(plan: BatchPlan, slots: Sequence[Slot], batch: Batch, apart: bool = False) -> None:
    """Write the plan into llama.cpp's batch, noting where each slot's logits will be.

    ``apart`` (a step under a LoRA adapter set): each slot whose answer is reproducible
    (:func:`reproducible`) is computed in a ubatch of its own, as it would be alone (see
    :func:`ubatch_order`). A unified cache puts the whole batch in one ubatch whatever the
    order: there only a KV stream per slot keeps answers apart.
    """
    batch.clear()
    for slot in slots:
        slot.batch_index, slot.chunk, slot.draft_indices = -1, 0, []
        if slot.job is not None and slot.job.score is not None:
            slot.job.score.unmark()  # a batch refilled after a failed decode
    entries = [(slot, -1) for slot in plan.decoding] + [(s, n) for s, n in plan.prefill if n]
    if apart:
        entries = ubatch_order(entries, reproducible)
    for slot, count in entries:
        if count < 0:
            _add_decoding(slot, batch)
        else:
            _add_prompt(slot, count, batch)


def reproducible(slot: Slot) -> bool:
    """Whether the slot's request gives one answer only (greedy, or sampled with a seed of
    its own): then what runs beside it must not change it."""
    job = slot.job
    if job is None:
        return False
    options = job.options
    return options.temperature <= 0 or options.top_k == 1 or options.seed >= 0


def ubatch_order(entries: list[_Entry], alone: Callable[[Slot], bool]) -> list[_Entry]:
    """``entries`` (slot, tokens) in the batch order that makes llama.cpp compute each slot
    for which ``alone`` holds in a ubatch of its own, the others together while their ids
    are consecutive.

    llama.cpp's split for a KV stream per sequence builds a ubatch from the first unused
    token on, taking each later sequence whose id is one more than the last taken. So runs
    of consecutive ids go in from the highest run down, each run in increasing order, and a
    slot that must be alone is a run of its own.
    """
    runs: list[list[_Entry]] = []
    for entry in sorted(entries, key=lambda entry: entry[0].seq_id):
        last = runs[-1][-1][0] if runs else None
        if (
            last is not None
            and last.seq_id == entry[0].seq_id - 1
            and not alone(last)
            and not alone(entry[0])
        ):
            runs[-1].append(entry)
        else:
            runs.append([entry])
    return [entry for run in reversed(runs) for entry in run]


def _add_decoding(slot: Slot, batch: Batch) -> None:
    """A generating slot's pending token, then its draft."""
    position = len(slot.cache)
    slot.batch_index = batch.add(slot.pending, position, slot.seq_id, True)  # type: ignore[arg-type]
    slot.draft_indices = [
        batch.add(token, position + 1 + i, slot.seq_id, True) for i, token in enumerate(slot.draft)
    ]


def _add_prompt(slot: Slot, count: int, batch: Batch) -> None:
    """The next ``count`` tokens of a prefilling slot's prompt."""
    prompt = slot.job.prompt  # type: ignore[union-attr]
    start, last = len(slot.cache), len(prompt) - 1
    score = slot.job.score  # type: ignore[union-attr]
    for position in range(start, start + count):
        wanted = position == last or score is not None
        index = batch.add(prompt[position], position, slot.seq_id, wanted)
        if score is not None:
            score.mark(position, index)
    slot.chunk = count
    if start + count == len(prompt):
        slot.batch_index = index
