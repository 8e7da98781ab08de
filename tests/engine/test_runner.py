"""The runner on the tiny GGUF: batching, chunked prefill, prefix cache, stops, cancel, errors."""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from runner_harness import RunnerHarness, greedy
from tiny_gguf import write_tiny_gguf

from localllm.daemon.runner import (
    EmbeddingRequest,
    GenerationRequest,
    GenerationResult,
    RunnerConfig,
    RunnerDiedError,
    RunnerError,
    Stats,
    TokenChunk,
)

CTX = 2048


@pytest.fixture(scope="module")
def endless_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model whose greedy generations never end by themselves (see tiny_gguf)."""
    return write_tiny_gguf(tmp_path_factory.mktemp("endless") / "endless.gguf", never_ends=True)


@pytest.fixture(scope="module")
def runner(endless_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunnerHarness]:
    """A tiny-model runner with small batches, so prefill takes many steps. Its streams run
    until num_predict or the context ends them, so tests that need a long stream get one."""
    config = RunnerConfig(
        model_path=str(endless_gguf), n_slots=3, n_ctx_per_slot=CTX, n_batch=32, n_threads=2
    )
    harness = RunnerHarness(config, tmp_path_factory.mktemp("tiny-runner"))
    yield harness
    harness.close()


def raw(prompt: str, **options: object) -> GenerationRequest:
    return GenerationRequest(id="", prompt=prompt, raw=True, options=greedy(**options))  # type: ignore[arg-type]


def test_health_reports_the_configuration(runner: RunnerHarness) -> None:
    health = runner.run(runner.client.health())
    assert health["n_slots"] == 3
    assert health["n_ctx_per_slot"] == CTX
    assert health["fill_in_the_middle"] is True
    assert health["chat_template"] is True


def test_concurrent_greedy_equals_sequential(runner: RunnerHarness) -> None:
    prompts = [f"concurrency check {i}: the sky is" for i in range(5)]  # more prompts than slots
    together = runner.generate_many([raw(p) for p in prompts])
    alone = [runner.generate(raw(p)) for p in prompts]
    assert [text for text, _ in together] == [text for text, _ in alone]
    assert all(result.timings.completion_tokens > 0 for _, result in together)


def test_prefix_cache_reuses_tokens_and_changes_nothing(runner: RunnerHarness) -> None:
    prompt = "prefix cache check: " + "the blue sky is at the top " * 20
    n_prompt = len(runner.run(runner.client.tokenize(prompt)))
    first_text, first = runner.generate(raw(prompt))
    second_text, second = runner.generate(raw(prompt))
    assert first.timings.cached_tokens == 0
    # The slot kept the logits that followed the prompt: no token is evaluated again (see
    # test_kept_logits.py).
    assert second.timings.cached_tokens == n_prompt
    assert second.timings.prompt_tokens == n_prompt
    assert second_text == first_text

    longer = prompt + "and then"
    _, third = runner.generate(raw(longer))
    assert third.timings.cached_tokens >= n_prompt - 1


def test_simultaneous_requests_share_one_prefill(runner: RunnerHarness) -> None:
    system = "shared prefix check: " + "a long shared system prompt about the sky " * 25
    n_system = len(runner.run(runner.client.tokenize(system)))
    prompts = [f"{system} question {i}" for i in range(3)]
    together = runner.generate_many([raw(p) for p in prompts])
    cached = sorted(result.timings.cached_tokens for _, result in together)
    # One request computes the shared prefix; the others get it through llama_memory_seq_cp.
    assert cached[0] < n_system // 2
    assert all(c >= n_system - 2 for c in cached[1:])
    alone = [runner.generate(raw(p)) for p in prompts]
    assert [t for t, _ in together] == [t for t, _ in alone]


def test_prefix_copied_between_kv_streams_while_another_stream_runs(
    runner: RunnerHarness,
) -> None:
    # One KV stream per slot: a prefix held by another slot comes over as a copy of that
    # slot's stream (applied at the next decode), trimmed to the shared part.
    assert runner.run(runner.client.health())["kv_unified"] is False
    prefix = "stream copy check: " + "the green hill under the sky " * 15
    n_prefix = len(runner.run(runner.client.tokenize(prefix)))
    question = raw(prefix + " and then what?")
    reference, cold = runner.generate(question)

    async def scenario() -> tuple[str, GenerationResult]:
        # Two streams take two of the three slots, the first one holding the prefix: the
        # question gets the third and copies the prefix from a stream that decodes in the
        # same steps.
        streams = [
            runner.client.generate(raw(prefix + " keep going on and on", num_predict=1500)),
            runner.client.generate(raw("stream that keeps going:", num_predict=1500)),
        ]
        for stream in streams:
            async for event in stream:
                if isinstance(event, TokenChunk):
                    break
        text, result = await runner.collect(question)
        for stream in streams:
            await stream.aclose()
        return "".join(text), result

    text, warm = runner.run(scenario())
    assert cold.timings.cached_tokens < n_prefix // 2
    assert warm.timings.cached_tokens >= n_prefix - 2
    assert text == reference


def test_a_few_tokens_held_by_another_stream_are_copied_when_the_copy_pays(
    runner: RunnerHarness,
) -> None:
    # A stream copy (every cell of a 2,048-cell context) costs about 2.6 prompt tokens on a
    # CPU: a prefix another slot holds comes over once it adds 6 tokens (2048 / 400), not
    # only 16 (a burst of returning requests whose prompts differ in their last few tokens
    # evaluated them all again).
    base = "short copy check: " + "the red roof of the old barn " * 6
    tail = " by the gate"
    n_base = len(runner.run(runner.client.tokenize(base)))
    n_shared = len(runner.run(runner.client.tokenize(base + tail)))
    assert 6 <= n_shared - n_base < 16
    question = raw(base + tail + " ends where?")
    reference, _ = runner.generate(question)

    async def scenario() -> tuple[str, GenerationResult]:
        # The stream holds base + tail; the next request leaves a free slot holding base
        # (and its own tail); the question goes there, the rest of its prefix in the stream.
        stream = runner.client.generate(raw(base + tail, num_predict=1500))
        async for event in stream:
            if isinstance(event, TokenChunk):
                break
        await runner.collect(raw(base + " with a door", num_predict=2))
        text, result = await runner.collect(question)
        await stream.aclose()
        return "".join(text), result

    text, warm = runner.run(scenario())
    assert warm.timings.cached_tokens >= n_shared - 1
    assert text == reference


def test_chunked_prefill_keeps_other_streams_flowing(runner: RunnerHarness) -> None:
    long_prompt = "chunked prefill check: " + "the sky is blue " * 200  # ~1,400 tokens, 32 per step
    events: list[str] = []

    async def scenario() -> None:
        streaming = runner.client.generate(raw("stream that keeps going:", num_predict=1500))
        async for event in streaming:
            if isinstance(event, TokenChunk):
                break
        long_request = asyncio.create_task(runner.collect(raw(long_prompt, num_predict=4)))
        long_request.add_done_callback(lambda _: events.append("long-done"))
        async for _event in streaming:
            events.append("stream")
            if long_request.done():
                break
        await streaming.aclose()
        await long_request

    runner.run(scenario())
    streamed_while_prefilling = events.index("long-done")
    # ~30 steps of prefill, each carrying one token of the running stream.
    assert streamed_while_prefilling >= 10, events[:40]


def test_stop_string_spanning_tokens_is_cut(runner: RunnerHarness) -> None:
    prompt = "stop string check: the sky"
    text, _ = runner.generate(raw(prompt, num_predict=40))
    stop = text[12:15]
    assert len(stop) == 3
    expected = text[: text.find(stop)]
    stopped_text, result = runner.generate(raw(prompt, num_predict=40, stop=[stop]))
    assert stopped_text == expected
    assert stop not in stopped_text
    assert result.done_reason == "stop"


def test_num_predict_limits_length(runner: RunnerHarness) -> None:
    _, result = runner.generate(raw("length check", num_predict=7))
    assert result.done_reason in ("length", "stop")
    assert result.timings.completion_tokens <= 7


def test_prompt_longer_than_context(runner: RunnerHarness) -> None:
    too_long = "overflow check " + "sky " * 3000
    with pytest.raises(RunnerError) as info:
        runner.generate(raw(too_long))
    assert info.value.code == "context_overflow"
    assert "context" in str(info.value)
    request = raw(too_long, num_predict=8)
    request.truncate = True
    _, result = runner.generate(request)
    assert result.timings.prompt_tokens < CTX


def test_chat_template_and_hostile_templates(runner: RunnerHarness) -> None:
    chat = GenerationRequest(
        id="", messages=[{"role": "user", "content": "hello"}], options=greedy(8)
    )
    _, result = runner.generate(chat)
    assert result.done_reason in ("stop", "length")

    hostile = {
        "{{ ().__class__.__base__.__subclasses__() }}": "unsafe",
        "{{ messages.append(1) }}": "unsafe",
        "{% for m in messages %}{{ raise_exception('no way') }}{% endfor %}": "no way",
        "{% if %}": "syntax",
        "{{ .Prompt }}": "Go template",
    }
    for template, fragment in hostile.items():
        request = GenerationRequest(
            id="", messages=[{"role": "user", "content": "x"}], template=template
        )
        with pytest.raises(RunnerError) as info:
            runner.generate(request)
        assert info.value.code == "bad_request"
        assert fragment in str(info.value)
    _, after = runner.generate(chat)  # the runner is unharmed
    assert after.done_reason in ("stop", "length")


def test_fill_in_the_middle(runner: RunnerHarness) -> None:
    request = GenerationRequest(
        id="", prompt="def add(a, b):\n    return", suffix="\n\nprint(add(1, 2))", options=greedy(8)
    )
    _, result = runner.generate(request)
    assert result.timings.prompt_tokens > 5
    assert result.timings.completion_tokens > 0


def test_grammar_constrains_output(runner: RunnerHarness) -> None:
    request = raw("grammar check", num_predict=10)
    request.options.grammar = 'root ::= ("yes" | "no") "."'
    text, _ = runner.generate(request)
    assert text in ("yes.", "no.")
    bad = raw("bad grammar")
    bad.options.grammar = "root ::= ???"
    with pytest.raises(RunnerError) as info:
        runner.generate(bad)
    assert info.value.code == "bad_request"


def test_cancel_frees_the_slot(runner: RunnerHarness) -> None:
    async def scenario() -> list[str]:
        streams = [
            runner.client.generate(raw(f"cancel check {i}", num_predict=100000)) for i in range(3)
        ]
        for stream in streams:  # all three slots busy
            async for event in stream:
                if isinstance(event, TokenChunk):
                    break
        waiting = asyncio.create_task(runner.collect(raw("cancel check: waiting", num_predict=5)))
        stats = await runner.client.stats()
        busy = sum(slot.state != "idle" for slot in stats.slots)
        await streams[0].aclose()  # cancels in the runner
        _, result = await waiting
        for stream in streams[1:]:
            await stream.aclose()
        return [str(busy), result.done_reason]

    busy, reason = runner.run(scenario())
    assert busy == "3"
    assert reason in ("length", "stop")
    # aclose() returns once the runner confirmed the cancellation: the slots are free now.
    stats = runner.run(runner.client.stats())
    assert [slot.state for slot in stats.slots] == ["idle"] * 3, stats
    assert stats.waiting == 0


def test_stats_while_streaming(runner: RunnerHarness) -> None:
    async def scenario() -> tuple[int, float]:
        stream = runner.client.generate(raw("stream that keeps going:", num_predict=400))
        seen = 0
        stats = None
        async for event in stream:
            seen += isinstance(event, TokenChunk)
            if seen == 20:
                stats = await runner.client.stats()
                break
        assert stats is not None, "the stream ended early"
        await stream.aclose()
        decoding = sum(slot.state == "decode" for slot in stats.slots)
        return decoding, stats.decode_tokens_per_s

    decoding, rate = runner.run(scenario())
    assert decoding >= 1
    assert rate > 0


def test_stats_say_where_the_engine_thread_spent_its_time(runner: RunnerHarness) -> None:
    async def scenario() -> tuple[Stats, GenerationResult, list[Stats]]:
        before = await runner.client.stats()
        _, result = await runner.collect(raw("a stepped stream:", num_predict=24))
        # Nothing more to do: within a few snapshots the engine is waiting for work (it may
        # still be ending its last step when the first is taken).
        return before, result, [await runner.client.stats() for _ in range(100)]

    before, result, snapshots = runner.run(scenario())
    # While it waits, every second of the engine thread is idle, up to the snapshot.
    waiting = [
        earlier
        for earlier, later in itertools.pairwise(snapshots)
        if later.engine_seconds > earlier.engine_seconds
        and later.engine_idle_seconds - earlier.engine_idle_seconds
        == pytest.approx(later.engine_seconds - earlier.engine_seconds, abs=1e-6)
    ]
    assert waiting, "idle time never kept pace with the engine's clock"
    settled = waiting[0]
    assert snapshots[-1].engine_step_seconds == settled.engine_step_seconds
    assert snapshots[-1].engine_decodes == settled.engine_decodes

    tokens = result.timings.completion_tokens
    assert tokens == 24
    # The first token comes from the prompt's decode, each later one from a decode of its own.
    assert settled.engine_decodes - before.engine_decodes >= tokens
    decode = settled.engine_decode_seconds - before.engine_decode_seconds
    steps = settled.engine_step_seconds - before.engine_step_seconds
    idle = settled.engine_idle_seconds - before.engine_idle_seconds
    wall = settled.engine_seconds - before.engine_seconds
    assert 0 < decode < steps
    assert steps + idle <= wall + 1e-6


def test_embeddings(runner: RunnerHarness) -> None:
    result = runner.run(
        runner.client.embed(EmbeddingRequest(id="", inputs=["the sky", "the sky", "blue"]))
    )
    first, again, other = result.embeddings
    assert len(first) == 256
    assert math.isclose(math.sqrt(sum(v * v for v in first)), 1.0, rel_tol=1e-4)
    # The same text twice in one batch: equal up to float reduction order (a batch's
    # composition decides how llama.cpp sums, and that differs between CPUs).
    assert first == pytest.approx(again, abs=1e-6)
    assert first != pytest.approx(other, abs=1e-3)
    assert result.prompt_tokens > 0


def test_killed_runner_gives_a_clear_error(tiny_gguf: Path, tmp_path: Path) -> None:
    harness = RunnerHarness(
        RunnerConfig(model_path=str(tiny_gguf), n_slots=1, n_ctx_per_slot=4096), tmp_path
    )
    try:

        async def scenario() -> None:
            async for event in harness.client.generate(raw("doomed", num_predict=100000)):
                if isinstance(event, TokenChunk):
                    os.kill(harness.process.pid, signal.SIGKILL)  # type: ignore[arg-type]

        with pytest.raises(RunnerDiedError, match="runner"):
            harness.run(scenario())
        assert not harness.client.alive
        with pytest.raises(RunnerDiedError):
            harness.run(harness.client.stats())
    finally:
        harness.loop.call_soon_threadsafe(harness.loop.stop)


def test_split_model_loads_from_blob_named_parts(
    runner: RunnerHarness, endless_gguf: Path, tmp_path: Path
) -> None:
    from fakes.gguf_split import split_gguf

    parts = split_gguf(endless_gguf, tmp_path / "parts", 3)
    assert len(parts) == 3
    # In the store the parts are content-addressed blobs: nothing in their names links them.
    blobs = []
    for index, part in enumerate(parts):
        blob = tmp_path / f"sha256-{index:064d}"
        part.rename(blob)
        blobs.append(str(blob))
    config = RunnerConfig(
        model_path=blobs[0], extra_model_paths=blobs[1:], n_slots=1, n_ctx_per_slot=512, n_threads=2
    )
    split = RunnerHarness(config, tmp_path)
    try:
        prompt = "split model check: the sky is"
        assert split.generate(raw(prompt))[0] == runner.generate(raw(prompt))[0]
    finally:
        split.close()


def test_full_kv_cache_ends_one_stream_not_all(endless_gguf: Path, tmp_path: Path) -> None:
    # An overcommitted cache: two slots may each grow to 512 tokens, but only 256 cells exist.
    config = RunnerConfig(
        model_path=str(endless_gguf), n_slots=2, n_ctx_per_slot=512, kv_cells=256, n_threads=2
    )
    harness = RunnerHarness(config, tmp_path)
    try:
        prompts = ["stream that keeps going:", "stream that keeps going: too"]
        results = harness.generate_many([raw(p, num_predict=200) for p in prompts])
        assert [result.done_reason for _, result in results] == ["length", "length"]
        generated = sorted(r.timings.completion_tokens for _, r in results)
        # Each fits alone, both together do not: one was ended when the cache filled, which
        # let the other finish all of its 200 tokens instead of failing with it.
        assert generated[0] < 200
        assert generated[1] == 200
        assert harness.run(harness.client.health())["status"] == "ok"
    finally:
        harness.close()
