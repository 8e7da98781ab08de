"""A real runner process driven from synchronous tests through a background event loop."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from localllm.daemon.runner import (
    GenerationRequest,
    GenerationResult,
    RunnerClient,
    RunnerConfig,
    RunnerProcess,
    RunnerStartError,
    SamplingOptions,
    TokenChunk,
)

if TYPE_CHECKING:
    from localllm.daemon.engine.model import LlamaModel

T = TypeVar("T")

__all__ = ["RunnerHarness", "greedy", "load_failure", "loaded_model"]


@contextlib.contextmanager
def loaded_model(path: Path, **config: Any) -> Iterator[LlamaModel]:
    """The model at ``path`` loaded in this process (``config``: :class:`RunnerConfig`'s
    fields), closed when the block ends."""
    from localllm.daemon.engine.model import LlamaModel

    model = LlamaModel(RunnerConfig(model_path=str(path), **config))
    try:
        yield model
    finally:
        model.close()


def greedy(num_predict: int = 24, **options: Any) -> SamplingOptions:
    """Deterministic sampling for comparisons."""
    return SamplingOptions(temperature=0.0, num_predict=num_predict, **options)


def load_failure(config: RunnerConfig, workdir: Path) -> str:
    """Start a runner that must fail to load; returns the start error's message once the
    process is gone (the log is ``workdir / "r.log"``)."""
    process = RunnerProcess(config, workdir / "r.sock", workdir / "r.log")
    try:
        asyncio.run(process.start(timeout=60))
    except RunnerStartError as exc:
        assert not process.alive()
        return str(exc)
    asyncio.run(process.stop())
    raise AssertionError("the runner started")


class RunnerHarness:
    """Starts ``python -m localllm.daemon.runner`` and exposes blocking helpers."""

    def __init__(self, config: RunnerConfig, workdir: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.process = RunnerProcess(config, workdir / "runner.sock", workdir / "runner.log")
        self.client: RunnerClient = self.run(self.process.start(timeout=120))

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = 180) -> T:
        """Run a coroutine on the harness loop and wait for it."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    async def collect(self, request: GenerationRequest) -> tuple[list[str], GenerationResult]:
        """Stream one generation to the end: its text chunks and the result."""
        chunks: list[str] = []
        async for event in self.client.generate(request):
            if isinstance(event, TokenChunk):
                chunks.append(event.text)
            else:
                return chunks, event
        raise AssertionError("the stream ended without a result")

    def generate(
        self, request: GenerationRequest, timeout: float = 180
    ) -> tuple[str, GenerationResult]:
        """Blocking: generate and return (streamed text, result)."""
        chunks, result = self.run(self.collect(request), timeout)
        assert "".join(chunks) == result.text, "streamed chunks must add up to the final text"
        return result.text, result

    def generate_many(
        self, requests: list[GenerationRequest], timeout: float = 180
    ) -> list[tuple[str, GenerationResult]]:
        """Blocking: run requests concurrently."""

        async def all_of() -> list[tuple[list[str], GenerationResult]]:
            return await asyncio.gather(*(self.collect(r) for r in requests))

        return [("".join(chunks), result) for chunks, result in self.run(all_of(), timeout)]

    def close(self) -> None:
        """Stop the runner and the loop."""
        try:
            self.run(self.client.close(), timeout=30)
            self.run(self.process.stop(), timeout=60)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
