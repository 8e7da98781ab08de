"""Speculative decoding with a draft model: a smaller GGUF sharing the target's vocabulary.

The runner loads the draft next to the target, with its own ``llama_context`` (one sequence
per slot, the same context per slot, a small batch) and keeps, per slot, the tokens whose KV
cells the draft sequence holds (``seen``). In a step where slots speculate, :meth:`DraftModel.
draft` first brings every drafting slot's draft sequence up to the slot's accepted tokens
(prompt included) in batched decodes of at most ``n_batch`` tokens, then drafts k tokens per
slot greedily: the i-th draft position of all drafting slots is one batched decode. Cells the
target rejects leave the draft sequence too (:meth:`DraftModel.rollback`); a slot reused for
another request trims its draft sequence to the common prefix, or copies a longer one from
another draft sequence (``llama_memory_seq_cp``), on its next draft.

A draft whose vocabulary differs from the target's is refused at load with
:class:`DraftVocabularyError` (the rule of llama.cpp's speculative example: same tokenizer
type, same BOS/EOS handling, vocabulary sizes within 128, and equal token texts).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

import llama_cpp

from ..engine.model import LlamaModel, ModelLoadError
from ..engine.slots import common_prefix_length

__all__ = [
    "DRAFT_BATCH",
    "PROBE_SHARE",
    "DraftModel",
    "DraftModelDrafter",
    "DraftVocabularyError",
    "vocabulary_mismatch",
]

log = logging.getLogger("localllm.runner.draft")

DRAFT_BATCH = 128
"""Most tokens per decode of the draft context: catching up is chunked by it, and a small
batch keeps the draft's compute buffers small."""
# llama.cpp's speculative example tolerates vocabularies differing by this many tokens
# (added special tokens at the end) and skips the first few ids (control tokens) when it
# compares token texts.
MAX_VOCAB_DIFFERENCE = 128
_FIRST_COMPARED_TOKEN = 5
# How fast the measured draft cost follows recent decodes.
_COST_WEIGHT = 0.2
# Probes that keep failing wait at most 2**this times the engine's probe interval (16 → 256).
_MAX_PROBE_BACKOFF = 4
# Tokens of the batch whose decode seeds the catch-up pace.
_MEASURED_CATCH_UP = 32
PROBE_SHARE = 0.02
"""Of a request's time since it was admitted, what its probes may spend (catching the draft
sequence up included): a draft model the policy has stopped using must cost next to nothing.
A probe after 16 steps of a 135M q4_0 draft for its q8_0 target caught up 16 tokens and cost
about as much as the next 3 target steps: probes every 16 steps made decoding 9-22 % slower."""


class DraftVocabularyError(ModelLoadError):
    """The draft model's vocabulary does not match the target's."""


def vocabulary_mismatch(target: LlamaModel, draft: LlamaModel) -> str | None:
    """Why ``draft`` cannot draft for ``target`` (None when its vocabulary is compatible)."""
    tv, dv = target.vocab, draft.vocab
    t_type, d_type = llama_cpp.llama_vocab_type(tv), llama_cpp.llama_vocab_type(dv)
    if t_type != d_type:
        return f"tokenizer types differ (target {t_type}, draft {d_type})"
    # llama.cpp compares BOS/EOS ids only where they are added; a draft that ends on another
    # token would stop drafting in the wrong place, so the ids must match in any case.
    for what, add, token in (
        ("BOS", llama_cpp.llama_vocab_get_add_bos, llama_cpp.llama_vocab_bos),
        ("EOS", llama_cpp.llama_vocab_get_add_eos, llama_cpp.llama_vocab_eos),
    ):
        t_add, d_add = bool(add(tv)), bool(add(dv))
        if t_add != d_add or token(tv) != token(dv):
            return (
                f"{what} tokens differ (target id {token(tv)}, added {t_add}; "
                f"draft id {token(dv)}, added {d_add})"
            )
    difference = abs(target.n_vocab - draft.n_vocab)
    if difference > MAX_VOCAB_DIFFERENCE:
        return (
            f"vocabulary sizes differ by {difference} tokens (target {target.n_vocab}, draft "
            f"{draft.n_vocab}; at most {MAX_VOCAB_DIFFERENCE})"
        )
    for token in range(_FIRST_COMPARED_TOKEN, min(target.n_vocab, draft.n_vocab)):
        t_text = llama_cpp.llama_vocab_get_text(tv, token)
        d_text = llama_cpp.llama_vocab_get_text(dv, token)
        if t_text != d_text:
            return f"token {token} differs (target {t_text!r}, draft {d_text!r})"
    return None


