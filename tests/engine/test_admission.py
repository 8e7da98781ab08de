"""The admission order: a request whose prompt the cache holds goes before a cold prefill, and
no request waits more than twice what first-come-first-served would give it."""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterator, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_gguf import write_tiny_gguf

from localllm.daemon.engine.admission import (
    AdmissionOrder,
    Cached,
    Waiting,
    choose_next,
    tokens_saved,
)
from localllm.daemon.engine.jobs import GenerationJob
from localllm.daemon.engine.loop import Engine
from localllm.daemon.engine.model import LlamaModel
from localllm.daemon.engine.slots import Slot
from localllm.daemon.kv.prefixcache import PrefixCache
from localllm.daemon.runner.protocol import (
    DoneEvent,
    Event,
    GenerationResult,
    RunnerConfig,
    SamplingOptions,
)

SYSTEM = [1, 50, 51, 52, 53, 54, 55, 56]


def job(name: str, prompt: Sequence[int]) -> GenerationJob:
    return GenerationJob(name, list(prompt), SamplingOptions(), None, lambda event: None)


def slot_holding(seq_id: int, tokens: Sequence[int], adapters: str = "") -> Slot:
    slot = Slot(seq_id)
    slot.cache = list(tokens)
    slot.adapters = adapters
    return slot


def test_a_continuation_goes_before_an_older_cold_prompt() -> None:
    history = [*SYSTEM, 7, 8, 9, 10, 11, 12]
    cold = Waiting([*SYSTEM, 90, 91, 92], allowance=1)
    warm = Waiting([*history, 13, 14], allowance=2)
    free = [Cached(history), Cached([])]
    assert tokens_saved(warm.prompt, "", free) == len(history)
    assert tokens_saved(cold.prompt, "", free) == len(SYSTEM)
    assert choose_next([cold, warm], free) == 1


def test_equal_savings_keep_arrival_order() -> None:
    free = [Cached(SYSTEM)]
    waiting = [Waiting([*SYSTEM, 5, 6]), Waiting([*SYSTEM, 7, 8], allowance=2)]
    assert choose_next(waiting, free) == 0


def test_a_due_request_goes_first_whatever_the_cache_holds() -> None:
    history = [*SYSTEM, 7, 8, 9, 10]
    cold = Waiting([2, 3, 4], passed=1, allowance=1)
    warm = Waiting([*history, 11], allowance=2)
    assert choose_next([cold, warm], [Cached(history)]) == 0
    # Two due: the older first.
    older = Waiting([5, 6], passed=3, allowance=2)
    assert choose_next([older, cold, warm], [Cached(history)]) == 0


def test_cells_of_another_adapter_set_do_not_count() -> None:
    history = [*SYSTEM, 7, 8, 9, 10]
    free = [Cached(history, adapters="lora-a")]
    assert tokens_saved([*history, 11], "", free) == 0
    assert tokens_saved([*history, 11], "lora-a", free) == len(history)
    waiting = [Waiting([3, 4, 5]), Waiting([*history, 11], allowance=2)]
    assert choose_next(waiting, free) == 0


def test_the_last_prompt_token_is_never_counted_as_saved() -> None:
    assert tokens_saved([1, 2, 3], "", [Cached([1, 2, 3, 4])]) == 2
    assert tokens_saved([], "", [Cached([1, 2])]) == 0


def test_nothing_waiting_is_an_error() -> None:
    with pytest.raises(ValueError):
        choose_next([], [Cached([1])])


def test_the_ram_tier_counts_as_cached() -> None:
    cache = PrefixCache(None, ram_budget=1 << 20, disk_budget=0)
    history = [*SYSTEM, *range(100, 140)]
    cache.save(history, b"\0" * 64)
    order = AdmissionOrder()
    waiting = collections.deque([job("cold", [*SYSTEM, 9, 9, 9]), job("warm", [*history, 7])])
    taken = order.take(waiting, [slot_holding(0, [])], cache)
    assert taken.id == "warm"
    assert [w.id for w in waiting] == ["cold"]


def test_the_engine_order_passes_a_request_over_at_most_its_allowance() -> None:
    history = [*SYSTEM, 7, 8, 9, 10]
    order = AdmissionOrder()
    # "cold" finds nobody waiting: it may be passed over once, then it is due.
    waiting = collections.deque([job("cold", [3, 4, 5])])
    waiting.append(job("warm1", [*history, 11]))
    first = order.take(waiting, [slot_holding(0, history)])
    assert first.id == "warm1"
    waiting.append(job("warm2", [*history, 12]))
    second = order.take(waiting, [slot_holding(0, history)])
    assert second.id == "cold"


def test_cancelled_requests_are_forgotten() -> None:
    order = AdmissionOrder()
    waiting = collections.deque([job("a", [1, 2]), job("b", [1, 3]), job("c", [1, 4])])
    order.take(waiting, [slot_holding(0, [])])
    waiting.remove(waiting[0])  # "b" is cancelled
    order.take(waiting, [slot_holding(0, [])])
    assert not order._counts


# -- the bound over random arrivals ------------------------------------------------------


