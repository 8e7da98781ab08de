"""Slots and the choices made about them, as plain Python the engine calls.

A :class:`Slot` is one llama.cpp sequence and the request it serves, with an explicit
:class:`SlotState`. The functions here decide which free slot a new prompt gets, which other
sequence a prompt can copy its prefix from, and whether it should wait for one still being
prefilled. None of this touches llama.cpp, so it is tested on its own.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..runner.protocol import Timings

if TYPE_CHECKING:
    from ..runner.protocol import TokenLogprob
    from ..speculation.policy import Drafter, DraftPolicy
    from .jobs import GenerationJob
    from .sampling import Sampler
    from .text import TextStream

__all__ = [
    "MIN_SHARED_WAIT",
    "PrefixSource",
    "Slot",
    "SlotState",
    "busy_runs",
    "choose_slot",
    "common_prefix_length",
    "fresh_tokens",
    "prefix_source",
    "should_wait_for",
]

# Waiting for another request's prefill only pays off for a prefix of some length.
MIN_SHARED_WAIT = 16


def fresh_tokens(adapters: str) -> int:
    """Fewest prompt tokens a request evaluates itself, whatever cells it may reuse: one, for
    fresh logits; two under a LoRA adapter set (``adapters``, a key).

    llama.cpp's CPU backend multiplies float weights, as an adapter's are, with ggml's
    vec_dot for a ubatch of one token and with tinyBLAS for more, and the two add up in
    another order: the rounding differs, and a greedy answer may follow it. Quantized
    weights give the same products either way. A cold prefill evaluates its prompt's last
    tokens together, so a prompt that reuses cached cells under an adapter evaluates two,
    never one alone (each sequence is a ubatch of its own then: see ``fill_batch``).
    """
    return 2 if adapters else 1


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix (bisection over C-speed slice comparisons)."""
    low, high = 0, min(len(a), len(b))
    if a[:high] == b[:high]:
        return high
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


class SlotState(enum.Enum):
    """What a slot is doing."""

    IDLE = "idle"
    """No request; its cells (if any) are a cached prefix."""
    WAITING = "waiting"
    """Its prompt shares a prefix that an older request is prefilling right now: it waits a
    step to copy those cells instead of computing them again."""
    PREFILLING = "prefill"
    """Evaluating its prompt, a chunk per step."""
    DECODING = "decode"
    """Generating: one pending token per step."""
    SPECULATING = "speculate"
    """Generating, with draft tokens after the pending one in this step's batch."""


