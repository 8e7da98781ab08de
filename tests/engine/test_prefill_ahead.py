"""Prefill ahead: with every slot busy, a waiting request is prefilled in a sequence of its
own and streams its first token before a slot frees; it decodes once one does, and its
answer is the one it gives alone."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from runner_harness import greedy
from tiny_gguf import write_tiny_gguf

from localllm.daemon.engine.admission import Cached, Waiting, choose_next
from localllm.daemon.engine.jobs import GenerationJob
from localllm.daemon.engine.loop import Engine
from localllm.daemon.engine.model import LlamaModel
from localllm.daemon.memory.plan import (
    Device,
    DeviceUse,
    MemoryPlan,
    ahead_that_fits,
    with_ahead,
)
from localllm.daemon.runner.protocol import (
    DoneEvent,
    Event,
    GenerationResult,
    RunnerConfig,
    SamplingOptions,
    TokenEvent,
)

SYSTEM = "You are a helpful assistant. Answer every user briefly and count when asked. "


class Run:
    """Requests handed to a fresh engine on ``model`` before its thread starts (one
    admission round sees them all); every event in the order the engine sent them."""

    def __init__(self, model: LlamaModel) -> None:
        for seq in range(model.n_slots + model.config.n_ahead + (model.scratch_seq is not None)):
            model.seq_remove(seq, 0)  # nothing cached from an earlier run
        self.engine = Engine(model)
        self.events: list[Event] = []
        self.on_event: Callable[[Event], None] = lambda event: None
        self._lock = threading.Condition()

    def emit(self, event: Event) -> None:
        with self._lock:
            self.events.append(event)
            self._lock.notify_all()
        self.on_event(event)

    def run(self, prompts: dict[str, list[int]], options: SamplingOptions) -> None:
        for name, prompt in prompts.items():
            self.engine.submit(GenerationJob(name, prompt, options, None, self.emit))
        self.engine.start()
        try:
            with self._lock:
                assert self._lock.wait_for(lambda: len(self.results) == len(prompts), 300)
        finally:
            self.engine._put("stop", None)
            self.engine._thread.join(30)

    @property
    def results(self) -> dict[str, GenerationResult]:
        return {e.id: e.result for e in self.events if isinstance(e, DoneEvent)}

    def first(self, kind: type, name: str) -> int:
        """Where the first event of ``kind`` for ``name`` is in the order."""
        return next(i for i, e in enumerate(self.events) if isinstance(e, kind) and e.id == name)


@pytest.fixture(scope="module")
def starter(smollm2_gguf: Path) -> Iterator[LlamaModel]:
    config = RunnerConfig(
        model_path=str(smollm2_gguf), n_slots=2, n_ctx_per_slot=512, n_threads=2, n_ahead=2
    )
    model = LlamaModel(config)
    yield model
    model.close()


def _prompts(model: LlamaModel, count: int) -> dict[str, list[int]]:
    return {
        f"user{i}": model.tokenize(f"{SYSTEM}User {i}: count from {3 * i} to {3 * i + 9}.", True)
        for i in range(count)
    }


def test_a_waiting_request_streams_its_first_token_before_a_slot_frees(
    starter: LlamaModel,
) -> None:
    prompts = _prompts(starter, 5)
    options = greedy(12, repeat_penalty=1.0)
    alone = {}
    for name, prompt in prompts.items():
        run = Run(starter)
        run.run({name: prompt}, options)
        alone[name] = run.results[name]
    together = Run(starter)
    together.run(prompts, options)
    results = together.results
    assert len([e for e in together.events if isinstance(e, DoneEvent)]) == len(prompts)
    for name, result in results.items():
        assert result.done_reason == alone[name].done_reason, name
        assert result.text == alone[name].text, name  # as alone, token for token
        assert result.timings.completion_tokens == alone[name].timings.completion_tokens
    # Two slots: user0 and user1 take them; the others wait for a slot, yet each streams its
    # first token before the first request done frees one.
    first_done = min(together.first(DoneEvent, name) for name in ("user0", "user1"))
    # The requests holding the slots get their first tokens first.
    first_ahead = min(together.first(TokenEvent, f"user{i}") for i in (2, 3, 4))
    assert max(together.first(TokenEvent, name) for name in ("user0", "user1")) < first_ahead
    for name in ("user2", "user3", "user4"):
        assert together.first(TokenEvent, name) < first_done, name
        assert results[name].timings.parked_ms > 0  # reported: it waited after its first token
    for name in ("user0", "user1"):
        assert results[name].timings.parked_ms == 0
    assert together.engine.ahead.prefilled == 3
    # user4 waited for an ahead sequence, whose cells held the shared system prompt.
    assert results["user4"].timings.cached_tokens > 0


def test_a_request_that_ends_at_its_first_token_ends_once(starter: LlamaModel) -> None:
    prompts = _prompts(starter, 4)
    run = Run(starter)
    run.run(prompts, greedy(1, repeat_penalty=1.0))
    done = [e.id for e in run.events if isinstance(e, DoneEvent)]
    assert sorted(done) == sorted(prompts)  # one final event each, none admitted again
    assert all(r.done_reason == "length" for r in run.results.values())
    assert not run.engine.waiting and not run.engine.ahead.parked


@pytest.fixture(scope="module")
def endless(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaModel]:
    path = write_tiny_gguf(tmp_path_factory.mktemp("ahead") / "endless.gguf", never_ends=True)
    config = RunnerConfig(
        model_path=str(path), n_slots=1, n_ctx_per_slot=256, n_threads=2, n_ahead=1
    )
    model = LlamaModel(config)
    yield model
    model.close()


def test_a_parked_request_cancelled_ends_with_what_it_generated(endless: LlamaModel) -> None:
    busy, parked = endless.tokenize("a long answer", True), endless.tokenize("a question", True)
    run = Run(endless)

    def on_event(event: Event) -> None:
        # Its first token is out: it is parked, the slot busy for 200 more tokens.
        if isinstance(event, TokenEvent) and event.id == "parked":
            run.engine.cancel("parked")
        elif isinstance(event, DoneEvent) and event.id == "parked":
            run.engine.cancel("busy")

    run.on_event = on_event
    run.run({"busy": busy, "parked": parked}, greedy(200))
    result = run.results["parked"]
    assert result.done_reason == "cancel"
    streamed = "".join(e.text for e in run.events if isinstance(e, TokenEvent) and e.id == "parked")
    assert result.text == streamed and result.timings.completion_tokens == 1
    assert result.timings.parked_ms > 0
    assert run.results["busy"].done_reason == "cancel"
    assert run.first(DoneEvent, "parked") < run.first(DoneEvent, "busy")


def _view(prompt: Sequence[int], **fields: object) -> Waiting:
    return Waiting(list(prompt), **fields)  # type: ignore[arg-type]


def test_a_request_prefilled_ahead_goes_first_unless_another_is_due() -> None:
    history = [1, 2, 3, 4, 5, 6]
    free = [Cached(history)]
    cold_ready = _view([9, 9, 9], allowance=2, ready=True)
    warm = _view([*history, 7], allowance=1)
    assert choose_next([warm, cold_ready], free) == 1
    due = _view([8, 8], passed=1, allowance=1)
    assert choose_next([due, cold_ready], free) == 0


def _plan(ram: int, kv: int, slots: int = 4, kv_cells: int = 0) -> MemoryPlan:
    host = Device("CPU", "cpu", free=ram, total=ram)
    use = DeviceUse("CPU", weights=1000, kv=kv, compute=200, layers=30)
    return MemoryPlan(
        n_slots=slots,
        n_ctx_per_slot=4096,
        n_gpu_layers=0,
        n_layer=30,
        kv_cells=kv_cells or 4096 * slots,
        uses=[use],
        devices=[host],
        budgets={"CPU": ram},
        prefix_cache=100,
    )


def test_prefill_ahead_sequences_take_only_the_memory_the_plan_leaves() -> None:
    # 4 slots' KV is 400 bytes: 100 a stream. The plan uses 1,700 with its prefix cache;
    # within 75 % of 2,400 (1,800) one more stream fits, within 75 % of 4,000 (3,000) all 4.
    assert ahead_that_fits(_plan(2400, 400), 4) == 1
    assert ahead_that_fits(_plan(4000, 400), 4) == 4
    assert ahead_that_fits(_plan(2000, 400), 4) == 0
    assert ahead_that_fits(_plan(4000, 400), 0) == 0
    # An overcommitted unified pool: the sequences share its cells, nothing more is needed.
    assert ahead_that_fits(_plan(2000, 400, kv_cells=1024), 4) == 4
    # Without llama.cpp's measure, the plan counts them as a slot's KV each.
    grown = with_ahead(_plan(4000, 400), 2)
    assert grown.n_ahead == 2 and grown.uses[0].kv == 600
    assert with_ahead(_plan(2000, 400, kv_cells=1024), 4).uses[0].kv == 400


def test_in_a_unified_cache_a_parked_prompt_leaves_no_cells_behind(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    config = RunnerConfig(
        model_path=str(path), n_slots=1, n_ctx_per_slot=256, kv_cells=200, n_threads=2, n_ahead=1
    )
    model = LlamaModel(config)
    try:
        assert model.unified_kv
        prompts = {
            f"q{i}": model.tokenize(f"question number {i} about the tiny model", True)
            for i in range(3)
        }
        options = greedy(8, repeat_penalty=1.0)
        alone = {}
        for name, prompt in prompts.items():
            run = Run(model)
            run.run({name: prompt}, options)
            alone[name] = run.results[name].text
        together = Run(model)
        together.run(prompts, options)
        assert {name: r.text for name, r in together.results.items()} == alone
        assert together.engine.ahead.prefilled == 2
        ahead = together.engine.ahead.slots[0]
        assert ahead.cache == [] and model.seq_pos_max(ahead.seq_id) == -1
    finally:
        model.close()
