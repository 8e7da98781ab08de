"""Speculative decoding: the drafter and policy alone, then the engine with real llama.cpp.

The engine tests run an in-process :class:`Engine` on the tiny model with a flat decode-cost
curve, so that drafting always pays and every step verifies drafts; the outputs must be
exactly those of plain decoding.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from speculative_runs import JOBS, Run, options
from tiny_gguf import write_tiny_gguf

from localllm.daemon.engine.jobs import GenerationJob
from localllm.daemon.engine.loop import Engine
from localllm.daemon.engine.model import LlamaModel, route_llama_log
from localllm.daemon.runner.protocol import (
    RunnerConfig,
)
from localllm.daemon.speculation.policy import BatchCost, DecodeCosts, DraftPolicy, NgramDrafter

# -- drafting and deciding, no llama.cpp ------------------------------------------------------


def test_ngram_drafter_copies_what_followed_the_last_occurrence() -> None:
    drafter = NgramDrafter([5, 6, 7, 8, 9, 1, 2, 5, 6])
    assert drafter.propose(3) == [7, 8, 9]
    drafter.append(7)
    assert drafter.propose(2) == [8, 9]
    drafter.append(4)  # "6 7 4" breaks the pattern; "7 4" was never seen
    assert drafter.propose(3) == []


def test_ngram_drafter_prefers_the_longest_match_and_the_latest_occurrence() -> None:
    drafter = NgramDrafter([1, 2, 3, 10, 9, 2, 3, 20, 1, 2, 3])
    assert drafter.propose(1) == [10]  # "1 2 3" (trigram) beats the later "2 3"
    latest = NgramDrafter([1, 2, 30, 1, 2, 40, 1, 2])
    assert latest.propose(1) == [40]


def test_batch_cost_interpolates_and_extrapolates() -> None:
    cost = BatchCost({1: 1.0, 2: 1.2, 4: 1.6})
    assert cost(1) == 1.0
    assert cost(3) == pytest.approx(1.4)
    assert cost(6) == pytest.approx(2.0)


def test_decode_costs_follow_the_decodes_without_jumping() -> None:
    costs = DecodeCosts(weight=0.5)
    assert costs.curve()(8) == 8  # nothing known: linear, drafting never pays
    costs.observe(8, 0.02)
    assert not costs.ready and costs.curve()(8) == 8
    costs.observe(1, 0.01)
    assert costs.curve()(8) == 2.0
    costs.observe(1, 1.0)  # one stalled decode moves the estimate by at most twice
    assert costs.seconds[1] == 0.015
    costs.observe(4, 0.001)  # noise never makes more tokens cheaper than one
    assert costs.curve()(4) >= 1.0
    costs.observe(500, 1.0)  # prefill chunks are not tracked
    assert 500 not in costs.seconds
    # A cost measured too high is capped by what a larger batch was seen to cost: a curve
    # that forbids drafting is corrected by the first probe that drafts more.
    seeded = DecodeCosts()
    seeded.observe(1, 0.01)
    seeded.observe(2, 0.06)
    assert seeded.curve()(2) == pytest.approx(6.0)
    seeded.observe(5, 0.02)
    assert seeded.curve()(2) == pytest.approx(2.0)


def test_policy_knows_when_even_perfect_drafts_cannot_pay() -> None:
    policy = DraftPolicy(max_draft=8, acceptance=0.1)
    cost = BatchCost({1: 1.0, 2: 1.2, 4: 1.6, 8: 2.4})
    assert policy.length(8, 1, 1.0, cost) == 0  # the acceptance is too low ...
    assert policy.best_case.length(8, 1, 1.0, cost) > 0  # ... but a better one would pay
    # A draft model costing nearly a target decode per token never pays on this curve.
    assert policy.best_case.length(8, 1, 1.0, cost, draft_cost=0.9) == 0


def test_policy_probes_now_and_then_while_drafts_would_be_accepted() -> None:
    policy = DraftPolicy(max_draft=8, acceptance=0.9)
    probes = [policy.explore(8) for _ in range(2 * DraftPolicy.PROBE_EVERY)]
    assert probes.count(DraftPolicy.PROBE_DRAFT) == 2
    assert probes[DraftPolicy.PROBE_EVERY - 1] == DraftPolicy.PROBE_DRAFT
    assert policy.explore(0) == 0  # nothing proposed: nothing to probe
    doubtful = DraftPolicy(max_draft=8, acceptance=0.3)
    assert not any(doubtful.explore(8) for _ in range(3 * DraftPolicy.PROBE_EVERY))


def test_policy_drafts_only_when_it_pays() -> None:
    flat = BatchCost({1: 1.0, 64: 1.0})
    steep = BatchCost({1: 1.0, 2: 2.0})
    eager = DraftPolicy(max_draft=8, acceptance=0.9)
    assert eager.length(8, batch_tokens=1, batch_outputs=1, cost=flat) == 8
    assert eager.length(8, batch_tokens=1, batch_outputs=1, cost=steep) == 0
    doubtful = DraftPolicy(max_draft=8, acceptance=0.1)
    assert doubtful.length(8, batch_tokens=1, batch_outputs=1, cost=BatchCost({1: 1, 2: 1.3})) == 0


def test_policy_learns_acceptance_from_outcomes() -> None:
    policy = DraftPolicy(max_draft=4, acceptance=0.5)
    for _ in range(20):
        policy.learn([1, 2, 3], [1, 2, 3])
    assert policy.acceptance > 0.95
    for _ in range(20):
        policy.learn([1, 2, 3], [7])
    assert policy.acceptance < 0.1


# -- the engine ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaModel]:
    # A unified cache (a pool one cell short of 3 x 512): drafts share batches with other
    # streams there. With a KV stream per slot they go only into batches of one sequence
    # (see test_streams_draft_only_alone).
    path = write_tiny_gguf(tmp_path_factory.mktemp("spec") / "endless.gguf", never_ends=True)
    llama = LlamaModel(
        RunnerConfig(
            model_path=str(path), n_slots=3, n_ctx_per_slot=512, kv_cells=1535, n_threads=2
        )
    )
    assert llama.unified_kv
    yield llama
    llama.close()


def test_streams_draft_only_alone(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "endless.gguf", never_ends=True)
    streams = LlamaModel(
        RunnerConfig(model_path=str(path), n_slots=3, n_ctx_per_slot=512, n_threads=2)
    )
    try:
        assert not streams.unified_kv
        alone = [JOBS[0]]
        plain = Run(streams, num_draft=0).run(alone)
        speculating = Run(streams, num_draft=6)
        assert speculating.run(alone) == plain
        assert speculating.results["plain"].timings.draft_tokens > 0
        # Together, every step's batch holds several sequences: no drafts (each would cost
        # llama.cpp a pass of its own), and the same text as without speculation.
        together = Run(streams, num_draft=6)
        assert together.run(JOBS[:2]) == Run(streams, num_draft=0).run(JOBS[:2])
    finally:
        streams.close()


def test_greedy_output_is_identical_with_speculation(model: LlamaModel) -> None:
    reference = Run(model, num_draft=0)
    plain = reference.run(JOBS)
    speculating = Run(model, num_draft=6)
    assert speculating.run(JOBS) == plain
    for name, result in speculating.results.items():
        expected = reference.results[name]
        assert result.done_reason == expected.done_reason
        assert result.timings.completion_tokens == expected.timings.completion_tokens
    timings = [r.timings for r in speculating.results.values()]
    assert sum(t.draft_tokens for t in timings) > 0, "the engine must have verified drafts"
    assert sum(t.draft_accepted for t in timings) > 0
    assert all(t.draft_accepted <= t.draft_tokens for t in timings)


def test_a_steps_accepted_drafts_reach_the_client_as_one_event(model: LlamaModel) -> None:
    # Each event costs the daemon a relay and the client an HTTP chunk, whatever it holds:
    # the tokens a step accepts go out together, their log probabilities one entry each.
    jobs = [(name, prompt, options(logprobs=True)) for name, prompt, _ in JOBS[:1]]
    reference = Run(model, num_draft=0)
    plain = reference.run(jobs)
    speculating = Run(model, num_draft=6)
    assert speculating.run(jobs) == plain
    timings = speculating.results["plain"].timings
    assert timings.draft_accepted > 0
    entries, expected = speculating.logprobs["plain"], reference.logprobs["plain"]
    assert len(entries) == len(expected) == timings.completion_tokens
    assert [e.token for e in entries] == [e.token for e in expected]
    # Verified in a batch of several positions, the logits differ in their last bits.
    assert all(abs(e.logprob - x.logprob) < 1e-3 for e, x in zip(entries, expected, strict=True))
    # Without drafts a step makes one token and at most one event (none while a piece is
    # held back); with them, a step that accepted drafts made one event for its tokens.
    assert reference.events["plain"] <= timings.completion_tokens
    assert speculating.events["plain"] < reference.events["plain"]


def test_measuring_the_cost_curve_mid_step_leaves_the_batch_intact(model: LlamaModel) -> None:
    # The first step with a draft proposal measures decode costs on a scratch sequence; the
    # step's own batch must come out of it unharmed (it once lost its pending tokens).
    jobs = JOBS[:2]
    plain = Run(model, num_draft=0).run(jobs)
    measuring = Run(model, num_draft=6, measure=True)
    assert measuring.run(jobs) == plain
    assert measuring.engine.speculation.costs.ready
    assert measuring.engine.speculation.costs.curve().relative[1] == 1.0
    assert not measuring.errors


def test_long_streams_survive_context_shifts_with_no_cell_left_behind(model: LlamaModel) -> None:
    # Hundreds of tokens in, this random tiny model meets near-ties that a different batch
    # shape (drafts in the batch, other streams, a context shift re-rotating keys) can tip
    # either way, in plain decoding too; exact equality is checked on shorter streams above.
    # What must hold here: no error, every stream runs to its limit past the 512-token
    # context, and no cell is left behind (Run checks each sequence's cells).
    prompts = [(f"long{i}", f"speculation check {i}: " + "a b c d " * 20) for i in range(3)]
    past = [(name, prompt, options(num_predict=700)) for name, prompt in prompts]
    speculating = Run(model, num_draft=8)
    speculating.run(past)
    assert not speculating.errors
    for result in speculating.results.values():
        assert result.done_reason == "length"
        assert result.timings.completion_tokens == 700
        assert result.timings.draft_accepted <= result.timings.draft_tokens


def test_seeded_sampling_is_reproducible_and_unchanged_by_speculation(model: LlamaModel) -> None:
    seeded = [("seeded", "speculation check: sampled", options(temperature=0.9, seed=42))]
    plain = Run(model, num_draft=0).run(seeded)
    first = Run(model, num_draft=6).run(seeded)
    second = Run(model, num_draft=6).run(seeded)
    assert first == second == plain


def test_num_draft_zero_turns_speculation_off_per_request(model: LlamaModel) -> None:
    run = Run(model, num_draft=6)
    run.run([("off", "speculation check: off", options(num_draft=0))])
    assert run.results["off"].timings.draft_tokens == 0


def test_verbose_block_reports_drafts_only_when_there_were_some() -> None:
    from localllm.run_stats import format_timings

    final = {"total_duration": 1e9, "eval_count": 10, "eval_duration": 5e8}
    assert "draft" not in format_timings(final)
    block = format_timings({**final, "draft_count": 8, "draft_accepted_count": 6})
    assert "6 of 8 accepted (75%" in block


def test_the_cost_measurement_comes_a_decode_at_a_time(model: LlamaModel) -> None:
    # The engine takes the start-up measurement a decode at a time while nothing waits, so
    # that a model's first request waits for one decode of it, not for all of them.
    sequences = range(model.n_slots + (model.scratch_seq is not None))
    for seq in sequences:  # the shared model: empty, as a model just loaded is
        model.seq_remove(seq, 0)
    speculation = Engine(model, num_draft=6).speculation
    model.interrupt.clear()  # as the idle engine does before it takes a piece
    pieces = 0
    while speculation.measure_piece():
        pieces += 1
        assert pieces <= 9
    # a warm-up decode, then 1, 2, 4 and 8 tokens twice each
    assert pieces == 9
    assert speculation.costs.ready and speculation.costs.curve().relative[1] == 1.0
    assert not speculation.measure_piece()  # done once and for all
    # every piece left its scratch sequence empty
    assert all(model.seq_pos_max(seq) < 0 for seq in sequences)


def test_ngram_drafter_drafts_the_same_when_tokens_came_before_the_first_draft() -> None:
    # the prompt and the first tokens are indexed when a draft is first asked for
    late = NgramDrafter([5, 6, 7, 8])
    for token in (9, 5, 6):
        late.append(token)
    early = NgramDrafter([5, 6, 7, 8])
    assert early.propose(2) == []
    for token in (9, 5, 6):
        early.append(token)
    assert late.propose(3) == early.propose(3) == [7, 8, 9]


def test_the_cost_measurement_keeps_the_prefix_a_lone_slot_caches(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # One slot, a KV stream of its own, no RAM tier: the measurement runs once the first
    # request is over, on that slot, and must leave its prefix for the next request of the
    # conversation (it used to empty the slot: the next request prefilled all again).
    path = write_tiny_gguf(tmp_path_factory.mktemp("lone") / "endless.gguf", never_ends=True)
    llama = LlamaModel(
        RunnerConfig(model_path=str(path), n_slots=1, n_ctx_per_slot=512, n_threads=1)
    )
    try:
        assert llama.scratch_seq is None  # no sequence of its own to measure on
        engine = Engine(llama, num_draft=6)
        (slot,) = engine.slots
        prefix = [(7 * i) % 50 + 3 for i in range(40)]
        llama.batch.clear()
        for position, token in enumerate(prefix):
            llama.batch.add(token, position, slot.seq_id, position == len(prefix) - 1)
        assert llama.decode() == 0
        llama.batch.clear()
        slot.cache = list(prefix)
        pieces = 0
        while engine.speculation.measure_piece():
            pieces += 1
            assert pieces <= 9
        assert pieces == 9 and engine.speculation.costs.ready
        assert slot.cache == prefix
        assert llama.seq_pos_max(slot.seq_id) == len(prefix) - 1  # the prefix, nothing after
    finally:
        llama.close()


def _fill_scratch(model: LlamaModel, tokens: int) -> int:
    """A batch of ``tokens`` on the model's scratch sequence; returns the sequence."""
    assert model.scratch_seq is not None
    model.seq_remove(model.scratch_seq, 0)
    model.batch.clear()
    for position in range(tokens):
        model.batch.add(max(model.bos_id, 0), position, model.scratch_seq, True)
    return model.scratch_seq


