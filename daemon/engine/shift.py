"""Context shift: a slot at the end of its context drops the older half of its tokens after
the kept prefix and goes on."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from .model import LlamaModel
from .slots import Slot, common_prefix_length

__all__ = ["context_shift"]

log = logging.getLogger("localllm.runner.engine")


def context_shift(model: LlamaModel, slot: Slot, slots: Sequence[Slot]) -> bool:
    """Drop the older half of ``slot``'s tokens after the kept prefix and move the rest down.
    False when it cannot be done (the caller ends the request).

    In a unified cache, cells a sequence shares with another of ``slots``
    (``llama_memory_seq_cp`` tags a cell with several sequences; its position is one for all)
    must not move, so the kept prefix grows to cover every prefix shared with another slot.
    Streams share no cells.
    """
    job = slot.job
    assert job is not None
    if not model.can_shift:
        log.info("request %s reached the context end; this model cannot shift", job.id)
        return False
    if job.images:
        # A shift could cut an image in half: a request with images ends at the context.
        log.info("request %s with images reached the context end; no shift", job.id)
        return False
    n_past = len(slot.cache)
    keep = min(job.keep, n_past)
    if model.unified_kv:
        keep = max(
            [keep] + [common_prefix_length(o.cache, slot.cache) for o in slots if o is not slot]
        )
    discard = (n_past - keep) // 2
    if discard < 1:
        return False
    model.seq_remove(slot.seq_id, keep, keep + discard)
    model.seq_shift(slot.seq_id, keep + discard, n_past, -discard)
    del slot.cache[keep : keep + discard]
    slot.shared = min(slot.shared, keep)
    log.info(
        "request %s: context shift dropped %d tokens after the first %d", job.id, discard, keep
    )
    return True
