"""The prefix cache's tiers seen from the engine: an idle slot's KV cells go from the llama.cpp
context to host RAM and disk (:mod:`.prefixcache`), and come back into a slot when a new prompt
shares enough of them to pay for the copy.

Everything here runs on the engine thread, on the engine's model and slots.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from ..engine.model import LlamaModel
from ..engine.slots import Slot, common_prefix_length, fresh_tokens
from .prefixcache import PrefixCache

__all__ = ["MIN_SAVED_TOKENS", "PrefixTiers"]

log = logging.getLogger("localllm.runner.engine")

# Saving a sequence's state, or restoring one, costs a copy of its cells: worth it only for
# prefixes of some length (a system prompt, a conversation), not for a few tokens.
MIN_SAVED_TOKENS = 32
# Restoring a prefix from RAM copies its cells; evaluating a prompt token computes the whole
# model for it. On the CPU that is far dearer: on SmolLM2-135M (2 cores, AVX2) restoring 173
# cells took 0.2 ms and each prompt token 4.2 ms, about 3,500 cells' worth (larger models
# grow their compute faster than their cells). With layers on a GPU the cells cross the bus
# while a few more prompt tokens in a batch cost little, so a restore must spare more.
_CELLS_PER_TOKEN_CPU = 256
_CELLS_PER_TOKEN_GPU = 16
# Idle cells are not free: attention in a unified cache spans them, slowing every active
# stream. With a prefix cache to keep them in, a slot idle this long while others generate
# gives its cells up (a later hit restores them at the cost of a copy).
_IDLE_EVICT_S = 2.0


class PrefixTiers:
    """Saves, evicts and restores slots' cells through the prefix cache (``cache`` None: idle
    cells are simply dropped)."""

    def __init__(self, model: LlamaModel, slots: Sequence[Slot], cache: PrefixCache | None) -> None:
        self.model = model
        self.slots = slots
        self.cache = cache
        on_gpu = model.n_gpu_layers > 0
        self.restore_cells_per_token = _CELLS_PER_TOKEN_GPU if on_gpu else _CELLS_PER_TOKEN_CPU
        """Saved cells a restore from RAM may copy per prompt token it spares."""

    def save(self, slot: Slot) -> None:
        """Copy an idle slot's cells into the prefix cache (unless they are there already)."""
        cache = self.cache
        if cache is None or len(slot.cache) < MIN_SAVED_TOKENS or slot.saved == len(slot.cache):
            return
        try:
            data = self.model.seq_state(slot.seq_id)
        except Exception:  # saving is an optimisation: never fail a request over it
            log.exception("could not save the state of slot %d", slot.seq_id)
            return
        cache.save(slot.cache, data, slot.adapters)
        slot.saved = len(slot.cache)

    def evict_idle(self) -> None:
        """Move long-idle slots' cells to the prefix cache while other slots generate (in a
        unified cache only: with a stream per slot, idle cells cost the others nothing)."""
        if (
            self.cache is None
            or not self.model.unified_kv
            or not any(slot.busy for slot in self.slots)
        ):
            return
        now = time.perf_counter()
        # A prompt being prefilled may be about to share an idle slot's cells: keep those.
        wanted = [s for s in self.slots if s.job is not None and s.prefilling]
        for slot in self.slots:
            if slot.busy or not slot.cache or now - slot.last_used <= _IDLE_EVICT_S:
                continue
            if any(
                w.adapters == slot.adapters
                and common_prefix_length(slot.cache, w.job.prompt) >= MIN_SAVED_TOKENS  # type: ignore[union-attr]
                for w in wanted
            ):
                continue
            self.evict(slot)

    def evict(self, slot: Slot) -> None:
        """Free an idle slot's cells, keeping them in the prefix cache."""
        self.save(slot)
        self.model.seq_remove(slot.seq_id, 0)
        slot.cache, slot.shared, slot.saved = [], 0, 0

    def restore(self, slot: Slot, prompt: list[int], reuse: int, adapters: str = "") -> int:
        """Restore the saved prefix (computed with the adapter set ``adapters``) sharing most
        with ``prompt`` into ``slot`` when it beats what the context holds already; returns
        the prompt tokens the slot now holds."""
        cache = self.cache
        if cache is None:
            return reuse
        found = cache.best(prompt, adapters)
        if found is None:
            return reuse
        length, key = found
        length = min(length, len(prompt) - fresh_tokens(adapters))
        # A prefix another slot holds is shared into this one by _share_prefixes (with KV
        # streams only once it adds _least_shared tokens; it is counted here either way).
        in_context = max(
            common_prefix_length(s.cache, prompt) if s.adapters == adapters else 0
            for s in self.slots
        )
        gain = length - max(reuse, in_context)
        tokens = cache.tokens(key)
        if tokens is None:
            return reuse
        # From RAM, a restore copies the saved cells in: it pays once it spares a prompt token
        # per so many cells copied (see _CELLS_PER_TOKEN_CPU). A file is read first, so a
        # restore from disk must spare a prefix of some length.
        if cache.in_ram(key):
            if gain < max(1, len(tokens) // self.restore_cells_per_token):
                return reuse
        elif gain < MIN_SAVED_TOKENS:
            return reuse
        data = cache.load(key)
        if data is None:
            return reuse
        restored = self.model.restore_seq_state(slot.seq_id, data)
        if not restored:
            # Perhaps no room: make some from idle slots and try once more.
            for other in self.slots:
                if other is not slot and not other.busy and other.cache:
                    self.evict(other)
            restored = self.model.restore_seq_state(slot.seq_id, data)
        if not restored:
            log.warning("llama.cpp refused a saved prefix of %d tokens; dropping it", len(tokens))
            cache.forget(key)
            slot.cache, slot.shared, slot.saved = [], 0, 0
            return 0
        slot.cache, slot.shared = list(tokens), 0
        slot.saved = len(slot.cache)
        slot.adapters = adapters
        log.debug("restored a saved prefix of %d tokens into slot %d", length, slot.seq_id)
        return length

    def persist(self) -> None:
        """The runner is stopping: keep every idle prefix on disk for the next one."""
        if self.cache is None:
            return
        try:
            for slot in self.slots:
                if slot.job is None:
                    self.save(slot)
            self.cache.persist()
        except Exception:
            log.exception("could not save the prefix cache")
