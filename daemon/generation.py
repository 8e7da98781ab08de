"""Running one generation for any API: resolve the model, get a slot, stream, account.

The request core (:mod:`.api.core`) plans a :class:`Job` per choice and calls :func:`start`,
which loads the model and waits for a slot *before* the HTTP response starts (so 404, 503 and
load failures still get their status code), and gives up as soon as the client disconnects.
:meth:`Generation.chunks` then yields the runner's chunks and finally an :class:`Outcome`;
the slot is given back before the outcome is yielded, so a client that reads the final chunk
and asks ``/api/ps`` sees the effect of ``keep_alive: 0`` already.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import TypeVar

from fastapi import Request

from localllm._exceptions import SettingsError
from localllm.settings import parse_duration
from localllm.store.models import LocalModel
from localllm.store.names import parse_name

from .errors import ClientGone, HTTPProblem, problem_from
from .firsttoken import FirstToken
from .lora.sharing import adapter_uses
from .runner.client import GenerationStream, RunnerDiedError, RunnerError, TokenChunk
from .runner.protocol import (
    EmbeddingRequest,
    EmbeddingResult,
    GenerationRequest,
    RunnerConfig,
)
from .runner.protocol import GenerationResult as Result
from .scheduler import Lease
from .state import DaemonState

__all__ = [
    "Generation",
    "Job",
    "Outcome",
    "context_length",
    "embed",
    "load_only",
    "parse_keep_alive",
    "resolve_model",
    "start",
    "until_disconnect",
]

log = logging.getLogger("localllm.daemon")

T = TypeVar("T")


def resolve_model(state: DaemonState, name: str | None, field: str = "model") -> LocalModel:
    """The store's model called ``name``: 400 for a missing or malformed name, 404 if absent."""
    if not name:
        raise HTTPProblem(400, f"{field} is required", param=field)
    parsed = parse_name(name)  # InvalidNameError → 400
    return state.models.get(parsed)  # ModelNotFoundError → 404


def parse_keep_alive(value: str | float | int | None, field: str = "keep_alive") -> float | None:
    """Seconds from Ollama's keep_alive (``"5m"``, ``300``, ``-1``); None when not given."""
    if value is None or value == "":
        return None
    try:
        seconds = parse_duration(value)
    except (SettingsError, TypeError, ValueError):
        raise HTTPProblem(
            400, f"{field} must be a duration like 5m, 1h or a number of seconds", param=field
        ) from None
    if seconds != seconds or abs(seconds) == float("inf"):
        raise HTTPProblem(400, f"{field} must be a finite duration", param=field)
    return seconds


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnect(request: Request, awaitable: Awaitable[T]) -> T:
    """Await ``awaitable``, cancelling it if the client disconnects first (→ ClientGone).

    It runs in the calling task, which a watcher of the connection cancels when the client
    goes: a task of its own for it started a loop turn later and waited in ``asyncio.wait``
    (75 against 2 us to its first line after an idle gap), on every generation's way to the
    runner."""
    task = asyncio.current_task()
    assert task is not None, "until_disconnect runs in a task"
    watcher: asyncio.Task[None] | None = None
    gone = over = False

    def disconnected(done: asyncio.Future[None]) -> None:
        nonlocal gone
        if not over and not done.cancelled() and done.exception() is None:
            gone = True
            task.cancel()

    def watch() -> None:
        # Started once the work waits (a disconnect before then is still read), so the
        # work's first steps (a generation's hand-over to the runner) go first.
        nonlocal watcher
        if not over:
            watcher = asyncio.ensure_future(_wait_disconnect(request))
            watcher.add_done_callback(disconnected)

    asyncio.get_running_loop().call_soon(watch)
    try:
        return await awaitable
    except asyncio.CancelledError:
        # Cancelled by the watcher (and by no one else): the client is gone.
        if gone and task.uncancel() == 0:
            raise ClientGone() from None
        raise
    finally:
        over = True
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(BaseException):
                await watcher


@dataclass
class Job:
    """A generation to run."""

    model: LocalModel
    """The model."""
    config: RunnerConfig
    """How its runner must be loaded."""
    request: GenerationRequest
    """What to ask the runner."""
    keep_alive: float | None
    """The request's keep_alive (None: the setting)."""
    api: str
    """``ollama`` or ``openai`` (metrics label)."""
    received: float = field(default_factory=time.monotonic)
    """When the daemon received the request: every duration it reports starts here."""
    planning: int = 0
    """When the request core began planning it (``perf_counter_ns``; 0: not planned there)."""
    planned: int = 0
    """When its plan was done."""
    _clock: FirstToken | None = field(default=None, repr=False)

    @property
    def clock(self) -> FirstToken:
        """Where its time to first token goes. Made when first asked for, once planning is over,
        from the planning stamps: planning itself stays one call into the prompt room."""
        if self._clock is None:
            self._clock = FirstToken(received=self.planning or None)
            if self.planning:
                self._clock.planning, self._clock.planned = self.planning, self.planned
        return self._clock