class _NoRoom(Exception):
    """The draft context has no KV room for this step's drafting."""


class DraftModel:
    """The draft model of a runner: its own context, one sequence per target slot."""

    def __init__(self, target: LlamaModel, path: str) -> None:
        config = dataclasses.replace(
            target.config,
            model_path=path,
            extra_model_paths=[],
            n_batch=min(target.n_batch, DRAFT_BATCH),
            chat_template=None,
            num_draft=0,
            draft_model=None,
            kv_cache_ram=0,
            kv_cache_disk=0,
        )
        self.name = target.config.draft_name or Path(path).name
        """What reports and errors call it."""
        self.model = LlamaModel(config)
        # What stops the target's idle decodes (a request arriving) stops the draft's too.
        self.model.interrupt = target.interrupt
        reason = vocabulary_mismatch(target, self.model)
        if reason is not None:
            self.model.close()
            raise DraftVocabularyError(
                f"draft model {self.name} cannot draft for "
                f"{Path(target.config.model_path).name}: "
                f"its vocabulary is incompatible ({reason})"
            )
        self.target_vocab = target.n_vocab
        self._is_end = target.is_end_of_generation
        self.seen: list[list[int]] = [[] for _ in range(target.n_slots)]
        """Per slot: the tokens whose cells the slot's draft sequence holds."""
        self.seconds_per_token: float | None = None
        """Measured seconds of draft compute per drafted token (catching up on the few
        tokens accepted since the last draft included, on a whole prompt not), averaged over
        recent steps; None until the first draft."""
        self.catch_up_seconds_per_token: float | None = None
        """Measured seconds per token of catching up (a batch of the tokens the draft
        sequence has not seen yet), averaged over recent catch-ups: what a probe after a
        long pause costs before it drafts anything."""
        self._bulk_seconds = 0.0

    def behind(self, seq_id: int, tokens: int) -> int:
        """Tokens a slot's draft sequence must catch up on before drafting after ``tokens``
        (what the slot's target sequence holds, its pending token included)."""
        return max(0, tokens - len(self.seen[seq_id]))

    def catch_up_cost(self, seq_id: int, tokens: int) -> float:
        """Seconds a probe of this slot would cost: catching up, then drafting one token."""
        one = self.seconds_per_token or 0.0
        per_token = self.catch_up_seconds_per_token
        if per_token is None:
            per_token = one / 4  # a batch's token costs a fraction of a lone token's decode
        return self.behind(seq_id, tokens) * per_token + one

    def close(self) -> None:
        """Free the draft's context and model."""
        self.model.close()

    def measure(self) -> bool:
        """Seed :attr:`seconds_per_token` with a one-token decode (the fastest of a few), so
        that a draft model too slow to ever pay is known before any request pays for its
        catching up on a whole prompt, and :attr:`catch_up_seconds_per_token` with a batch.
        The engine takes it while idle, under its interrupt (shared with the target model):
        False when a request arrived and stopped it (taken again at the next idle moment),
        True once done."""
        if self.seconds_per_token is not None or any(self.seen):
            return True
        model, batch = self.model, self.model.batch
        runs = []
        for _ in range(3):
            batch.clear()
            batch.add(max(model.bos_id, 0), 0, 0, True)
            started = time.perf_counter()
            status = model.decode_unless_interrupted()
            elapsed = time.perf_counter() - started
            model.seq_remove(0, 0)
            batch.clear()
            if status == 2:
                return False
            if status != 0:
                break
            runs.append(elapsed)
        # A catch-up's pace: one batch of the probe's size.
        tokens = min(_MEASURED_CATCH_UP, batch.capacity)
        for position in range(tokens):
            batch.add(max(model.bos_id, 0), position, 0, position == tokens - 1)
        started = time.perf_counter()
        status = model.decode_unless_interrupted()
        elapsed = time.perf_counter() - started
        model.seq_remove(0, 0)
        batch.clear()
        if status == 2:
            return False
        if status == 0:
            self.catch_up_seconds_per_token = elapsed / tokens
        if len(runs) == 3:
            self.seconds_per_token = min(runs[1:])  # the first warms up
        return True

    def rollback(self, seq_id: int, tokens: list[int]) -> None:
        """The target sequence now holds ``tokens``: drop draft cells beyond their common
        prefix (rejected draft positions)."""
        seen = self.seen[seq_id]
        keep = common_prefix_length(seen, tokens)
        if keep < len(seen):
            self.model.seq_remove(seq_id, keep, -1)
            del seen[keep:]

    def draft(self, wants: list[tuple[int, list[int], int]]) -> dict[int, list[int]]:
        """Greedy drafts: for each ``(seq_id, tokens, k)`` (``tokens``: what the target's
        sequence holds plus its pending token), up to k tokens that the draft model predicts
        after them. Drafting never fails a request: on any trouble the slots get no draft."""
        wants = [(seq, tokens, k) for seq, tokens, k in wants if k > 0 and tokens]
        if not wants:
            return {}
        started = time.perf_counter()
        self._bulk_seconds = 0.0
        try:
            drafts = self._draft(wants)
        except _NoRoom:
            log.info("the draft context is full; no draft this step")
            for seq, _, _ in wants:
                self._forget(seq)
            return {}
        produced = sum(len(d) for d in drafts.values())
        if produced:
            # Catching up on a whole prompt is paid once per request; the policy weighs the
            # steady cost of a step's drafting.
            spent = time.perf_counter() - started - self._bulk_seconds
            per_token = max(spent, 0.0) / produced
            previous = self.seconds_per_token
            self.seconds_per_token = (
                per_token if previous is None else previous + _COST_WEIGHT * (per_token - previous)
            )
        return drafts

    def _forget(self, seq_id: int) -> None:
        self.model.seq_remove(seq_id, 0)
        self.seen[seq_id] = []

    def _sync(self, seq_id: int, tokens: list[int]) -> None:
        """Trim the draft sequence to what it shares with ``tokens`` (at least the last token
        is left to decode, for its logits), then copy a longer prefix from another draft
        sequence when one holds it."""
        seen = self.seen[seq_id]
        keep = min(common_prefix_length(seen, tokens), len(tokens) - 1)
        if keep < len(seen):
            self.model.seq_remove(seq_id, keep, -1)
            del seen[keep:]
        best, source = keep, -1
        for other, other_seen in enumerate(self.seen):
            if other == seq_id:
                continue
            shared = min(common_prefix_length(other_seen, tokens), len(tokens) - 1)
            if shared > best:
                best, source = shared, other
        if source >= 0:
            self.model.seq_copy(source, seq_id, keep, best)
            seen.extend(tokens[keep:best])

    def _decode(self, busy: set[int]) -> None:
        """Decode the filled batch; on no KV room, free idle draft sequences once."""
        status = self.model.decode()
        if status == 1:
            for seq_id, seen in enumerate(self.seen):
                if seq_id not in busy and seen:
                    self._forget(seq_id)
            status = self.model.decode()
        if status != 0:
            raise _NoRoom

    def _argmax(self, index: int) -> int:
        from ..engine.sampling import logits_at

        return int(logits_at(self.model.ctx, index, self.model.n_vocab).argmax())

    def _draft(self, wants: list[tuple[int, list[int], int]]) -> dict[int, list[int]]:
        for seq, tokens, _ in wants:
            self._sync(seq, tokens)
        busy = {seq for seq, _, _ in wants}
        batch = self.model.batch
        drafts: dict[int, list[int]] = {seq: [] for seq, _, _ in wants}
        # Catch up: every slot's unseen tokens, batched across slots, n_batch at a time; the
        # decode holding a slot's last token gives its first draft token.
        while any(len(self.seen[seq]) < len(tokens) for seq, tokens, _ in wants):
            batch.clear()
            last: list[tuple[int, int]] = []
            for seq, tokens, _ in wants:
                seen = self.seen[seq]
                while len(seen) < len(tokens) and batch.free:
                    position = len(seen)
                    is_last = position == len(tokens) - 1
                    index = batch.add(tokens[position], position, seq, is_last)
                    seen.append(tokens[position])
                    if is_last:
                        last.append((seq, index))
            decode_started = time.perf_counter()
            self._decode(busy)
            if batch.size > 2 * len(wants):
                elapsed = time.perf_counter() - decode_started
                self._bulk_seconds += elapsed
                per_token = elapsed / batch.size
                previous = self.catch_up_seconds_per_token
                self.catch_up_seconds_per_token = (
                    per_token
                    if previous is None
                    else previous + _COST_WEIGHT * (per_token - previous)
                )
            for seq, index in last:
                drafts[seq].append(self._argmax(index))
        # Then one batched decode per further draft position.
        limits = {seq: k for seq, _, k in wants}
        ends = {seq: len(tokens) for seq, tokens, _ in wants}
        while True:
            for seq, draft in drafts.items():
                if draft and (draft[-1] >= self.target_vocab or self._is_end(draft[-1])):
                    # No use drafting past the end, nor a token the target does not have.
                    limits[seq] = len(draft) - (draft[-1] >= self.target_vocab)
            active = [seq for seq, draft in drafts.items() if len(draft) < limits[seq]]
            if not active:
                break
            batch.clear()
            indices = []
            for seq in active:
                token = drafts[seq][-1]
                position = ends[seq] + len(drafts[seq]) - 1
                indices.append((seq, batch.add(token, position, seq, True)))
                self.seen[seq].append(token)
            self._decode(busy)
            for seq, index in indices:
                drafts[seq].append(self._argmax(index))
        return {seq: draft[: limits[seq]] for seq, draft in drafts.items()}