class Slot:
    """One llama.cpp sequence and the request it serves."""

    def __init__(self, seq_id: int) -> None:
        self.seq_id = seq_id
        """The llama.cpp sequence id."""
        self.state = SlotState.IDLE
        """What the slot is doing; the engine moves it from state to state."""
        self.cache: list[int] = []
        """Tokens whose KV cells this sequence holds, at positions 0..len-1."""
        self.shared = 0
        """Leading cells obtained from another sequence (for the KV-use estimate)."""
        self.saved = 0
        """Length of ``cache`` when it was last saved to the prefix cache (0: never)."""
        self.adapters = ""
        """The key of the LoRA adapter set ``cache``'s cells were computed with (empty: the
        base model alone): they serve prompts of that set only."""
        self.last_used = 0.0
        """When its last request ended (the least recently used idle slot goes first)."""
        # -- the current request ----------------------------------------------------------
        self.job: GenerationJob | None = None
        """The request it serves."""
        self.sampler: Sampler | None = None
        """The request's sampler chain."""
        self.text: TextStream | None = None
        """The request's detokenizer with its stop strings."""
        self.pending: int | None = None
        """Sampled token not yet evaluated (the next decode input)."""
        self.output: list[int] = []
        """Tokens generated for the current request."""
        self.logprobs: list[TokenLogprob] = []
        """Log probabilities of tokens whose text has not been emitted yet (when asked for)."""
        self.drafter: Drafter | None = None
        """Proposes draft tokens: n-gram lookup in the request's own tokens, or the draft
        model (when speculation is on)."""
        self.policy: DraftPolicy | None = None
        """Whether and how much to draft, from the acceptance seen so far."""
        self.proposal: list[int] = []
        """This step's proposal (verified or not, it teaches the policy)."""
        self.draft: list[int] = []
        """Draft tokens in this step's batch, after ``pending``."""
        self.draft_indices: list[int] = []
        """Their places in the batch."""
        self.drafted = 0
        """Draft tokens verified for the current request."""
        self.accepted = 0
        """Draft tokens accepted for the current request."""
        self.reused = 0
        """Prompt tokens that came from the cache (its own, another slot's, a saved one)."""
        self.generated = 0
        """Tokens generated for the current request."""
        self.admitted = 0.0
        """When the request got this slot."""
        self.first_token_at = 0.0
        """When its first token was sampled (0 until then)."""
        self.first_marks = (0.0, 0.0)
        """The first token's sampling and detokenizing, in seconds (for its timings)."""
        self.parked_ms = 0.0
        """Time between its first token, prefilled ahead of a slot, and its slot (see
        :mod:`.ahead`)."""
        self.threads_min = 0
        """Fewest CPU threads a step ran with while this request was in the slot."""
        self.threads_max = 0
        """Most CPU threads a step ran with while this request was in the slot."""
        self.threads_why = ""
        """Why the fewest were fewer than the runner's own count."""
        # -- this step ----------------------------------------------------------------------
        self.batch_index = -1
        """Where this slot's (first) logits are in the current batch, or -1."""
        self.chunk = 0
        """Prompt tokens this slot put in the current batch."""

    @property
    def busy(self) -> bool:
        """True while it serves a request."""
        return self.state is not SlotState.IDLE

    @property
    def prefilling(self) -> bool:
        """True while its prompt is not fully evaluated (waiting included)."""
        return self.state in (SlotState.PREFILLING, SlotState.WAITING)

    @property
    def decoding(self) -> bool:
        """True while it generates."""
        return self.state in (SlotState.DECODING, SlotState.SPECULATING)

    @property
    def remaining_prompt(self) -> int:
        """Prompt tokens still to evaluate."""
        return len(self.job.prompt) - len(self.cache) if self.job is not None else 0

    def take_logprobs(self) -> list[TokenLogprob] | None:
        """The log probabilities not emitted yet (None when there are none); they are
        emitted now."""
        if not self.logprobs:
            return None
        taken, self.logprobs = self.logprobs, []
        return taken

    def timings(self, now: float, drafter: str, threads_of: int) -> Timings:
        """The current request's timings at ``now``; ``drafter`` names what drafted for it,
        ``threads_of`` is the runner's own thread count."""
        job = self.job
        assert job is not None
        first = self.first_token_at or now
        evaluated = len(job.prompt) - self.reused
        prompt_s = max(first - self.admitted, 1e-9)
        decode_s = now - first
        decoding_s = decode_s - self.parked_ms / 1000
        return Timings(
            queued_ms=(self.admitted - job.arrived) * 1000,
            ttft_ms=(first - job.arrived) * 1000 if self.first_token_at else 0.0,
            prompt_tokens=len(job.prompt),
            cached_tokens=self.reused,
            prompt_ms=prompt_s * 1000,
            prompt_tokens_per_s=evaluated / prompt_s if self.first_token_at else 0.0,
            completion_tokens=self.generated,
            decode_ms=decode_s * 1000,
            parked_ms=self.parked_ms,
            sample_ms=self.first_marks[0] * 1000,
            detokenize_ms=self.first_marks[1] * 1000,
            decode_tokens_per_s=(self.generated - 1) / decoding_s
            if self.generated > 1 and decoding_s > 0
            else 0.0,
            total_ms=(now - job.arrived) * 1000,
            draft_tokens=self.drafted,
            draft_accepted=self.accepted,
            drafter=drafter,
            threads_min=self.threads_min,
            threads_max=self.threads_max,
            threads_of=threads_of,
            threads_why=self.threads_why if self.threads_min < threads_of else "",
        )