@dataclass
class Outcome:
    """How a generation ended."""

    result: Result
    """The runner's result with timings (measured from the daemon's receipt of the request)."""
    load_seconds: float
    """Time spent loading the model for this request."""
    total_seconds: float
    """From arrival at the daemon to the end."""


def _add_daemon_wait(result: Result, waited_s: float, load_s: float) -> None:
    """Make the runner's timings start when the daemon received the request.

    The runner measures from the moment the request reaches it; before that the request
    waited in the daemon for a slot (the runner's own queue is nearly always empty) and maybe
    for the model to load. TTFT and the total include both; the queue time leaves out the
    load, which is reported on its own as ``load_duration``.
    """
    t = result.timings
    waited_ms = waited_s * 1000
    t.queued_ms += max(waited_ms - load_s * 1000, 0.0)
    if t.ttft_ms:
        t.ttft_ms += waited_ms
    t.total_ms += waited_ms


class Generation:
    """A generation holding a slot whose prompt the runner accepted; iterate :meth:`chunks`
    once (or call :meth:`close` if the answer is never sent)."""

    def __init__(
        self, state: DaemonState, job: Job, lease: Lease, stream: GenerationStream, waited: float
    ) -> None:
        self.state = state
        self.job = job
        self.lease = lease
        self.stream = stream
        self.waited = waited
        """Seconds from the daemon's receipt of the request to handing it to the runner."""
        self._started_events = False
        self._pump_task: asyncio.Task[None] | None = None
        self._pump_stopped = False

    @property
    def model_name(self) -> str:
        """The model's name as people write it."""
        return self.job.model.name.short

    @property
    def prompt_tokens(self) -> int:
        """The prompt's length in tokens, as the runner counted it."""
        return self.stream.prompt_tokens

    def truncation(self) -> dict[str, int]:
        """What truncation left out of the prompt, for the final chunk (empty when nothing):
        ``truncated_messages`` (older chat messages) and ``truncated_tokens``."""
        if not self.stream.dropped_tokens and not self.stream.dropped_messages:
            return {}
        return {
            "truncated_messages": self.stream.dropped_messages,
            "truncated_tokens": self.stream.dropped_tokens,
        }

    async def chunks(self) -> AsyncIterator[TokenChunk | Outcome]:
        """Generated chunks (text with the tokens' log probabilities when asked for), then
        one :class:`Outcome`. Runner errors propagate.

        A task of its own reads the runner's events and gives the slot back as soon as the
        runner is done, so a client that reads slowly (or not at all) holds its buffered text,
        bounded by the context length, but never a slot that others are waiting for.
        """
        self._started_events = True
        items: asyncio.Queue[TokenChunk | Outcome | BaseException] = asyncio.Queue()
        self._pump_task = pump = asyncio.create_task(self._pump(items))
        _background.add(pump)
        pump.add_done_callback(_background.discard)
        try:
            while True:
                item = await items.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if isinstance(item, Outcome):
                    return
        finally:
            self._stop_pump()
            # Shielded: if this generator is being cancelled too, the pump still finishes
            # cancelling the runner request (and recording it) on its own.
            with contextlib.suppress(BaseException):
                await asyncio.shield(pump)

    def _stop_pump(self) -> None:
        pump = self._pump_task
        if pump is not None and not pump.done() and not self._pump_stopped:
            self._pump_stopped = True
            pump.cancel()

    async def _pump(self, items: asyncio.Queue[TokenChunk | Outcome | BaseException]) -> None:
        result: Result | None = None
        try:
            clock = self.job.clock
            async with self.lease:
                async for item in self.stream:
                    if isinstance(item, TokenChunk):
                        if not clock.first_chunk:
                            clock.first_chunk = FirstToken.now()
                        if item.text or item.logprobs:
                            if items.qsize() >= _MAX_UNREAD_CHUNKS:
                                raise HTTPProblem(
                                    499,
                                    "the client stopped reading its stream, so generating for "
                                    f"it stopped after {_MAX_UNREAD_CHUNKS} unread chunks",
                                    code="client_not_reading",
                                )
                            items.put_nowait(item)
                    else:
                        result = item
                        clock.runner_wait_ms = result.timings.queued_ms
                        _add_daemon_wait(result, self.waited, self.lease.load_seconds)
                        self.lease.record(item)
            if result is None:  # the runner closed the stream without a result
                raise RunnerDiedError("the runner ended the request without a result")
            items.put_nowait(self._outcome(result))
        except asyncio.CancelledError:
            log.info("%s: request ended early (client gone)", self.model_name)
            raise
        except Exception as exc:
            log.info("%s: request failed: %s", self.model_name, exc)
            items.put_nowait(exc)
        finally:
            await self.stream.aclose()

    def _outcome(self, result: Result) -> Outcome:
        try:
            self.state.metrics.observe_generation(self.model_name, self.job.api, result)
        except Exception:  # a metrics bug must not fail the answer it measures
            log.exception("could not record the metrics of a request")
        t = result.timings
        log.info(
            "%s %s: %s, prompt %d (cached %d) in %.0fms, %d tokens at %.1f tok/s, ttft %.0fms",
            self.job.api,
            self.model_name,
            result.done_reason,
            t.prompt_tokens,
            t.cached_tokens,
            t.prompt_ms,
            t.completion_tokens,
            t.decode_tokens_per_s,
            t.ttft_ms,
        )
        return Outcome(
            result=result,
            load_seconds=self.lease.load_seconds,
            total_seconds=time.monotonic() - self.job.received,
        )

    def close(self) -> None:
        """The answer is over (sent, abandoned or never started): stop the runner request if
        it still runs and give the slot back (idempotent)."""
        if self._started_events:
            # A response body that was closed leaves events() suspended at a yield; the pump
            # would otherwise keep generating for nobody until the generator is collected.
            self._stop_pump()
            return
        self._started_events = True
        self.lease.release()
        task = asyncio.get_running_loop().create_task(self.stream.aclose())
        _background.add(task)
        task.add_done_callback(_background.discard)


