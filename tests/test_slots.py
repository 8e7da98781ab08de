"""Slot choice: longest cached prefix, and, with a KV stream per slot, consecutive busy ids."""

from __future__ import annotations

from localllm.daemon.runner.slots import Slot, busy_runs, choose_slot


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
