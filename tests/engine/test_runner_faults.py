"""Every runner request ends: refusals carry their id, cancels during preparation are
confirmed, bad load options never crash llama.cpp, a crashed engine ends the process."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from runner_harness import RunnerHarness, greedy, load_failure
from tiny_gguf import write_tiny_gguf

from localllm.daemon.engine.jobs import GenerationJob
from localllm.daemon.engine.loop import Engine
from localllm.daemon.engine.model import LlamaModel
from localllm.daemon.runner import (
    EmbeddingRequest,
    GenerationRequest,
    GenerationResult,
    RunnerConfig,
    RunnerError,
    RunnerProcess,
    RunnerStartError,
    TokenChunk,
)
from localllm.daemon.runner.protocol import DoneEvent, ErrorEvent, Event, SamplingOptions

# A template that takes a while to render (millions of sandboxed loop steps) and then renders
# the conversation: a request using it is still being prepared when its cancel arrives.
SLOW_TEMPLATE = (
    "{% for i in range(99999) %}{% for j in range(40) %}{% endfor %}{% endfor %}"
    "{% for m in messages %}{{ m['content'] }}{% endfor %}"
)


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunnerHarness]:
    """Three slots but a batch of two tokens: the runner must raise the batch to the slots.
    The model never ends a generation by itself, so every stream runs to its limit."""
    endless = write_tiny_gguf(tmp_path_factory.mktemp("endless") / "endless.gguf", never_ends=True)
    config = RunnerConfig(
        model_path=str(endless), n_slots=3, n_ctx_per_slot=256, n_batch=2, n_threads=2
    )
    harness = RunnerHarness(config, tmp_path_factory.mktemp("faults"))
    yield harness
    harness.close()


def test_batch_smaller_than_the_slots_is_raised_and_all_slots_serve(
    runner: RunnerHarness,
) -> None:
    assert runner.run(runner.client.health())["n_batch"] >= 3
    requests = [
        GenerationRequest(id="", prompt=f"slot {i}: the sky", raw=True, options=greedy(8))
        for i in range(3)
    ]
    results = runner.generate_many(requests)
    assert [r.done_reason for _, r in results] == ["length"] * 3


@pytest.mark.parametrize(
    ("request_", "code", "words"),
    [
        (
            GenerationRequest(id="", prompt="hi \ud800 there", raw=True),
            "bad_request",
            "lone surrogate",
        ),
        (
            GenerationRequest(
                id="",
                messages=[{"role": "user", "content": "hi"}],
                options=SamplingOptions(
                    json_schema={"type": "object", "properties": {"a": {"$ref": "#/nope"}}}
                ),
            ),
            "bad_request",
            "schema",
        ),
        (
            GenerationRequest(id="", prompt="word " * 400, raw=True),
            "context_overflow",
            "context",
        ),
    ],
    ids=["lone-surrogate", "bad-schema", "over-context"],
)
def test_refused_generations_end_with_their_error(
    runner: RunnerHarness, request_: GenerationRequest, code: str, words: str
) -> None:
    async def scenario() -> None:
        async with asyncio.timeout(20):
            await runner.client.open_generation(request_)

    with pytest.raises(RunnerError, match=words) as refused:
        runner.run(scenario())
    assert refused.value.code == code


def test_embedding_over_the_context_without_truncation_is_refused(runner: RunnerHarness) -> None:
    async def scenario() -> None:
        async with asyncio.timeout(20):
            await runner.client.embed(
                EmbeddingRequest(id="", inputs=["fine", "word " * 400], truncate=False)
            )

    with pytest.raises(RunnerError, match=r"input\[1\]") as refused:
        runner.run(scenario())
    assert refused.value.code == "context_overflow"


def test_cancel_while_the_prompt_is_prepared_is_confirmed(runner: RunnerHarness) -> None:
    cancelled: list[GenerationResult] = []
    request = GenerationRequest(
        id="",
        messages=[{"role": "user", "content": "slow to prepare"}],
        template=SLOW_TEMPLATE,
        options=greedy(8),
    )

    async def scenario() -> None:
        opening = asyncio.ensure_future(runner.client.open_generation(request, cancelled.append))
        while not runner.client._queues:  # the request is on its way to the runner
            await asyncio.sleep(0)
        opening.cancel()
        with pytest.raises(asyncio.CancelledError):
            await opening

    runner.run(scenario())
    # The runner confirmed the cancel with a final event (a dropped request would have left
    # the client waiting for its confirmation until it gave up, with nothing to report).
    assert [r.done_reason for r in cancelled] == ["cancel"]
    assert cancelled[0].timings.completion_tokens == 0
    assert runner.run(runner.client.health())["status"] == "ok"


def test_detokenize_round_trips_and_refuses_unknown_ids(runner: RunnerHarness) -> None:
    tokens = runner.run(runner.client.tokenize("the sky is blue"))
    assert runner.run(runner.client.detokenize(tokens)) == "the sky is blue"
    with pytest.raises(RunnerError, match="not in the vocabulary") as refused:
        runner.run(runner.client.detokenize([10**9]))
    assert refused.value.code == "bad_request"


def test_a_model_that_fails_to_load_is_reported_in_one_line(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 64)
    message = load_failure(
        RunnerConfig(model_path=str(broken), n_slots=1, n_ctx_per_slot=256), tmp_path
    )
    assert "\n" not in message
    assert "while loading the model" in message
    assert str(tmp_path / "r.log") in message


def test_a_crashed_engine_ends_every_request_and_refuses_new_ones(tiny_gguf: Path) -> None:
    model = LlamaModel(RunnerConfig(model_path=str(tiny_gguf), n_slots=2, n_ctx_per_slot=256))
    exited = threading.Event()
    engine = Engine(model, on_exit=exited.set)
    finals: dict[str, Event] = {}
    ended = threading.Condition()

    def emit(event: Event) -> None:
        if isinstance(event, DoneEvent | ErrorEvent):
            with ended:
                finals[str(event.id)] = event
                ended.notify_all()

    def job(name: str) -> GenerationJob:
        return GenerationJob(
            id=name,
            prompt=model.tokenize("the sky is", add_special=True),
            options=greedy(50),
            grammar=None,
            emit=emit,
        )

    def broken_decode() -> int:
        raise RuntimeError("injected fault in llama_decode")

    model.decode = broken_decode  # type: ignore[method-assign]
    try:
        # Queued before the thread starts, so all three are in the engine when it crashes.
        engine.submit(job("a"))
        engine.submit(job("b"))
        engine.submit(job("c"))  # more than the slots: one waits in the queue
        engine.start()
        assert exited.wait(20), "the engine thread must end (and tell the process) on a crash"
        assert engine.crashed
        with ended:
            assert ended.wait_for(lambda: len(finals) == 3, 20)
        for name in "abc":
            event = finals[name]
            assert isinstance(event, DoneEvent) and event.result.done_reason == "error"
        engine.submit(job("late"))
        with ended:
            assert ended.wait_for(lambda: "late" in finals, 20)
        assert isinstance(finals["late"], ErrorEvent)
    finally:
        engine.stop()


def test_closing_a_stream_early_is_confirmed_by_the_runner(runner: RunnerHarness) -> None:
    # The iterator of a stream left early is finalized on its own; that must not drop the
    # request's queue while the cancellation waits there for the runner's confirmation
    # (it did, and every early close waited out a 10-second timeout instead).
    cancelled: list[GenerationResult] = []

    async def scenario() -> None:
        request = GenerationRequest(id="", prompt="close early", raw=True, options=greedy(5000))
        stream = runner.client.generate(request, on_cancelled=cancelled.append)
        async for event in stream:
            if isinstance(event, TokenChunk):
                break
        await stream.aclose()

    runner.run(scenario())
    assert [r.done_reason for r in cancelled] == ["cancel"]
    assert cancelled[0].timings.completion_tokens >= 1


class _SilentRunner(RunnerProcess):
    """A process that says "ready" but never serves: what a runner wedged after loading is."""

    def command(self) -> list[str]:
        script = (
            "import os, sys, time\n"
            "fd = int(sys.argv[sys.argv.index('--ready-fd') + 1])\n"
            "os.write(fd, b'ready\\n')\n"
            "time.sleep(600)\n"
        )
        return [sys.executable, "-c", script]


def test_a_runner_that_never_answers_after_ready_is_stopped(tmp_path: Path) -> None:
    process = _SilentRunner(
        RunnerConfig(model_path="unused.gguf"), tmp_path / "silent.sock", tmp_path / "r.log"
    )

    async def scenario() -> None:
        await process.start(timeout=60)

    with pytest.raises(RunnerStartError, match="did not answer"):
        asyncio.run(scenario())
    assert not process.alive()  # never left running with no owner
