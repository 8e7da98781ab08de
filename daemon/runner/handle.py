"""What the daemon uses of a loaded model's runner: :class:`Runner`, the narrow type between
the scheduler (and the request path) and a runner, whether a process
(:class:`~.client.ProcessRunner`) or the unit tests' in-process fakes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from localllm.store.models import LocalModel

from .client import GenerationStream
from .protocol import (
    EmbeddingRequest,
    EmbeddingResult,
    GenerationRequest,
    GenerationResult,
    RunnerConfig,
    Stats,
    ThreadStats,
)

__all__ = ["Runner", "RunnerFactory"]


class Runner(Protocol):
    """A loaded model, as the scheduler and the request path use it."""

    health: dict[str, Any]
    """What the runner said about itself once loaded (context, slots, GPU layers...)."""

    @property
    def pid(self) -> int | None:
        """The process serving the model, if it is one."""

    def alive(self) -> bool:
        """False once the runner died or its connection is gone."""

    async def open_generation(
        self,
        request: GenerationRequest,
        on_cancelled: Callable[[GenerationResult], None] | None = None,
    ) -> GenerationStream:
        """Start a generation once its prompt is accepted (request errors raise here)."""

    async def embed(self, request: EmbeddingRequest) -> EmbeddingResult:
        """Embed texts."""

    async def stats(self) -> Stats:
        """The engine's gauges."""

    async def set_threads(
        self, threads: int, reason: str, cpus: list[int] | None = None
    ) -> ThreadStats:
        """The runner's share of the cores (its CPU governor uses at most ``threads``)."""

    async def tokenize(
        self, text: str, *, add_special: bool = False, parse_special: bool = False
    ) -> list[int]:
        """Token ids of ``text``."""

    async def detokenize(self, tokens: list[int]) -> str:
        """The text of token ids."""

    async def close(self) -> None:
        """Stop the runner (idempotent)."""


RunnerFactory = Callable[[LocalModel, RunnerConfig], Awaitable[Runner]]
"""Starts a runner for a model loaded with a config; raises ``RunnerStartError``."""
