"""Prefill ahead: a request waiting for a slot gets its first token before a slot frees.

With more requests than slots, the requests that wait get their first token only after a
running request ends and their own prefill has run: a burst of users behind a full set of
slots waits for the first wave's prefill *and* its whole answer. Here a waiting request's
prompt is prefilled in a sequence of its own beside the slots (``n_ahead`` extra KV
sequences), in the same steps' batches as the running requests' decoding (in steps where no
slot prefills: the requests holding slots get their first tokens first); its first token
is sampled with its own sampler chain and streamed at once. Then it is *parked*: its KV
cells are copied to host RAM (``llama_state_seq_get_data``) and the sequence serves the
next waiting prompt (from the cells it holds, a cached prefix such as a shared system
prompt; in a unified pool they are dropped instead, the slots may need the room). When a
slot frees, a parked request (its prompt is wholly cached, so the admission order puts it
first, within its bound) gets its cells back into that slot and goes on decoding from its
first token. Decoding never runs on more sequences than the
slots the user asked for: an ahead sequence only prefills.

What the request sees is what happened: its queue wait ends when its prefill begins, its
prefill and first token are timed as any request's, and the time parked between the first
token and the slot is reported apart (``parked_ms``).

Not ahead (they wait for a slot as before): prompts with images (decoded apart), scored
prompts, requests under LoRA adapters (a step runs one adapter set; see
:mod:`..lora.adapters`), and requests that would draft with a draft model (its sequences
are the slots').

Everything here runs on the engine thread.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .slots import Slot, SlotState

if TYPE_CHECKING:
    from .jobs import GenerationJob
    from .model import LlamaModel

__all__ = ["Ahead", "Parked", "move_request"]

# A slot's per-request fields: what a request takes with it from the ahead sequence to the
# parked record and from there to the slot that decodes it.
_REQUEST_FIELDS = (
    "job",
    "state",
    "sampler",
    "text",
    "pending",
    "output",
    "logprobs",
    "drafter",
    "policy",
    "proposal",
    "draft",
    "draft_indices",
    "drafted",
    "accepted",
    "reused",
    "generated",
    "admitted",
    "first_token_at",
    "first_marks",
    "parked_ms",
    "threads_min",
    "threads_max",
    "threads_why",
)


def move_request(source: Slot, destination: Slot) -> None:
    """Move the request ``source`` serves, with everything it has sampled and timed, to
    ``destination``; ``source`` is left idle (its KV cells, if any, stay its own)."""
    for name in _REQUEST_FIELDS:
        setattr(destination, name, getattr(source, name))
    source.job, source.sampler, source.text, source.pending = None, None, None, None
    source.drafter = source.policy = None
    source.output, source.logprobs, source.proposal, source.draft = [], [], [], []
    source.draft_indices = []
    source.state = SlotState.IDLE


@dataclass
class Parked:
    """A request whose first token is out, waiting for a slot to decode in."""

    holder: Slot
    """The request's fields (sampler, text, first token pending, timings), on a slot object
    that is no llama.cpp sequence (``seq_id`` -1): ending it there (a cancel, the engine
    stopping) reports what it generated as a slot would."""
    state: bytes
    """Its prompt's KV cells (``llama_state_seq_get_data``)."""
    since: float
    """When it was parked (its first token was out)."""


class Ahead:
    """The ahead sequences and the parked requests."""

    def __init__(self, model: LlamaModel, n_ahead: int) -> None:
        first = model.n_slots + (1 if model.scratch_seq is not None else 0)
        self.slots = [Slot(first + i) for i in range(n_ahead)]
        """One sequence each, after the slots' (and the scratch one)."""
        self.parked: dict[str, Parked] = {}
        """Parked requests by id (they are still in the engine's waiting queue)."""
        self.model = model
        self.prefilled = 0
        """Requests that got their first token ahead of a slot (for stats and tests)."""

    def this_step(self) -> list[Slot]:
        """The ahead sequences whose prompts go into this step: the older half of them at
        most (those begun first). All at once, every waiting reader would get a first token
        only when the last prompt is done; one a step, the last would wait a decode step per
        prompt. In halves, half of them get theirs after half the prefill, and the last one
        a single decode step later than all at once."""
        prefilling = sorted(
            (slot for slot in self.slots if slot.state is SlotState.PREFILLING),
            key=lambda slot: slot.job.arrived,  # type: ignore[union-attr]
        )
        return prefilling[: max(1, -(-len(self.slots) // 2))]

    def owns(self, slot: Slot) -> bool:
        """Whether ``slot`` is an ahead sequence."""
        return any(slot is mine for mine in self.slots)

    def holding(self, job_id: str) -> Slot | None:
        """The ahead sequence prefilling the request ``job_id``, if one is."""
        return next((s for s in self.slots if s.job is not None and s.job.id == job_id), None)

    def candidates(self, waiting: Iterable[GenerationJob], drafts_with_model: bool) -> list:
        """Waiting requests an ahead sequence could prefill now, oldest first."""
        busy = {s.job.id for s in self.slots if s.job is not None}
        return [
            job
            for job in waiting
            if job.id not in self.parked
            and job.id not in busy
            and not job.images
            and job.score is None
            and not job.options.prefill_only
            and not job.adapters.key
            and not (drafts_with_model and _max_draft(job) > 0)
        ]

    def free(self) -> list[Slot]:
        """Ahead sequences with no request."""
        return [slot for slot in self.slots if slot.job is None]

    def park(self, slot: Slot) -> None:
        """``slot`` (an ahead sequence) sampled its request's first token: keep its cells in
        RAM and free the sequence (its cells stay as a cached prefix for the next prompt)."""
        job = slot.job
        assert job is not None and slot.state is SlotState.DECODING
        holder = Slot(-1)
        state = self.model.seq_state(slot.seq_id)
        move_request(slot, holder)
        holder.state = SlotState.DECODING
        if self.model.unified_kv:
            # In one pool its cells would hold cells the slots may need (and no idle slot's
            # eviction frees them): the copy in RAM is all that is kept.
            self.model.seq_remove(slot.seq_id, 0)
            slot.cache = []
        self.parked[job.id] = Parked(holder, state, time.perf_counter())
        self.prefilled += 1

    def resume(self, job: GenerationJob, slot: Slot) -> bytes | None:
        """Give the parked request ``job`` the free ``slot``: its cells go back in and it
        decodes from its first token. Returns the cells when llama.cpp refused them (the
        request is in the slot all the same, its cache empty: the caller tries again or
        fails it), else None."""
        parked = self.parked.pop(job.id)
        restored = self.model.restore_seq_state(slot.seq_id, parked.state)
        move_request(parked.holder, slot)
        slot.parked_ms += (time.perf_counter() - parked.since) * 1000
        slot.cache, slot.shared, slot.saved = list(job.prompt) if restored else [], 0, 0
        slot.adapters = job.adapters.key
        slot.state = SlotState.DECODING
        return None if restored else parked.state

    def abandon(self, job_id: str) -> Slot | None:
        """The parked request ``job_id`` ends before it got a slot (a cancel, the engine
        stopping): its fields, to be ended as a slot's, with the time parked so far."""
        parked = self.parked.pop(job_id, None)
        if parked is None:
            return None
        parked.holder.parked_ms += (time.perf_counter() - parked.since) * 1000
        return parked.holder


def _max_draft(job: GenerationJob) -> int:
    # Any positive count may draft (the runner's own when the request sets none).
    return job.options.num_draft if job.options.num_draft >= 0 else 1