class DraftModelDrafter:
    """One slot's view of the shared :class:`DraftModel`, with :class:`NgramDrafter`'s
    interface: the engine drafts for all slots at once, then each slot's ``propose`` hands out
    its part."""

    def __init__(self, model: DraftModel) -> None:
        self.model = model
        self.drafted: list[int] = []
        """This step's draft from the draft model (set by the engine)."""
        self.skipped = 0
        """Steps in a row the policy chose not to draft (see the engine's probing)."""
        self.misses = 0
        """Probes in a row after which no drafted token was accepted: the engine waits
        ``2**misses`` times longer before the next probe."""
        self._accepted_at_probe: int | None = None
        self.started = time.perf_counter()
        """When the request was admitted (its probes' budget grows with its time)."""
        self.probe_seconds = 0.0
        """Time the draft model spent on this slot's probes so far."""

    def may_probe(self, cost: float, now: float) -> bool:
        """Whether a probe costing ``cost`` seconds stays within :data:`PROBE_SHARE` of the
        request's time."""
        return self.probe_seconds + cost <= PROBE_SHARE * (now - self.started)

    def probe(self, accepted: int) -> None:
        """A probe is about to be made; ``accepted`` is the slot's count of accepted drafted
        tokens so far. No token accepted since the previous probe backs the next one off;
        any accepted resets the wait."""
        if self._accepted_at_probe is not None:
            if accepted > self._accepted_at_probe:
                self.misses = 0
            else:
                self.misses = min(self.misses + 1, _MAX_PROBE_BACKOFF)
        self._accepted_at_probe = accepted

    def append(self, token: int) -> None:
        """Nothing to do: the draft model reads the slot's tokens when it drafts."""

    def propose(self, limit: int) -> list[int]:
        """This step's draft, at most ``limit`` tokens."""
        return self.drafted[:limit]
