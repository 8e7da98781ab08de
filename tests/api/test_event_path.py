"""The per-token event path between engine, runner socket and daemon: batched, never reordered.

The engine hands a step's events over together (one wake-up and one socket write per
connection per step) and the daemon reads whatever arrived at once and splits it into lines.
These tests check what that must not change: every stream's events in order and complete, a
lone stream's token handed over in the step that made it (never held for a later step), and
lines longer than one read (an embedding batch) arriving whole next to token lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from runner_harness import RunnerHarness, greedy, loaded_model
from tiny_gguf import write_tiny_gguf

from localllm.daemon.engine.jobs import GenerationJob
from localllm.daemon.engine.loop import Engine
from localllm.daemon.engine.model import LlamaModel
from localllm.daemon.runner import EmbeddingRequest, GenerationRequest, RunnerConfig, TokenChunk
from localllm.daemon.runner.protocol import (
    DoneEvent,
    Event,
    GenerateOp,
    HealthOp,
    TokenEvent,
    decode,
    encode,
)


@pytest.fixture(scope="module")
def endless_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model whose greedy generations never end by themselves."""
    return write_tiny_gguf(tmp_path_factory.mktemp("events") / "endless.gguf", never_ends=True)


@pytest.fixture(scope="module")
def model(endless_gguf: Path) -> Iterator[LlamaModel]:
    """The tiny model loaded in this process, three slots."""
    with loaded_model(endless_gguf, n_slots=3, n_ctx_per_slot=256, n_threads=2) as llama:
        yield llama


class BatchRecorder:
    """An engine destination that takes batches, as the runner's connections do; records
    every hand-over (one list per call)."""

    def __init__(self) -> None:
        self.batches: list[list[Event]] = []
        self._lock = threading.Condition()

    def __call__(self, event: Event) -> None:
        """One event on its own."""
        self.many([event])

    def many(self, events: list[Event]) -> None:
        """Several events at once."""
        with self._lock:
            self.batches.append(list(events))
            self._lock.notify_all()

    def wait_done(self, count: int) -> None:
        """Block until ``count`` requests have their done event."""
        with self._lock:
            assert self._lock.wait_for(lambda: self.done_count() >= count, 120)

    def done_count(self) -> int:
        """Done events so far."""
        return sum(isinstance(e, DoneEvent) for batch in self.batches for e in batch)


def run_jobs(model: LlamaModel, names: list[str], num_predict: int) -> BatchRecorder:
    """Run greedy jobs on a fresh engine (all admitted in its first step); the hand-overs."""
    for seq in range(model.n_slots):
        model.seq_remove(seq, 0)
    recorder = BatchRecorder()
    engine = Engine(model)
    for index, name in enumerate(names):
        engine.submit(
            GenerationJob(
                id=name,
                prompt=model.tokenize(f"stream {index}: a b c", add_special=True),
                options=greedy(num_predict),
                grammar=None,
                emit=recorder,
            )
        )
    engine.start()
    try:
        recorder.wait_done(len(names))
    finally:
        # Not engine.stop(): that frees the model, which the next test shares.
        engine._put("stop", None)
        engine._thread.join(30)
    return recorder


def test_a_steps_events_are_handed_over_together_in_order(model: LlamaModel) -> None:
    names = ["a", "b", "c"]
    recorder = run_jobs(model, names, num_predict=10)
    # Three streams decoding together: their tokens of one step come in one hand-over.
    assert any(len({e.id for e in batch}) == 3 for batch in recorder.batches)
    events = [e for batch in recorder.batches for e in batch]
    for name in names:
        mine = [e for e in events if e.id == name]
        assert isinstance(mine[-1], DoneEvent), "done comes last"
        tokens = [e for e in mine[:-1] if isinstance(e, TokenEvent)]
        assert len(tokens) == len(mine) - 1
        assert "".join(e.text for e in tokens) == mine[-1].result.text
        assert mine[-1].result.timings.completion_tokens == 10


