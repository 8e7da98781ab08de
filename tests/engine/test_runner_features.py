"""Runner features the agent APIs build on: logprobs, logit_bias, lazy grammars, context."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator

import pytest
from runner_harness import RunnerHarness, greedy
from tiny_gguf import write_tiny_gguf

from localllm.daemon.runner import (
    EmbeddingRequest,
    GenerationRequest,
    RunnerConfig,
    RunnerError,
    TokenChunk,
)
from localllm.daemon.runner.protocol import TokenLogprob


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunnerHarness]:
    """The tiny model that never ends a generation by itself: every stream runs to its limit."""
    endless = write_tiny_gguf(tmp_path_factory.mktemp("endless") / "endless.gguf", never_ends=True)
    config = RunnerConfig(model_path=str(endless), n_slots=2, n_ctx_per_slot=512, n_threads=2)
    harness = RunnerHarness(config, tmp_path_factory.mktemp("features"))
    yield harness
    harness.close()


def raw(prompt: str, **options: object) -> GenerationRequest:
    return GenerationRequest(id="", prompt=prompt, raw=True, options=greedy(**options))  # type: ignore[arg-type]


def logprobs_of(
    runner: RunnerHarness, request: GenerationRequest
) -> tuple[str, list[TokenLogprob]]:
    async def collect() -> tuple[str, list[TokenLogprob]]:
        text, entries = "", []
        async for event in runner.client.generate(request):
            if isinstance(event, TokenChunk):
                text += event.text
                entries += event.logprobs or []
        return text, entries

    return runner.run(collect())


def test_logprobs_describe_the_greedy_choice(runner: RunnerHarness) -> None:
    request = raw("logprob check: the sky", num_predict=12, repeat_penalty=1.0)
    request.options.logprobs, request.options.top_logprobs = True, 5
    text, entries = logprobs_of(runner, request)
    assert len(entries) == 12  # one per generated token (none is held back at the end)
    assert "".join(e.token for e in entries) == text
    for entry in entries:
        assert entry.logprob <= 0.0
        assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token
        assert len(entry.top_logprobs) == 5
        top = [t.logprob for t in entry.top_logprobs]
        assert top == sorted(top, reverse=True)
        # Greedy without penalties picks the most likely token.
        assert entry.top_logprobs[0].token == entry.token
        assert math.isclose(top[0], entry.logprob, abs_tol=1e-4)
        assert sum(math.exp(lp) for lp in top) <= 1.0 + 1e-4


def test_no_logprobs_unless_asked(runner: RunnerHarness) -> None:
    _, entries = logprobs_of(runner, raw("logprob check: the sky", num_predict=4))
    assert entries == []


def test_logit_bias_bans_the_greedy_token(runner: RunnerHarness) -> None:
    prompt = "bias check: the sky"
    first = runner.run(runner.client.tokenize(runner.generate(raw(prompt, num_predict=1))[0]))
    assert len(first) == 1
    banned = raw(prompt, num_predict=1)
    banned.options.logit_bias = {str(first[0]): -100.0}
    text, _ = runner.generate(banned)
    assert runner.run(runner.client.tokenize(text)) != first


@pytest.mark.parametrize(
    ("bias", "words"),
    [({"word": 1.0}, "token ids"), ({"99999999": 1.0}, "outside the vocabulary")],
)
def test_bad_logit_bias_is_refused(
    runner: RunnerHarness, bias: dict[str, float], words: str
) -> None:
    request = raw("bias check", num_predict=1)
    request.options.logit_bias = bias
    with pytest.raises(RunnerError, match=words) as refused:
        runner.generate(request)
    assert refused.value.code == "bad_request"


def test_lazy_grammar_is_free_until_its_trigger(runner: RunnerHarness) -> None:
    # The trigger never appears at the start of this model's output, so the grammar (which
    # would force "AAA...") must not constrain it; an eager grammar does.
    grammar = 'root ::= "A"+'
    eager = raw("grammar check: the sky", num_predict=6, grammar=grammar)
    assert set(runner.generate(eager)[0]) == {"A"}
    lazy = raw("grammar check: the sky", num_predict=6, grammar=grammar)
    lazy.options.grammar_triggers = [r"[\s\S]*?(NEVER-SEEN-TRIGGER)[\s\S]*"]
    free = runner.generate(raw("grammar check: the sky", num_predict=6))[0]
    assert runner.generate(lazy)[0] == free


def test_context_continues_a_generation(runner: RunnerHarness) -> None:
    first = raw("context check: once", num_predict=5)
    first.return_context = True
    _text, result = runner.generate(first)
    assert result.context is not None
    assert len(result.context) == result.timings.prompt_tokens + 5
    follow = raw(" and then", num_predict=5)
    follow.context = result.context
    _, continued = runner.generate(follow)
    tail = runner.run(runner.client.tokenize(" and then"))
    assert continued.timings.prompt_tokens == len(result.context) + len(tail)
    # The earlier exchange is in the KV cache already: only the new words are evaluated.
    assert continued.timings.cached_tokens >= result.timings.prompt_tokens


def test_context_with_foreign_tokens_is_refused(runner: RunnerHarness) -> None:
    request = raw("context check", num_predict=1)
    request.context = [1, 2, 10**9]
    with pytest.raises(RunnerError, match="not a token of this model"):
        runner.generate(request)


def test_context_shift_lets_a_generation_run_past_the_context(runner: RunnerHarness) -> None:
    prompt = "shift check: " + "the sky is blue and " * 20
    _, shifted = runner.generate(raw(prompt, num_predict=700))
    assert shifted.done_reason == "length"
    assert shifted.timings.completion_tokens == 700  # more than the 512-token context
    stopped = raw(prompt, num_predict=700)
    stopped.options.shift = False
    _, ended = runner.generate(stopped)
    assert ended.done_reason == "length"
    assert ended.timings.prompt_tokens + ended.timings.completion_tokens <= 512


def test_a_shift_never_disturbs_a_stream_sharing_its_prefix(runner: RunnerHarness) -> None:
    shared = "shared prefix check: " + "a long system prompt for both " * 10
    short = raw(shared + "short one", num_predict=40)
    alone = runner.generate(short)[0]
    # Both streams share the long prefix's cells; the long one shifts while the short one is
    # still decoding, which must not move the shared cells under it.
    together = runner.generate_many([raw(shared + "long one", num_predict=700), short])
    assert together[0][1].timings.completion_tokens == 700
    assert together[1][0] == alone


def test_no_num_predict_still_ends_after_one_context_of_tokens(runner: RunnerHarness) -> None:
    _, result = runner.generate(raw("endless check", num_predict=-1))
    assert result.done_reason == "length"
    assert result.timings.completion_tokens == 512


def test_batched_embeddings_equal_one_at_a_time(runner: RunnerHarness) -> None:
    texts = [f"embedding check {i}: " + "word " * (i % 7) for i in range(20)]
    together = runner.run(runner.client.embed(EmbeddingRequest(id="", inputs=texts))).embeddings
    for text, vector in zip(texts, together, strict=True):
        (alone,) = runner.run(
            runner.client.embed(EmbeddingRequest(id="", inputs=[text]))
        ).embeddings
        cosine = sum(a * b for a, b in zip(alone, vector, strict=True))
        assert cosine > 0.999  # both are normalised; batching changes only float rounding


def test_a_large_embedding_request_does_not_stall_a_stream(runner: RunnerHarness) -> None:
    texts = [f"stall check {i}: " + "the sky is blue " * 6 for i in range(100)]

    async def scenario() -> tuple[int, int]:
        tokens_before = tokens_during = 0
        embedding: asyncio.Future[object] | None = None
        async for event in runner.client.generate(raw("stream during embed", num_predict=400)):
            if not isinstance(event, TokenChunk):
                break
            if embedding is None:
                tokens_before += 1
                if tokens_before == 3:
                    embedding = asyncio.ensure_future(
                        runner.client.embed(EmbeddingRequest(id="", inputs=texts))
                    )
            elif not embedding.done():
                tokens_during += 1
        assert embedding is not None
        result = await embedding
        assert len(result.embeddings) == 100  # type: ignore[attr-defined]
        return tokens_before, tokens_during

    _, during = runner.run(scenario())
    # The 100 inputs need several embedding batches; the stream gets a step between each.
    assert during >= 5