def busy_runs(seq_ids: Iterable[int]) -> int:
    """How many runs of consecutive ids ``seq_ids`` form (``{0, 1, 3}``: 2)."""
    ordered = sorted(set(seq_ids))
    return sum(1 for i, seq in enumerate(ordered) if i == 0 or ordered[i - 1] != seq - 1)


def choose_slot(
    free: Iterable[Slot],
    prompt: Sequence[int],
    busy: Iterable[int] | None = None,
    wanted: Sequence[Sequence[int]] = (),
    adapters: str = "",
) -> tuple[Slot, int]:
    """The free slot for ``prompt`` and how many of its cached tokens the prompt reuses.

    Longest common prefix first; among equals the least recently used slot, so that other
    slots' caches survive for the prompts that want them. At least one prompt token is always
    evaluated again, for fresh logits (the engine skips that step only where the slot kept
    the logits of exactly this prompt: :mod:`.keptlogits`).

    ``wanted`` are the prompts of other requests waiting for a slot: a free slot whose cache
    one of them shares more of than ``prompt`` does is left to it while any other slot is
    free (taking it would overwrite the cells that request came back for, as when a burst of
    clients sends their conversations again).

    With ``busy`` (the ids of the slots serving requests, when each slot is a KV stream of
    its own) the slots that keep the busy ids in the fewest runs come first: llama.cpp
    computes a batch's sequences in one pass only while their ids are consecutive, and a
    prefix held by another slot is copied over anyway.

    Only cells computed with the prompt's LoRA adapter set (``adapters``, a key) are reused,
    and :func:`fresh_tokens` of the prompt are always evaluated again.
    """
    shared = [
        (slot, common_prefix_length(slot.cache, prompt) if slot.adapters == adapters else 0)
        for slot in free
    ]
    if wanted:
        unclaimed = [
            (slot, mine)
            for slot, mine in shared
            if not any(common_prefix_length(slot.cache, other) > mine for other in wanted)
        ]
        shared = unclaimed or shared
    busy_ids = set(busy) if busy is not None else None

    def runs(slot: Slot) -> int:
        return busy_runs(busy_ids | {slot.seq_id}) if busy_ids is not None else 0

    _, reuse, _, slot = max(
        ((-runs(s), mine, -s.last_used, s) for s, mine in shared),
        key=lambda item: item[:3],
    )
    return slot, max(0, min(reuse, len(prompt) - fresh_tokens(adapters)))


@dataclass(frozen=True)
class PrefixSource:
    """Cells another sequence holds that a prompt can share."""

    slot: Slot
    """The sequence holding them."""
    end: int
    """They cover prompt positions ``[0, end)``."""


def prefix_source(slot: Slot, slots: Iterable[Slot], prompt: Sequence[int]) -> PrefixSource | None:
    """The other sequence sharing the most of ``prompt`` beyond what ``slot`` holds (cells
    computed with the slot's adapter set only)."""
    limit = len(prompt) - fresh_tokens(slot.adapters)
    best: PrefixSource | None = None
    held = len(slot.cache)
    for other in slots:
        if other is slot or not other.cache or other.adapters != slot.adapters:
            continue
        shared = min(common_prefix_length(other.cache, prompt), limit)
        if shared > (best.end if best else held):
            best = PrefixSource(other, shared)
    return best


def should_wait_for(slot: Slot, prefilling: Iterable[Slot]) -> bool:
    """Whether an older request is prefilling a prefix ``slot``'s prompt shares (long enough
    to matter): then waiting a step and copying it beats computing it twice."""
    job = slot.job
    assert job is not None
    limit = len(job.prompt) - fresh_tokens(slot.adapters)
    for other in prefilling:
        if other is slot or other.job is None or other.job.arrived >= job.arrived:
            continue
        if other.adapters != slot.adapters:
            continue  # its cells will not serve this prompt: another adapter set
        shared = min(common_prefix_length(other.job.prompt, job.prompt), limit)
        if shared >= len(slot.cache) + MIN_SHARED_WAIT and len(other.cache) < shared:
            return True
    return False