def test_an_idle_decode_stops_when_work_arrives_and_others_do_not(model: LlamaModel) -> None:
    # The engine raises the model's interrupt when anything is sent to it; a measuring
    # decode under way then stops at llama.cpp's next graph node (its abort callback), with
    # its cells removed, instead of holding the request for the whole decode.
    assert model.interrupt.available  # libc's strlen serves as the GIL-free callback
    runner_log = io.StringIO()
    route_llama_log(runner_log, debug=True)
    scratch = _fill_scratch(model, 8)
    model.interrupt.set()
    assert model.decode_unless_interrupted() == 2
    assert model.seq_pos_max(scratch) < 0  # nothing of the stopped batch stays
    # llama.cpp's "failed to compute graph" for it is no failure: kept out of the log
    assert runner_log.getvalue() == ""
    model.interrupt.clear()
    scratch = _fill_scratch(model, 8)
    assert model.decode_unless_interrupted() == 0
    assert model.seq_pos_max(scratch) == 7
    assert "set_abort_callback" in runner_log.getvalue()  # a decode's own lines still go
    # a request being prepared raises it too, and keeps the engine's idle work off meanwhile
    with model.interrupt.expecting():
        assert model.interrupt.is_set and model.interrupt.expected
    assert not model.interrupt.expected
    # a plain decode (a request's step) never listens to the flag
    model.interrupt.set()
    scratch = _fill_scratch(model, 8)
    try:
        assert model.decode() == 0
        assert model.seq_pos_max(scratch) == 7
    finally:
        model.interrupt.clear()
        model.seq_remove(scratch, 0)
        model.batch.clear()


def test_a_measuring_decode_stopped_by_a_request_is_measured_again(model: LlamaModel) -> None:
    sequences = range(model.n_slots + (model.scratch_seq is not None))
    for seq in sequences:
        model.seq_remove(seq, 0)
    engine = Engine(model, num_draft=6)
    speculation = engine.speculation
    model.interrupt.clear()  # as the idle engine does before it takes a piece
    assert speculation.measure_piece()  # the warm-up decode
    arrives = GenerationJob(id="arrives", prompt=[1], options=options(), grammar=None, emit=print)
    engine.submit(arrives)
    assert model.interrupt.is_set  # what is sent to the engine raises it
    assert speculation.measure_piece()  # stopped: it does not count
    assert speculation.interrupted == 1 and not speculation.costs.ready
    model.interrupt.clear()  # as the idle engine does before its next piece
    pieces = 2
    while speculation.measure_piece():
        pieces += 1
        assert pieces <= 10
    # the stopped decode came again: a warm-up, then 1, 2, 4 and 8 tokens twice each
    assert pieces == 10 and speculation.interrupted == 1
    assert speculation.costs.ready and speculation.costs.curve().relative[1] == 1.0
    assert all(model.seq_pos_max(seq) < 0 for seq in sequences)