def test_a_lone_streams_token_is_handed_over_in_its_own_step(model: LlamaModel) -> None:
    recorder = run_jobs(model, ["solo"], num_predict=12)
    tokens_per_batch = [sum(isinstance(e, TokenEvent) for e in batch) for batch in recorder.batches]
    # One token per step: were any held for a later step, a hand-over would carry two.
    assert max(tokens_per_batch) == 1
    assert sum(tokens_per_batch) >= 8  # text may lag a token (a partial character), not more
    assert isinstance(recorder.batches[-1][-1], DoneEvent)


@pytest.fixture(scope="module")
def runner(endless_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunnerHarness]:
    """A real runner process on the tiny model."""
    config = RunnerConfig(model_path=str(endless_gguf), n_slots=3, n_ctx_per_slot=256, n_threads=2)
    harness = RunnerHarness(config, tmp_path_factory.mktemp("events-runner"))
    yield harness
    harness.close()


def test_long_lines_and_token_lines_arrive_whole_over_the_socket(runner: RunnerHarness) -> None:
    async def both() -> tuple[list[list[str]], list[str], int]:
        async def stream(index: int) -> tuple[list[str], str]:
            request = GenerationRequest(id="", prompt=f"s{index} x y", options=greedy(16))
            chunks: list[str] = []
            async for item in runner.client.generate(request):
                if isinstance(item, TokenChunk):
                    chunks.append(item.text)
                else:
                    return chunks, item.text
            raise AssertionError("no result")

        # ~100 vectors of 256 floats: one line of several hundred kilobytes, more than one
        # read of the socket, written while two streams' token lines flow.
        texts = [f"text {i}" for i in range(100)]
        embed = runner.client.embed(EmbeddingRequest(id="", inputs=texts))
        results = await asyncio.gather(stream(0), stream(1), embed)
        streams = [results[0], results[1]]
        vectors = results[2].embeddings
        assert all(len(v) == len(vectors[0]) for v in vectors)
        return [c for c, _ in streams], [t for _, t in streams], len(vectors)

    chunk_lists, texts, count = runner.run(both())
    assert count == 100
    for chunks, text in zip(chunk_lists, texts, strict=True):
        assert chunks and "".join(chunks) == text


def test_the_runner_reads_requests_however_their_bytes_arrive(runner: RunnerHarness) -> None:
    """The runner reads its requests however their bytes arrive: cut across writes, several
    in one write, each answered; a line over the limit ends that connection only."""

    async def talk() -> tuple[dict[str, str], bytes]:
        path = str(runner.process.socket_path)
        reader, writer = await asyncio.open_unix_connection(path, limit=64 << 20)
        request = GenerationRequest(id="g", prompt="a b", options=greedy(3))
        messages = [HealthOp(id="h1"), GenerateOp(id="g", request=request), HealthOp(id="h2")]
        stream = b"".join(encode(message) for message in messages)
        for cut in (len(stream) // 3, len(stream) // 2 + 7):  # three writes, lines cut anywhere
            writer.write(stream[:cut])
            await writer.drain()
            await asyncio.sleep(0.01)
            stream = stream[cut:]
        writer.write(stream)
        last: dict[str, str] = {}  # each request's last event
        while last.get("g") != "done" or len(last) < 3:
            event = decode(await reader.readline())
            last[event.id] = event.event
        writer.close()
        # A line longer than the runner reads (64 MiB) ends this connection.
        reader2, writer2 = await asyncio.open_unix_connection(path)
        end = b"?"
        with contextlib.suppress(ConnectionError):
            writer2.write(b"x" * (65 << 20))
            await writer2.drain()
        with contextlib.suppress(ConnectionError):
            end = await reader2.read()
        writer2.close()
        return last, end

    last, end = runner.run(talk())
    assert last == {"h1": "health", "g": "done", "h2": "health"}
    assert end in (b"", b"?")  # closed (reset or at its end), nothing answered
    request = GenerationRequest(id="", prompt="a b", options=greedy(3))
    text, result = runner.generate(request)  # the daemon's own connection goes on
    assert result.done_reason == "length" and text