def _simulate(
    arrivals: list[list[int]],
    releases: list[int],
    prompts: list[list[int]],
    caches: list[list[int]],
    fcfs: bool,
) -> dict[int, int]:
    """Admissions counted from each request's arrival to its own (inclusive), per request.

    Each tick some requests arrive (indices into ``prompts``), then ``releases[tick]`` slots
    free up and are refilled while anyone waits; the free slots hold ``caches``.
    """
    order = AdmissionOrder()
    waiting: collections.deque[GenerationJob] = collections.deque()
    handed = 0
    arrived_at: dict[str, int] = {}
    waited: dict[int, int] = {}
    free = [slot_holding(i, cache) for i, cache in enumerate(caches)]
    number = 0
    tick = 0
    # After the last arrival, one slot frees per tick until nobody waits.
    while tick < len(arrivals) or waiting:
        for index in arrivals[tick] if tick < len(arrivals) else []:
            name = f"r{number}"
            number += 1
            waiting.append(job(name, prompts[index]))
            arrived_at[name] = handed
        for _ in range(releases[tick] if tick < len(releases) else 1):
            if not waiting:
                break
            taken = waiting.popleft() if fcfs else order.take(waiting, free)
            handed += 1
            waited[int(taken.id[1:])] = handed - arrived_at[taken.id]
        tick += 1
    return waited


token_lists = st.lists(st.integers(min_value=1, max_value=4), min_size=1, max_size=6)


@settings(max_examples=300, deadline=None)
@given(
    prompts=st.lists(token_lists, min_size=1, max_size=6),
    caches=st.lists(token_lists, min_size=1, max_size=3),
    data=st.data(),
)
def test_no_request_waits_more_than_twice_fcfs(
    prompts: list[list[int]], caches: list[list[int]], data: st.DataObject
) -> None:
    arrivals = data.draw(
        st.lists(st.lists(st.integers(0, len(prompts) - 1), max_size=4), min_size=1, max_size=12),
        label="arrivals",
    )
    releases = data.draw(st.lists(st.integers(0, 3), max_size=30), label="releases")
    ours = _simulate(arrivals, releases, prompts, caches, fcfs=False)
    theirs = _simulate(arrivals, releases, prompts, caches, fcfs=True)
    assert ours.keys() == theirs.keys()
    for request, admissions in ours.items():
        assert admissions <= 2 * theirs[request], (request, admissions, theirs[request])


@settings(max_examples=200, deadline=None)
@given(
    colds=st.lists(
        st.lists(st.integers(min_value=60, max_value=90), min_size=1, max_size=8),
        min_size=1,
        max_size=5,
    ),
    turn=st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=8),
    place=st.integers(min_value=0, max_value=5),
)
def test_a_continuation_beats_cold_prompts_while_none_is_due(
    colds: list[list[int]], turn: list[int], place: int
) -> None:
    history = [*SYSTEM, *range(100, 120)]
    place = min(place, len(colds))
    prompts = [[*SYSTEM, *cold] for cold in colds]
    prompts.insert(place, [*history, *turn])
    waiting = [Waiting(prompt, allowance=i + 1) for i, prompt in enumerate(prompts)]
    free = [Cached(history), Cached(SYSTEM)]
    assert choose_next(waiting, free) == place


# -- in the engine ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def one_slot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaModel]:
    path = write_tiny_gguf(tmp_path_factory.mktemp("admission") / "endless.gguf", never_ends=True)
    model = LlamaModel(
        RunnerConfig(model_path=str(path), n_slots=1, n_ctx_per_slot=256, n_threads=2)
    )
    yield model
    model.close()


class Finishes:
    """An engine given its requests before its thread starts (one admission round sees them
    all); records the order in which they end."""

    def __init__(self, model: LlamaModel, caches: Sequence[Sequence[int]] = ()) -> None:
        self.engine = Engine(model)
        for slot, cache in zip(self.engine.slots, caches, strict=False):
            slot.cache = list(cache)
        self.order: list[str] = []
        self.results: dict[str, GenerationResult] = {}
        self._done = threading.Condition()

    def emit(self, event: Event) -> None:
        with self._done:
            if isinstance(event, DoneEvent):
                self.order.append(event.id)
                self.results[event.id] = event.result
                self._done.notify_all()

    def run(self, prompts: dict[str, list[int]]) -> list[str]:
        options = SamplingOptions(temperature=0.0, num_predict=2, repeat_penalty=1.0)
        for name, prompt in prompts.items():
            self.engine.submit(GenerationJob(name, prompt, options, None, self.emit))
        self.engine.start()
        try:
            with self._done:
                assert self._done.wait_for(lambda: len(self.results) == len(prompts), 120)
        finally:
            self.engine._put("stop", None)
            self.engine._thread.join(30)
        return self.order


def test_the_engine_serves_the_continuation_before_an_older_cold_prompt(
    one_slot: LlamaModel,
) -> None:
    one_slot.seq_remove(0, 0)
    history = one_slot.tokenize("the conversation so far, with its system prompt and a turn", True)
    first = Finishes(one_slot)
    first.run({"turn1": history})
    held = list(first.engine.slots[0].cache)
    assert held[: len(history)] == history
    cold = one_slot.tokenize("a new user arrives with a question of their own", True)
    then = Finishes(one_slot, [held])
    order = then.run({"cold": cold, "turn2": [*held, *one_slot.tokenize(" and more", False)]})
    assert order == ["turn2", "cold"]
    # Its cells were still there: under first-come-first-served the cold prompt took the slot.
    assert then.results["turn2"].timings.cached_tokens == len(held)
    assert then.results["cold"].done_reason == "length"
