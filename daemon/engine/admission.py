"""Which waiting request gets the next free slot: the one whose prompt the cache holds most of,
with a bound on how long anyone waits.

First-come-first-served makes a continuation whose conversation sits in an idle slot (or in
the prefix cache's RAM tier) wait behind a cold prompt, and by the time its turn comes the
cold prompt may have overwritten those cells. Longest-prefix-first (SGLang's scheduler) admits
the request that saves the most prefill, but pure longest-prefix-first starves cold prompts
(sglang #31953: 5 % of requests waited 20-60 s).

The bound, counted in admissions (slots handed out): under first-come-first-served a request
that finds ``ahead`` requests waiting gets the ``ahead + 1``-th slot handed out after it
arrives. Here it may be passed over ``ahead + 1`` times; then it is *due*, and due requests go
first, oldest first. Only requests older than it can then still go before it, and at most
``ahead`` of them were waiting, so it gets a slot within ``2 * (ahead + 1)`` admissions: at
most twice what first-come-first-served gives it (the queue's length at any moment is the same
under both orders, as both fill every free slot).

:func:`choose_next` is the policy, on plain values; :class:`AdmissionOrder` keeps each waiting
request's counts for the engine. Nothing here touches llama.cpp.
"""

from __future__ import annotations

from collections.abc import Callable, Container, MutableSequence, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .slots import Slot, common_prefix_length

if TYPE_CHECKING:
    from ..kv.prefixcache import PrefixCache
    from .jobs import GenerationJob

__all__ = [
    "AdmissionOrder",
    "Cached",
    "SavedPrefix",
    "Waiting",
    "choose_next",
    "ram_prefix",
    "tokens_saved",
]

SavedPrefix = Callable[[Sequence[int], str], int]
"""Leading tokens of a prompt (computed with an adapter set, by key) a saved tier holds."""


def _nothing_saved(prompt: Sequence[int], adapters: str) -> int:
    return 0


@dataclass(frozen=True)
class Waiting:
    """A request waiting for a slot, as the policy sees it."""

    prompt: Sequence[int]
    """Its prompt tokens."""
    adapters: str = ""
    """The key of its LoRA adapter set (cells computed with another set do not serve it)."""
    passed: int = 0
    """Slots handed to other requests while it waited."""
    allowance: int = 1
    """How many times it may be passed over: the requests waiting ahead of it when it arrived,
    plus one."""
    ready: bool = False
    """Its prompt is evaluated already (prefilled ahead of a slot, its first token out): it
    saves its whole prefill."""

    @property
    def due(self) -> bool:
        """Passed over as often as the bound allows: it goes next (oldest due first)."""
        return self.passed >= self.allowance


@dataclass(frozen=True)
class Cached:
    """The cells a free slot holds."""

    tokens: Sequence[int]
    """The tokens they were computed for, from position 0."""
    adapters: str = ""
    """The key of the adapter set they were computed with."""


def tokens_saved(
    prompt: Sequence[int],
    adapters: str,
    free: Sequence[Cached],
    saved: SavedPrefix = _nothing_saved,
) -> int:
    """Prompt tokens a request would not prefill: the longest prefix a free slot (same adapter
    set) or a saved tier holds; the last prompt token is always evaluated again (for logits)."""
    held = max(
        (common_prefix_length(c.tokens, prompt) for c in free if c.adapters == adapters),
        default=0,
    )
    return max(0, min(max(held, saved(prompt, adapters)), len(prompt) - 1))


def choose_next(
    waiting: Sequence[Waiting],
    free: Sequence[Cached],
    saved: SavedPrefix = _nothing_saved,
) -> int:
    """Index into ``waiting`` (oldest first) of the request to admit next.

    The oldest due request (see :attr:`Waiting.due`) if any; else the oldest
    :attr:`Waiting.ready` one (nothing left to prefill, its first token out: its reader waits
    mid-answer); else the one that saves the most prefill (:func:`tokens_saved`), the oldest
    among equals. Raises ``ValueError`` when nothing waits.
    """
    if not waiting:
        raise ValueError("no request is waiting")
    if len(waiting) == 1:
        return 0  # the usual case: no prefix lookups on the first token's way
    for index, request in enumerate(waiting):
        if request.due:
            return index

    def rank(item: tuple[int, Waiting]) -> tuple[bool, int, int]:
        index, request = item
        if request.ready:
            return True, 0, -index
        return False, tokens_saved(request.prompt, request.adapters, free, saved), -index

    best, _ = max(enumerate(waiting), key=rank)
    return best


def ram_prefix(cache: PrefixCache | None) -> SavedPrefix:
    """What the prefix cache's RAM tier holds of a prompt (a disk read costs too much to count
    as cached when ordering)."""
    if cache is None:
        return _nothing_saved

    def held(prompt: Sequence[int], adapters: str) -> int:
        found = cache.best(list(prompt), adapters)
        if found is None or not cache.in_ram(found[1]):
            return 0
        return found[0]

    return held


class AdmissionOrder:
    """Each waiting request's counts, kept between the engine's admissions.

    A request is first seen by :meth:`take` (the engine admits only through it), at its place
    in the queue: no slot was handed out since it arrived, so the requests ahead of it are the
    ones that were waiting when it came.
    """

    def __init__(self) -> None:
        # request id -> [passed, allowance]
        self._counts: dict[str, list[int]] = {}

    def take(
        self,
        waiting: MutableSequence[GenerationJob],
        free: Sequence[Slot],
        cache: PrefixCache | None = None,
        ready: Container[str] = (),
    ) -> GenerationJob:
        """Remove from ``waiting`` (arrival order) and return the request the next of the
        ``free`` slots goes to (see :func:`choose_next`); ``ready``: the ids of requests
        whose prompt is evaluated already."""
        counts = self._counts
        if len(waiting) == 1:
            # The usual case, on the first token's way: nothing to order (choose_next answers
            # 0), so no views of the slots are built (30 us after an idle gap).
            counts.clear()  # what is left of requests cancelled while waiting
            return waiting.pop()
        for place, job in enumerate(waiting):
            counts.setdefault(job.id, [0, place + 1])
        views = [
            Waiting(job.prompt, job.adapters.key, *counts[job.id], ready=job.id in ready)
            for job in waiting
        ]
        cached = [Cached(slot.cache, slot.adapters) for slot in free]
        index = choose_next(views, cached, ram_prefix(cache))
        job = waiting[index]
        del waiting[index]
        del counts[job.id]
        for other in waiting:
            counts[other.id][0] += 1
        if len(counts) > len(waiting):  # cancelled while waiting
            alive = {other.id for other in waiting}
            for gone in [key for key in counts if key not in alive]:
                del counts[gone]
        return job