# A client this far behind its stream is not reading it (sockets and the server's own buffer
# hold about a thousand more): the request is cancelled rather than generated for nobody,
# which bounds what a connection can make the daemon hold.
_MAX_UNREAD_CHUNKS = 1024

# Cancellations of runner requests whose answer was never sent; referenced until done.
_background: set[asyncio.Task[None]] = set()


async def start(state: DaemonState, request: Request, job: Job) -> Generation:
    """Load the model, take a slot and hand ``job`` to the runner; gives up if the client goes
    away. Errors in the request itself (template, grammar, a prompt over the context) raise
    :class:`HTTPProblem` here, before any answer has started."""

    async def begin() -> Generation:
        clock = job.clock
        lease = await state.scheduler.acquire(job.model, job.config, job.keep_alive)
        clock.acquired = FirstToken.now()
        clock.load_ms = lease.load_seconds * 1000
        lease.keep_alive = job.keep_alive
        job.request.adapters = adapter_uses(job.config)
        waited = time.monotonic() - job.received
        try:
            clock.sent = FirstToken.now()
            stream = await lease.runner.open_generation(job.request, on_cancelled=lease.record)
            clock.accepted = FirstToken.now()
        except BaseException:
            lease.release()
            raise
        clock.template_ms, clock.tokenize_ms = stream.template_ms, stream.tokenize_ms
        clock.runner_read, clock.runner_ready = stream.runner_read, stream.runner_ready
        if stream.dropped_tokens or stream.dropped_messages:
            log.info(
                "%s: the prompt was longer than the context of %d tokens; dropped %d older "
                "messages and %d tokens",
                job.model.name.short,
                lease.loaded.context_length,
                stream.dropped_messages,
                stream.dropped_tokens,
            )
        return Generation(state, job, lease, stream, waited)

    try:
        return await until_disconnect(request, begin())
    except (HTTPProblem, ClientGone):
        raise
    except RunnerError as exc:
        raise problem_from(exc, job.model.name.short) from exc


async def load_only(
    state: DaemonState,
    request: Request,
    model: LocalModel,
    config: RunnerConfig,
    keep_alive: float | None,
) -> float:
    """Load ``model`` (an empty prompt's meaning); returns the seconds spent loading."""
    lease = await until_disconnect(request, state.scheduler.acquire(model, config, keep_alive))
    lease.keep_alive = keep_alive
    lease.release()
    return lease.load_seconds


async def context_length(
    state: DaemonState, request: Request, model: LocalModel, config: RunnerConfig
) -> int:
    """The context per slot ``model`` runs with under ``config``. Left open (0), the memory
    plan chooses it when the runner loads, so the model is loaded (if it is not) to know it."""
    if config.n_ctx_per_slot:
        return config.n_ctx_per_slot
    lease = await until_disconnect(request, state.scheduler.acquire(model, config))
    try:
        return lease.loaded.context_length
    finally:
        lease.release()


async def embed(
    state: DaemonState,
    request: Request,
    model: LocalModel,
    config: RunnerConfig,
    inputs: list[str],
    *,
    truncate: bool,
    keep_alive: float | None,
    token_inputs: list[list[int]] | None = None,
    rank_pairs: list[list[str]] | None = None,
) -> tuple[EmbeddingResult, float, float]:
    """Embed ``inputs`` (or ``token_inputs``, the model's own token ids), or score
    ``rank_pairs`` (``[query, document]``, a reranker): (result, load seconds, total
    seconds)."""
    started = time.monotonic()

    async def run() -> tuple[EmbeddingResult, float]:
        lease = await state.scheduler.acquire(model, config, keep_alive)
        lease.keep_alive = keep_alive
        async with lease:
            result = await lease.runner.embed(
                EmbeddingRequest(
                    id="",
                    inputs=inputs,
                    truncate=truncate,
                    token_inputs=token_inputs,
                    rank_pairs=rank_pairs,
                    adapters=adapter_uses(config),
                )
            )
        return result, lease.load_seconds

    try:
        result, load_seconds = await until_disconnect(request, run())
    except (HTTPProblem, ClientGone):
        raise
    except Exception as exc:
        raise problem_from(exc, model.name.short) from exc
    state.metrics.embedded_tokens.labels(model.name.short).inc(result.prompt_tokens)
    return result, load_seconds, time.monotonic() - started
