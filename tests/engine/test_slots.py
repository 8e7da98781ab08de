"""Slot choice: longest cached prefix, and, with a KV stream per slot, consecutive busy ids;
slots other waiting requests came back for are left to them."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from tiny_gguf import write_tiny_gguf

from localllm.daemon.engine.batching import fill_batch, plan_batch, reproducible, ubatch_order
from localllm.daemon.engine.jobs import GenerationJob
from localllm.daemon.engine.loop import Engine
from localllm.daemon.engine.model import Batch, LlamaModel
from localllm.daemon.engine.slots import (
    Slot,
    SlotState,
    busy_runs,
    choose_slot,
    fresh_tokens,
    prefix_source,
)
from localllm.daemon.runner.protocol import (
    DoneEvent,
    Event,
    GenerationResult,
    RunnerConfig,
    SamplingOptions,
)


def slots_with(
    caches: dict[int, list[int]], last_used: dict[int, float] | None = None
) -> list[Slot]:
    slots = []
    for seq_id, cache in caches.items():
        slot = Slot(seq_id)
        slot.cache = list(cache)
        slot.last_used = (last_used or {}).get(seq_id, 0.0)
        slots.append(slot)
    return slots


def test_busy_runs_counts_runs_of_consecutive_ids() -> None:
    assert busy_runs([]) == 0
    assert busy_runs([3]) == 1
    assert busy_runs([0, 1, 2]) == 1
    assert busy_runs([2, 0, 1, 5, 7, 6]) == 2
    assert busy_runs([0, 2, 4]) == 3


def test_unified_choice_is_longest_prefix_then_least_recently_used() -> None:
    prompt = [1, 2, 3, 4, 5]
    free = slots_with({0: [9, 9], 1: [1, 2, 3], 2: [], 3: []}, {2: 5.0, 3: 1.0})
    slot, reuse = choose_slot(free, prompt)
    assert (slot.seq_id, reuse) == (1, 3)
    slot, reuse = choose_slot(free[2:], prompt)
    assert (slot.seq_id, reuse) == (3, 0)  # the least recently used of two empty slots


def test_stream_choice_keeps_busy_slots_consecutive() -> None:
    prompt = [1, 2, 3, 4, 5]
    # Slots 0 and 1 are busy; slot 5 holds the prompt's prefix, slot 2 nothing: slot 2 keeps
    # the busy ids in one run (the prefix is copied over from slot 5 later).
    free = slots_with({2: [], 3: [], 5: [1, 2, 3, 4]})
    slot, reuse = choose_slot(free, prompt, busy=[0, 1])
    assert (slot.seq_id, reuse) == (2, 0)
    # Among slots that keep the run, the longest prefix still wins.
    free = slots_with({2: [1, 2], 4: [], 5: [1, 2, 3, 4]})
    slot, reuse = choose_slot(free, prompt, busy=[3, 6])
    assert (slot.seq_id, reuse) == (5, 4)  # 3, 5, 6 are two runs, like 2, 3, 6 and 3, 4, 6
    # With nothing busy every slot is one run: the choice is the unified one.
    free = slots_with({0: [9], 1: [1, 2, 3]})
    slot, reuse = choose_slot(free, prompt, busy=[])
    assert (slot.seq_id, reuse) == (1, 3)


def test_at_least_one_prompt_token_is_evaluated() -> None:
    free = slots_with({0: [1, 2, 3]})
    assert choose_slot(free, [1, 2, 3], busy=[])[1] == 2


def test_under_an_adapter_set_two_prompt_tokens_are_evaluated() -> None:
    # One token alone in a ubatch is multiplied by another CPU kernel than a prompt's last
    # tokens in a cold prefill: under an adapter set a reused prefix stops two short.
    assert (fresh_tokens(""), fresh_tokens("sha256:ab*1.0")) == (1, 2)
    free = slots_with({0: [1, 2, 3, 4]})
    free[0].adapters = "a*1.0"
    assert choose_slot(free, [1, 2, 3, 4], busy=[], adapters="a*1.0")[1] == 2
    assert choose_slot(free, [1], busy=[], adapters="a*1.0")[1] == 0
    mine, other = slots_with({0: [], 1: [1, 2, 3, 4, 5]})
    mine.adapters = other.adapters = "a*1.0"
    source = prefix_source(mine, [mine, other], [1, 2, 3, 4, 5])
    assert source is not None and (source.slot, source.end) == (other, 3)


def _busy(seq_id: int, prompt: list[int], cached: int, arrived: float, **options: Any) -> Slot:
    slot = Slot(seq_id)
    sampling = SamplingOptions(**({"temperature": 0.0} | options))
    slot.job = GenerationJob(f"j{seq_id}", prompt, sampling, None, lambda _: None, arrived=arrived)
    slot.cache = prompt[:cached]
    slot.state = SlotState.PREFILLING if cached < len(prompt) else SlotState.DECODING
    slot.pending = 7 if slot.decoding else None
    return slot


def test_an_adapted_step_puts_each_reproducible_sequence_in_a_ubatch_of_its_own() -> None:
    # llama.cpp's split for KV streams takes sequences into one ubatch only while their ids
    # go up by one in batch order: greedy slots go in from the highest id down.
    slots = [_busy(0, [1, 2], 2, 0.0), _busy(1, [1, 2], 2, 1.0), _busy(2, [5, 6, 7, 8], 0, 2.0)]
    batch = Batch(16, 4)
    try:
        plan = plan_batch(slots, batch, None, 16, drafting=False)  # type: ignore[arg-type]
        fill_batch(plan, slots, batch)
        together = [batch.raw.seq_id[i][0] for i in range(batch.size)]
        fill_batch(plan, slots, batch, apart=True)
        apart = [batch.raw.seq_id[i][0] for i in range(batch.size)]
        positions = [batch.raw.pos[i] for i in range(batch.size)]
        logits = [slot.batch_index for slot in slots]
    finally:
        batch.close()
    assert together == [0, 1, 2, 2, 2, 2]
    assert apart == [2, 2, 2, 2, 1, 0] and positions == [0, 1, 2, 3, 2, 2]
    assert _ubatches([2, 1, 0]) == [[2], [1], [0]] and _ubatches([0, 1, 2]) == [[0, 1, 2]]
    assert logits == [5, 4, 3]  # each slot's logits where its own last token went


def test_requests_that_sample_without_a_seed_stay_batched_together() -> None:
    def slot(seq_id: int, **options: Any) -> Slot:
        return _busy(seq_id, [1, 2], 2, 0.0, **options)

    sampled = {"temperature": 0.8}
    slots = [
        slot(0, **sampled),
        slot(1, **sampled),
        slot(2),  # greedy
        slot(3, **sampled),
        slot(4, **sampled, seed=42),  # a seed of its own: reproducible too
        slot(5, **sampled, top_k=1),  # greedy in effect
        slot(7, **sampled),
        slot(8, **sampled),
    ]
    assert [reproducible(s) for s in slots] == [False, False, True, False, True, True, False, False]
    order = [s.seq_id for s, _ in ubatch_order([(s, -1) for s in slots], reproducible)]
    # Runs from the highest down, each increasing: llama.cpp makes one ubatch of each.
    assert order == [7, 8, 5, 4, 3, 2, 0, 1]
    assert _ubatches(order) == [[7, 8], [5], [4], [3], [2], [0, 1]]


def _ubatches(order: list[int]) -> list[list[int]]:
    """The sequences of each ubatch llama.cpp makes of a batch of one token per sequence in
    this order (llama_batch_allocr::split_equal, sequential: from the first unused token,
    each later sequence whose id is one more than the last taken)."""
    left, groups = list(order), []
    while left:
        group = [left[0]]
        for seq in left[1:]:
            if seq == group[-1] + 1:
                group.append(seq)
        groups.append(group)
        left = [seq for seq in left if seq not in group]
    return groups


def test_an_adapted_step_never_splits_a_lone_prompt_token_off() -> None:
    batch = Batch(8, 4)
    try:
        decoding = _busy(0, [1, 2], 2, 0.0)

        def chunks(remaining: int, adapted: bool, *others: Slot) -> list[int]:
            slot = _busy(3, list(range(10, 10 + remaining)), 0, 5.0)
            plan = plan_batch([*others, slot], batch, None, 8, False, adapted)  # type: ignore[arg-type]
            return [count for _, count in plan.prefill]

        # 7 tokens of room beside a generating slot: an 8-token prompt would leave one.
        assert chunks(8, False, decoding) == [7]
        assert chunks(8, True, decoding) == [6]
        assert chunks(3, True, decoding) == [3]  # the rest of its prompt: all of it
        # A second prompt would get one token of room: it waits for the next step.
        older = _busy(1, list(range(20, 26)), 0, 1.0)
        assert chunks(5, False, decoding, older) == [6, 1]
        assert chunks(5, True, decoding, older) == [6, 0]
        # Alone in the batch a lone token goes in all the same: the engine never stalls.
        assert chunks(9, True) == [7] and chunks(3, True) == [3]
    finally:
        batch.close()


def test_a_slot_another_waiting_request_came_back_for_is_left_to_it() -> None:
    mine, theirs = [1, 2, 3, 4, 5], [1, 2, 7, 8, 5]
    # Slot 2 is busy: slot 1 keeps the busy ids in one run, but it holds what a waiting
    # request wants back (4 tokens against this prompt's 2), so slot 0 is taken instead.
    free = slots_with({0: [1, 2, 3], 1: [1, 2, 7, 8, 9]})
    slot, reuse = choose_slot(free, mine, busy=[2], wanted=[theirs])
    assert (slot.seq_id, reuse) == (0, 3)
    # Nobody else wants it: the run wins, as before.
    slot, _ = choose_slot(free, mine, busy=[2])
    assert slot.seq_id == 1
    # The only free slot is taken even so.
    slot, reuse = choose_slot(free[1:], mine, busy=[2], wanted=[theirs])
    assert (slot.seq_id, reuse) == (1, 2)


@pytest.fixture(scope="module")
def streams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaModel]:
    path = write_tiny_gguf(tmp_path_factory.mktemp("slots") / "endless.gguf", never_ends=True)
    model = LlamaModel(
        RunnerConfig(model_path=str(path), n_slots=3, n_ctx_per_slot=256, n_threads=2)
    )
    assert not model.unified_kv
    yield model
    model.close()


class Burst:
    """An engine given every request before its thread starts, so that one admission round
    places them all (as when a burst of clients arrives together)."""

    def __init__(self, model: LlamaModel) -> None:
        self.engine = Engine(model)
        self.results: dict[str, GenerationResult] = {}
        self._done = threading.Condition()

    def emit(self, event: Event) -> None:
        with self._done:
            if isinstance(event, DoneEvent):
                self.results[event.id] = event.result
                self._done.notify_all()

    def run(self, prompts: dict[str, list[int]]) -> dict[str, GenerationResult]:
        options = SamplingOptions(temperature=0.0, num_predict=2, repeat_penalty=1.0)
        for name, prompt in prompts.items():
            self.engine.submit(
                GenerationJob(id=name, prompt=prompt, options=options, grammar=None, emit=self.emit)
            )
        self.engine.start()
        try:
            with self._done:
                assert self._done.wait_for(lambda: len(self.results) == len(prompts), 120)
        finally:
            self.engine._put("stop", None)
            self.engine._thread.join(30)
        return self.results


def test_a_burst_of_returning_requests_finds_each_its_own_cached_slot(
    streams: LlamaModel,
) -> None:
    for seq in range(streams.n_slots):
        streams.seq_remove(seq, 0)
    prompts = {
        name: streams.tokenize(f"burst check, the conversation of {name} goes on", True)
        for name in ("alpha", "bravo", "charlie")
    }
    first = Burst(streams)
    first.run(prompts)
    owner = {
        slot.seq_id: name
        for slot in first.engine.slots
        for name, prompt in prompts.items()
        if slot.cache[: len(prompt)] == prompt
    }
    assert len(owner) == 3
    # The same requests again, on an engine that knows what each sequence holds: the one that
    # owns an end slot first, then the one owning the other end (with the first busy, the
    # middle slot would keep the busy ids in one run, but it holds the third one's prompt).
    again = Burst(streams)
    for old, new in zip(first.engine.slots, again.engine.slots, strict=True):
        new.cache = list(old.cache)
    order = [owner[0], owner[2], owner[1]]
    results = again.run({name: prompts[name] for name in order})
    for name in order:
        assert results[name].timings.cached_tokens == len(prompts[name]) - 1, name
