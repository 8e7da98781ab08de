"""A prompt sent again samples its first token from the logits its slot kept: no step.

Each request's first token is compared with the same request's first run (when the logits
were computed): greedy text, a seeded sample, log probabilities. ``cached_tokens`` says whether
a step ran: a prompt evaluated again has at least one token it did not take from the cache.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from runner_harness import RunnerHarness, greedy
from tiny_gguf import write_tiny_gguf

from localllm.daemon.runner import (
    GenerationRequest,
    GenerationResult,
    RunnerConfig,
    SamplingOptions,
    TokenChunk,
)
from localllm.daemon.runner.protocol import TokenLogprob


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunnerHarness]:
    """One slot, so that every request lands where the last one was."""
    endless = write_tiny_gguf(tmp_path_factory.mktemp("endless") / "endless.gguf", never_ends=True)
    config = RunnerConfig(model_path=str(endless), n_slots=1, n_ctx_per_slot=512, n_threads=2)
    harness = RunnerHarness(config, tmp_path_factory.mktemp("kept"))
    yield harness
    harness.close()


def raw(prompt: str, options: SamplingOptions | None = None) -> GenerationRequest:
    return GenerationRequest(
        id="", prompt=prompt, raw=True, options=options or greedy(8, repeat_penalty=1.0)
    )


def answer(
    runner: RunnerHarness, request: GenerationRequest
) -> tuple[str, list[TokenLogprob], GenerationResult]:
    async def collect() -> tuple[str, list[TokenLogprob], GenerationResult]:
        text, entries = "", []
        async for event in runner.client.generate(request):
            if isinstance(event, TokenChunk):
                text += event.text
                entries += event.logprobs or []
            else:
                return text, entries, event
        raise AssertionError("the stream ended without a result")

    return runner.run(collect())


def test_the_same_prompt_again_takes_no_step_and_answers_the_same(runner: RunnerHarness) -> None:
    prompt = "kept check: the lighthouse keeper"
    first, _, before = answer(runner, raw(prompt))
    assert before.timings.cached_tokens < before.timings.prompt_tokens
    again, _, after = answer(runner, raw(prompt))
    assert after.timings.prompt_tokens == before.timings.prompt_tokens
    assert after.timings.cached_tokens == after.timings.prompt_tokens  # no token evaluated
    assert again == first
    assert after.timings.completion_tokens == 8


def test_a_prompt_that_differs_anywhere_is_evaluated(runner: RunnerHarness) -> None:
    prompt = "kept check: the harbour master"
    answer(runner, raw(prompt))
    for other in (prompt + " and", prompt[:-3], prompt.replace("harbour", "harbor")):
        _, _, result = answer(runner, raw(other))
        assert result.timings.cached_tokens < result.timings.prompt_tokens, other
        # and the slot now holds the other prompt: the first one is evaluated again too
        _, _, back = answer(runner, raw(prompt))
        assert back.timings.cached_tokens < back.timings.prompt_tokens


def test_a_seeded_sample_and_logprobs_come_out_as_from_a_step(runner: RunnerHarness) -> None:
    prompt = "kept check: the ferry"
    sampled = SamplingOptions(temperature=1.0, seed=11, num_predict=8, top_k=0, top_p=1.0)
    sampled.logprobs, sampled.top_logprobs = True, 4
    answer(runner, raw("kept check: something else first"))  # the slot holds another prompt
    fresh, fresh_logprobs, evaluated = answer(runner, raw(prompt, sampled))
    assert evaluated.timings.cached_tokens < evaluated.timings.prompt_tokens
    kept, kept_logprobs, reused = answer(runner, raw(prompt, sampled))
    assert reused.timings.cached_tokens == reused.timings.prompt_tokens
    assert kept == fresh
    assert len(kept_logprobs) == len(fresh_logprobs) == 8
    first, again = fresh_logprobs[0], kept_logprobs[0]
    assert (again.token, again.logprob) == (first.token, first.logprob)
    assert [(t.token, t.logprob) for t in again.top_logprobs] == [
        (t.token, t.logprob) for t in first.top_logprobs
    ]
