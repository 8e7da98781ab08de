"""The daemon's side of a runner: start the process, talk to it, notice when it dies.

:class:`RunnerProcess` spawns ``python -m localllm.daemon.runner`` for one model and waits until
it answers. :class:`RunnerClient` multiplexes requests over the runner's Unix socket: each
request gets its own queue of events, keyed by id. If the connection drops (the runner crashed
or was killed), every pending request fails with :class:`RunnerDiedError`, which says how the
process ended (its exit status or signal) and the cause line of its log, whether it died while
loading or in the middle of a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localllm._format import exit_status

from ..devices.faults import EXIT_DEVICE_FAULT, gpu_cause
from ..devices.gpuinfo import HIDDEN_GPUS
from ..devices.workers import probe_all
from . import protocol
from .lines import LineProtocol, LineSplitter, open_lines

if TYPE_CHECKING:
    from .spare import SparePool

__all__ = [
    "DoesNotFitError",
    "GenerationStream",
    "ProcessRunner",
    "RunnerClient",
    "RunnerDiedError",
    "RunnerError",
    "RunnerProcess",
    "RunnerStartError",
    "TokenChunk",
    "plan_only",
]

log = logging.getLogger("localllm.daemon")

# Lines can carry a whole embedding batch; allow large ones.
_LINE_LIMIT = 64 << 20
# Bytes asked of the socket per read: a step of many streams' events in one go.
_READ_SIZE = 1 << 18
# A cancelled request is confirmed at the engine's next step; don't wait forever for it.
_CANCEL_CONFIRM_S = 10.0
# Finding out why a runner went away (checking its RPC workers) must not hold its requests'
# errors back for long.
_EXPLAIN_S = 10.0


class RunnerError(Exception):
    """The runner refused or failed one request; ``code`` says which kind of failure.

    Codes: ``bad_request`` (invalid options, grammar or template), ``context_overflow``
    (prompt longer than the context), ``unsupported`` (e.g. FIM on a model without FIM
    tokens), ``internal``.
    """

    def __init__(self, message: str, code: str = "internal") -> None:
        super().__init__(message)
        self.code = code


class RunnerDiedError(RunnerError):
    """The runner process went away while requests were in flight."""

    def __init__(self, message: str, returncode: int | None = None) -> None:
        super().__init__(message, "runner_died")
        self.returncode = returncode
        """The runner's exit status (negative: the signal), when it was seen to end."""


class RunnerStartError(RunnerError):
    """The runner process could not load the model; the message says why in one line."""

    def __init__(
        self, message: str, returncode: int | None = None, gpu_failure: str | None = None
    ) -> None:
        super().__init__(message, "load_failed")
        self.returncode = returncode
        """The runner's exit status (negative: the signal), when it died while loading."""
        self.gpu_failure = gpu_failure
        """The GPU's own line about failing, when the GPU is why the load died."""


class DoesNotFitError(RunnerStartError):
    """The runner's memory plan found no load that fits, before allocating anything."""

    def __init__(self, report: dict[str, Any]) -> None:
        super().__init__("the model does not fit in the memory that is free")
        self.report = report
        """The plan's :class:`~localllm.daemon.memory.plan.NoFitReport`, as a dict."""


@dataclass(frozen=True)
class TokenChunk:
    """Text generated for a request since the previous chunk."""

    text: str
    """The new text (always whole UTF-8 characters)."""
    logprobs: list[protocol.TokenLogprob] | None = None
    """Log probabilities of the tokens since the previous chunk, when the request asked."""


@dataclass(frozen=True)
class _Died:
    """Put on every pending queue when the connection to the runner is lost."""

    message: str
    returncode: int | None = None


_Item = protocol.Event | _Died


def _raise_for(event: _Item) -> None:
    if isinstance(event, _Died):
        raise RunnerDiedError(event.message, event.returncode)
    if isinstance(event, protocol.ErrorEvent):
        raise RunnerError(event.message, event.code)


class GenerationStream:
    """One generation in flight whose prompt the runner has accepted.

    Iterate it for :class:`TokenChunk` items and a final :class:`GenerationResult`. Leaving
    early (``aclose()``, a cancelled task) cancels the request in the runner and returns once
    the runner has freed the slot; the cancelled request's result goes to ``on_cancelled``.
    """

    def __init__(
        self,
        client: RunnerClient,
        request_id: str,
        queue: asyncio.Queue[_Item],
        on_cancelled: Callable[[protocol.GenerationResult], None] | None,
    ) -> None:
        self.request_id = request_id
        """The runner request's id."""
        self.prompt_tokens = 0
        """Prompt length in tokens, known once the runner accepted the prompt."""
        self.prompt_tail = ""
        """The end of the rendered prompt (does it open a reasoning block?)."""
        self.dropped_messages = 0
        """Older chat messages truncation left out to fit the context."""
        self.dropped_tokens = 0
        """Prompt tokens truncation left out (those messages' included)."""
        self.template_ms = 0.0
        """The runner's time rendering the chat template."""
        self.tokenize_ms = 0.0
        """The runner's time tokenizing the prompt."""
        self.runner_read = 0
        """When the runner read the request (``perf_counter_ns``; 0: not said)."""
        self.runner_ready = 0
        """When the runner accepted the prompt (``perf_counter_ns``; 0: not said)."""
        self._client = client
        self._queue = queue
        self._on_cancelled = on_cancelled
        self._early: protocol.DoneEvent | None = None
        self._over = False
        self._closing: asyncio.Future[None] | None = None

    async def _accepted(self) -> None:
        """Wait for the runner to accept or refuse the prompt (refusal raises)."""
        event = await self._queue.get()
        if isinstance(event, protocol.PromptReadyEvent):
            self.prompt_tokens = event.prompt_tokens
            self.prompt_tail = event.prompt_tail
            self.dropped_messages = event.dropped_messages
            self.dropped_tokens = event.dropped_tokens
            self.template_ms = event.template_ms
            self.tokenize_ms = event.tokenize_ms
            self.runner_read, self.runner_ready = event.read_at, event.ready_at
        elif isinstance(event, protocol.DoneEvent):  # cancelled while the prompt was being prepared
            self._early = event
        else:
            self._over = True
            _raise_for(event)
            raise RunnerError(f"unexpected {event.event!r} event before the prompt was ready")

    def __aiter__(self) -> AsyncIterator[TokenChunk | protocol.GenerationResult]:
        return self._events()

    async def _events(self) -> AsyncIterator[TokenChunk | protocol.GenerationResult]:
        try:
            while True:
                event = self._early or await self._queue.get()
                self._early = None
                if isinstance(event, protocol.TokenEvent):
                    yield TokenChunk(text=event.text, logprobs=event.logprobs)
                elif isinstance(event, protocol.DoneEvent):
                    self._over = True
                    yield event.result
                    return
                elif isinstance(event, protocol.PromptReadyEvent):
                    continue
                else:
                    self._over = True
                    _raise_for(event)
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        """Cancel the request unless it is over, and return once the runner confirmed it;
        idempotent. Every caller waits for the same closing, which alone drops the request's
        queue: an iterator of this stream finalized early (its ``finally`` calls this too)
        must not drop it while the cancellation still waits for its confirmation there."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close())
        await asyncio.shield(self._closing)

    async def _close(self) -> None:
        if not self._over:
            self._over = True
            if self._client.alive:
                await self._cancel()
        self._client._forget(self.request_id)

    async def _cancel(self) -> None:
        with contextlib.suppress(RunnerError, ConnectionError, TimeoutError):
            await self._client._send(protocol.CancelOp(id=self.request_id))
            async with asyncio.timeout(_CANCEL_CONFIRM_S):
                while not isinstance(
                    event := await self._queue.get(),
                    protocol.DoneEvent | protocol.ErrorEvent | _Died,
                ):
                    pass
            if isinstance(event, protocol.DoneEvent) and self._on_cancelled is not None:
                self._on_cancelled(event.result)


class RunnerClient:
    """An asyncio connection to one runner, shared by all requests to its model."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        explain_loss: LossExplainer | None = None,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self.explain_loss = explain_loss
        """Asked, once the connection drops, how the runner ended (its exit status and log's
        cause line, or the RPC worker that took it down): (message, exit status)."""
        self._queues: dict[str, asyncio.Queue[_Item]] = {}
        self._ids = itertools.count(1)
        self._write_lock = asyncio.Lock()
        self._closed_reason: str | None = None
        self._closing = False
        self._lines = LineSplitter(self._route, _LINE_LIMIT)
        self._protocol: LineProtocol | None = None
        self._reader_task = asyncio.create_task(self._read_loop())

    @classmethod
    async def connect(
        cls, socket_path: str | Path, explain_loss: LossExplainer | None = None
    ) -> RunnerClient:
        """Connect to a runner's socket; ``explain_loss`` (see :attr:`explain_loss`) turns a
        lost connection into how the runner ended."""
        reader, writer, protocol = await open_lines(socket_path, _LINE_LIMIT)
        client = cls(reader, writer, explain_loss)
        # Lines are routed as their bytes arrive (see .lines), not a loop turn later.
        client._protocol = protocol
        protocol.attach(client._lines.feed)
        return client

    @property
    def alive(self) -> bool:
        """False once the connection is gone."""
        return self._closed_reason is None

    def _next_id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._ids)}"

    async def _read_loop(self) -> None:
        reason = "the runner closed its connection"
        try:
            # Whatever has arrived is read at once and split into lines: the runner writes a
            # step's events (one per stream) together, and a readline() per event would cost
            # a coroutine round trip each. Connected by connect(), the bytes go to the
            # splitter as they arrive and the reader sees only the end (or an error).
            while data := await self._reader.read(_READ_SIZE):
                self._lines.feed(data)
            if self._protocol is not None and self._protocol.error is not None:
                raise self._protocol.error
            self._lines.end()
        except (ConnectionError, asyncio.IncompleteReadError, ValueError) as exc:
            reason = f"lost the connection to the runner ({exc})"
        except asyncio.CancelledError:
            self._fail_pending(_Died("the connection to the runner was closed"))
            raise
        # No new request is sent from here on; the pending ones learn how the runner ended.
        self._closed_reason = reason
        died = _Died(reason)
        try:
            if self.explain_loss is not None and not self._closing:
                try:
                    async with asyncio.timeout(_EXPLAIN_S):
                        died = _Died(*await self.explain_loss(reason))
                except Exception:
                    log.exception("could not tell how the runner ended")
        finally:
            # Also when close() cancels the explanation: no request may wait forever.
            self._fail_pending(died)

    def _fail_pending(self, died: _Died) -> None:
        self._closed_reason = died.message
        for queue in self._queues.values():
            queue.put_nowait(died)

    def _route(self, line: bytes) -> None:
        """Put the event on one line on its request's queue."""
        try:
            event: _Item = protocol.decode(line)  # type: ignore[assignment]
        except protocol.ProtocolError as exc:
            # The runner is ours; a line we cannot read is a bug, but it must still
            # end the request it names rather than leave it waiting.
            log.error("unreadable message from the runner: %s", exc)
            if exc.id is None:
                return
            event = protocol.ErrorEvent(id=exc.id, message=str(exc), code="internal")
        queue = self._queues.get(str(getattr(event, "id", None)))
        if queue is not None:
            queue.put_nowait(event)
        else:
            log.debug("runner event for an unknown request: %s", line[:200])

    async def _send(self, message: protocol.Request) -> None:
        if self._closed_reason is not None:
            raise RunnerDiedError(self._closed_reason)
        data = protocol.encode(message)
        async with self._write_lock:
            try:
                self._writer.write(data)
                await self._writer.drain()
            except (ConnectionError, RuntimeError) as exc:
                raise RunnerDiedError(f"lost the connection to the runner ({exc})") from exc

    async def _call(self, message: protocol.Request) -> asyncio.Queue[_Item]:
        queue: asyncio.Queue[_Item] = asyncio.Queue()
        if message.id in self._queues:
            raise RunnerError(f"request id {message.id!r} is already in flight", "bad_request")
        self._queues[message.id] = queue
        try:
            await self._send(message)
        except BaseException:
            self._forget(message.id)
            raise
        return queue

    def _forget(self, request_id: str) -> None:
        self._queues.pop(request_id, None)

    async def _single(self, message: protocol.Request) -> protocol.Event:
        queue = await self._call(message)
        try:
            event = await queue.get()
            _raise_for(event)
            return event  # type: ignore[return-value]
        finally:
            self._forget(message.id)

    async def open_generation(
        self,
        request: protocol.GenerationRequest,
        on_cancelled: Callable[[protocol.GenerationResult], None] | None = None,
    ) -> GenerationStream:
        """Send a generation and wait until the runner accepts its prompt.

        Errors in the request itself (template, grammar, a prompt over the context) raise
        :class:`RunnerError` here, before any token, so an HTTP answer can still be a 4xx.
        """
        if not request.id:
            request.id = self._next_id("gen")
        queue = await self._call(protocol.GenerateOp(id=request.id, request=request))
        stream = GenerationStream(self, request.id, queue, on_cancelled)
        try:
            await stream._accepted()
        except BaseException:
            await stream.aclose()
            raise
        return stream

    async def generate(
        self,
        request: protocol.GenerationRequest,
        on_cancelled: Callable[[protocol.GenerationResult], None] | None = None,
    ) -> AsyncIterator[TokenChunk | protocol.GenerationResult]:
        """Stream a generation: :class:`TokenChunk` items, then one :class:`GenerationResult`.

        Leaving the iteration early (``aclose()``, or cancelling the task) cancels the request
        in the runner; ``aclose()`` returns once the runner has freed the slot, and the
        cancelled request's result (timings so far) goes to ``on_cancelled``.
        """
        stream = await self.open_generation(request, on_cancelled)
        try:
            async for item in stream:
                yield item
        finally:
            await stream.aclose()

    async def embed(self, request: protocol.EmbeddingRequest) -> protocol.EmbeddingResult:
        """Embed texts with the runner's embedding context."""
        if not request.id:
            request.id = self._next_id("emb")
        event = await self._single(protocol.EmbedOp(id=request.id, request=request))
        assert isinstance(event, protocol.EmbeddingEvent)
        return event.result

    async def stats(self) -> protocol.Stats:
        """The runner's gauges."""
        event = await self._single(protocol.StatsOp(id=self._next_id("stats")))
        assert isinstance(event, protocol.StatsEvent)
        return event.stats

    async def set_threads(
        self, threads: int, reason: str, cpus: list[int] | None = None
    ) -> protocol.ThreadStats:
        """Give the runner its share of the cores (see :class:`ThreadsOp`); its governor's
        state as it stands."""
        op = protocol.ThreadsOp(
            id=self._next_id("threads"), threads=threads, reason=reason, cpus=cpus
        )
        event = await self._single(op)
        assert isinstance(event, protocol.ThreadsEvent)
        return event.threads

    async def load_adapters(self, files: list[protocol.AdapterFile]) -> list[protocol.AdapterStats]:
        """Load LoRA adapters on the runner's base model (see :class:`AdaptersOp`); every
        adapter it holds afterwards. A refused one raises :class:`RunnerError` naming it."""
        op = protocol.AdaptersOp(id=self._next_id("adapters"), adapters=files)
        event = await self._single(op)
        assert isinstance(event, protocol.AdaptersEvent)
        return event.adapters

    async def health(self) -> dict[str, Any]:
        """Model facts and readiness: ``{status, n_slots, n_ctx_per_slot, gpu_layers, ...}``."""
        event = await self._single(protocol.HealthOp(id=self._next_id("health")))
        assert isinstance(event, protocol.HealthEvent)
        return event.health

    async def tokenize(
        self, text: str, *, add_special: bool = False, parse_special: bool = False
    ) -> list[int]:
        """Token ids of ``text`` (by default no special-token parsing and no BOS)."""
        op = protocol.TokenizeOp(
            id=self._next_id("tok"), text=text, add_special=add_special, parse_special=parse_special
        )
        event = await self._single(op)
        assert isinstance(event, protocol.TokensEvent)
        return list(event.tokens)

    async def detokenize(self, tokens: list[int]) -> str:
        """The text of token ids."""
        event = await self._single(protocol.DetokenizeOp(id=self._next_id("detok"), tokens=tokens))
        assert isinstance(event, protocol.TextEvent)
        return event.text

    async def close(self) -> None:
        """Close the connection (the runner keeps running)."""
        self._closing = True
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()
        self._reader_task.cancel()
        with contextlib.suppress(BaseException):
            await self._reader_task


LossExplainer = Callable[[str], Awaitable[tuple[str, int | None]]]
"""Turns the reason a runner's connection was lost into (how the runner ended, exit status)."""

# Lines of a runner log that say why it died, best first: Python's fault handler (a signal in
# native code), llama.cpp's assertions, the runner's own error, llama.cpp's loader errors.
_CAUSES = (
    re.compile(r"Fatal Python error: .*"),
    re.compile(r"GGML_ASSERT\(.*"),
    re.compile(r"ERROR localllm[.\w]*: (.*)"),
    re.compile(r"(?:error|failed)[^\n]*", re.IGNORECASE),
)
# How much of a log's end is searched for the cause of a death in the middle of serving.
_TAIL_BYTES = 64 << 10


def _device_fault_line(path: Path, since: int) -> str | None:
    """The engine's last ``the GPU ...: the runner exits`` line after byte ``since``."""
    try:
        with open(path, "rb") as log_file:
            log_file.seek(max(since, log_file.seek(0, os.SEEK_END) - _TAIL_BYTES))
            lines = log_file.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if (start := line.find("the GPU ")) >= 0 and line.endswith(": the runner exits"):
            return line[start : -len(": the runner exits")][:300]
    return None


def _cause_line(path: Path, since: int, *, newest: bool = False) -> str:
    """One line saying why a runner died, from what it logged after ``since``: the first
    matching line of a load, or (``newest``) the last one near the end of a long log."""
    try:
        with open(path, "rb") as log_file:
            if newest:
                since = max(since, log_file.seek(0, os.SEEK_END) - _TAIL_BYTES)
            log_file.seek(since)
            lines = log_file.read(1 << 20).decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    for pattern in _CAUSES:
        for line in reversed(lines) if newest else lines:
            if match := pattern.search(line):
                cause = match.group(match.lastindex or 0).strip()
                return cause[:300]
    # A load's last words are worth showing; a long-serving runner's last line is not a cause.
    return lines[-1].strip()[:300] if lines and not newest else ""


def runner_environment(config: protocol.RunnerConfig) -> dict[str, str] | None:
    """The environment a runner starts with: the daemon's, and for a CPU-only runner (the
    fallback after a GPU failed) every GPU backend's devices hidden, so that llama.cpp does
    not even start them (llama.cpp's Metal backend has no such switch: there ``num_gpu`` 0
    alone keeps the layers on the CPU)."""
    if not config.cpu_only:
        return None
    return {**os.environ, **HIDDEN_GPUS}


def _death(code: int, cause: str, log_path: Path, during: str = "", gpu: str | None = None) -> str:
    """``the runner was killed by SIGILL (illegal instruction)<during>: <cause> — <hint>
    (full log: ...)``; with ``gpu`` (the GPU's own line about failing), ``the GPU failed
    (<gpu>): the runner was killed by SIGABRT ...``."""
    if code == EXIT_DEVICE_FAULT:
        return f"the GPU failed{during}: {cause or 'see the log'} (full log: {log_path})"
    text = f"the runner {exit_status(code)}{during}" + (f": {cause}" if cause and not gpu else "")
    if gpu:
        text = f"the GPU failed ({gpu}): {text}"
    if code == -signal.SIGILL:
        text += " — llama.cpp's native code used an instruction this CPU cannot run"
    return f"{text} (full log: {log_path})"


# The most a runner writes on its ready pipe (a memory report is a few kilobytes).
_READY_LIMIT = 1 << 20


def _read_line(fd: int, data: bytes = b"") -> bytes:
    """The first line written to the pipe ``fd`` (``ready``, or ``nofit`` and a report), or
    what came before its writer closed it; ``data``: what was read of it already."""
    while b"\n" not in data and len(data) < _READY_LIMIT and (chunk := os.read(fd, 65536)):
        data += chunk
    return data


class RunnerProcess:
    """A runner child process for one model."""

    def __init__(self, config: protocol.RunnerConfig, socket_path: Path, log_path: Path) -> None:
        self.config = config
        """How the model is loaded."""
        self.socket_path = socket_path
        """Where the runner listens."""
        self.log_path = log_path
        """The runner's log (llama.cpp's output goes here)."""
        self.process: subprocess.Popen[bytes] | None = None
        """The child process once started."""
        self._log_start = 0

    def command(self) -> list[str]:
        """The command line that starts the runner."""
        # -P: never put the working directory on sys.path (a source checkout there would
        # shadow the installed package).
        return [sys.executable, "-P", "-m", "localllm.daemon.runner", *self.arguments()]

    def arguments(self) -> list[str]:
        """The runner's arguments (what a spare runner is handed, too)."""
        c = self.config
        args = [
            "--model", c.model_path,
            "--socket", str(self.socket_path),
            "--slots", str(c.n_slots),
            "--ctx-per-slot", str(c.n_ctx_per_slot),
            "--batch", str(c.n_batch),
            "--kv-cells", str(c.kv_cells),
            "--threads", str(c.n_threads),
            "--gpu-layers", str(c.n_gpu_layers),
            "--main-gpu", str(c.main_gpu),
            "--kv-cache-type", c.kv_cache_type,
            "--flash-attention", c.flash_attention,
            "--log-file", str(self.log_path),
        ]  # fmt: skip
        for part in c.extra_model_paths:
            args += ["--model-part", part]
        if c.n_ahead:
            args += ["--ahead", str(c.n_ahead)]
        if c.fixed_threads:
            args.append("--fixed-threads")
        if not c.use_mmap:
            args.append("--no-mmap")
        if c.use_mlock:
            args.append("--mlock")
        if c.cpu_repack is not None:
            args += ["--cpu-repack", "on" if c.cpu_repack else "off"]
        if c.chat_template is not None:
            args += ["--chat-template", c.chat_template]
        if c.kv_cache_dir is not None:
            args += ["--kv-cache-dir", c.kv_cache_dir]
        if c.projector is not None:
            args += ["--projector", c.projector]
        args += ["--kv-cache-ram", str(c.kv_cache_ram), "--kv-cache-disk", str(c.kv_cache_disk)]
        for endpoint in c.rpc_workers:
            args += ["--rpc-worker", endpoint]
        for endpoint in c.rpc_lost:
            args += ["--rpc-lost", endpoint]
        args += ["--num-draft", str(c.num_draft)]
        if c.draft_model is not None:
            args += ["--draft-model", c.draft_model]
            if c.draft_name is not None:
                args += ["--draft-name", c.draft_name]
        if c.memory_plan:
            args += ["--memory-plan", "--mapped-ram", str(c.mapped_ram)]
            args += ["--gpu-memory", str(c.gpu_memory)]
            for device, amount in c.memory_reserved.items():
                args += ["--reserve", f"{device}={amount}"]
        return args

    async def start(self, timeout: float = 300.0, spares: SparePool | None = None) -> RunnerClient:
        """Start the process and return a connected client once the model is loaded.

        The runner writes ``ready`` to an inherited pipe once its socket listens; if it exits
        first, the pipe closes empty and the error says why in one line (from its log). With
        ``spares``, their spare process becomes the runner when it can (:mod:`.spare`).
        """
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        handed = None
        if spares is not None:
            with open(self.log_path, "ab") as log_file:
                log_start = self._log_start = log_file.tell()
            env = runner_environment(self.config)
            handed = await spares.hand(self.arguments(), self.log_path, env)
            spares.refill()  # once the daemon is quiet: after this load and its first request
        if handed is not None:
            self.process, ready_read, early = handed.process, handed.ready_fd, handed.early
        else:
            (log_start, ready_read), early = self._spawn(), b""
        loop = asyncio.get_running_loop()
        ready = loop.run_in_executor(None, _read_line, ready_read, early)
        try:
            signal_bytes = await asyncio.wait_for(asyncio.shield(ready), timeout)
        except TimeoutError:
            self.kill()  # the pipe's write end dies with the child, so the read returns
            await ready
            message = f"the runner did not load the model within {timeout:.0f}s"
            raise RunnerStartError(message) from None
        finally:
            if ready.done():
                os.close(ready_read)
        if signal_bytes.startswith(b"nofit "):
            await loop.run_in_executor(None, self.process.wait)
            try:
                report = json.loads(signal_bytes[6:])["nofit"]
            except (ValueError, KeyError, TypeError):
                raise RunnerStartError("the runner sent an unreadable memory report") from None
            raise DoesNotFitError(report)
        if not signal_bytes.startswith(b"ready"):
            code = await loop.run_in_executor(None, self.process.wait)
            cause = _cause_line(self.log_path, log_start)
            gpu = gpu_cause(self.log_path, log_start) if code < 0 else None
            message = _death(code, cause, self.log_path, " while loading the model", gpu)
            raise RunnerStartError(message, code, gpu)
        return await self._connect()

    def _spawn(self) -> tuple[int, int]:
        """Start a fresh runner process: (where its log starts, the ready pipe's read end)."""
        ready_read, ready_write = os.pipe()
        try:
            with open(self.log_path, "ab") as log_file:
                log_start = self._log_start = log_file.tell()
                self.process = subprocess.Popen(
                    [*self.command(), "--ready-fd", str(ready_write)],
                    env=runner_environment(self.config),
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=log_file,
                    cwd=str(self.log_path.parent),
                    pass_fds=(ready_write,),
                    start_new_session=True,
                )
        except BaseException:
            os.close(ready_read)
            raise
        finally:
            os.close(ready_write)
        return log_start, ready_read

    async def explain_loss(self, reason: str, wait: float = 5.0) -> tuple[str, int | None]:
        """How the runner ended, once its connection was lost: ``the runner was killed by
        SIGILL (illegal instruction): Fatal Python error: Illegal instruction ... (full log:
        ...)``, and its exit status. A runner that is still running after ``wait`` seconds
        (it closed the connection but lives) is stopped, and ``reason`` says what was seen."""
        if self.process is None:
            return reason, None
        loop = asyncio.get_running_loop()
        try:
            code = await loop.run_in_executor(None, self.process.wait, wait)
        except subprocess.TimeoutExpired:
            await self.stop()
            return f"{reason}; the runner process was still running and was stopped", None
        cause = _cause_line(self.log_path, self._log_start, newest=True)
        return _death(code, cause, self.log_path, gpu=self.gpu_failure()), code

    def gpu_failure(self) -> str | None:
        """Why the GPU failed, once the runner ended of it: its engine stopped on a GPU error
        (:data:`.faults.EXIT_DEVICE_FAULT`), or a signal ended it and the log names the GPU's
        error; None while it runs and for any other end."""
        code = self.process.poll() if self.process is not None else None
        if code == EXIT_DEVICE_FAULT:
            cause = _cause_line(self.log_path, self._log_start, newest=True)
            return cause or "the GPU failed a decode"
        if code is not None and code < 0 and (cause := gpu_cause(self.log_path, self._log_start)):
            return cause
        if code is not None:
            # Stopped by the daemon while it was already exiting of a GPU fault: its engine
            # said so (``the GPU ...: the runner exits``) before the signal came.
            return _device_fault_line(self.log_path, self._log_start)
        return None

    async def _connect(self) -> RunnerClient:
        """Connect to a runner that said ready; a runner we cannot talk to is stopped, never
        left running with no owner."""
        client: RunnerClient | None = None
        try:
            client = await RunnerClient.connect(self.socket_path, self.explain_loss)
            async with asyncio.timeout(30):
                await client.health()
        except BaseException as exc:
            if client is not None:
                await client.close()
            await asyncio.shield(self.stop())
            if isinstance(exc, Exception) and not isinstance(exc, RunnerError):
                raise RunnerStartError(
                    f"the runner loaded the model but did not answer ({exc!r})"
                ) from exc
            raise
        return client

    @property
    def pid(self) -> int | None:
        """The child's pid."""
        return self.process.pid if self.process else None

    def alive(self) -> bool:
        """True while the process runs."""
        return self.process is not None and self.process.poll() is None

    async def stop(self, timeout: float = 10.0) -> None:
        """Ask the runner to exit (SIGTERM), then kill it if it does not."""
        if self.process is None:
            return
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            loop = asyncio.get_running_loop()
            try:
                await loop.run_in_executor(None, self.process.wait, timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    def kill(self) -> None:
        """SIGKILL the runner."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()


async def plan_only(
    config: protocol.RunnerConfig, log_path: Path, timeout: float = 120.0
) -> dict[str, Any]:
    """The memory plan a runner would load ``config`` by, without loading it:
    ``{"plan": MemoryPlan}`` or ``{"nofit": NoFitReport}`` (as dicts); raises
    :class:`RunnerStartError` when the runner cannot say. Always a fresh process, never the
    spare runner (:mod:`.spare`): its answer comes on stdout, and the spare is kept for a load."""
    process = RunnerProcess(config, log_path.with_suffix(".plan.sock"), log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log_file:
        log_start = log_file.tell()
        child = await asyncio.create_subprocess_exec(
            *process.command(),
            "--plan-only",
            env=runner_environment(config),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log_file,
            cwd=str(log_path.parent),
            start_new_session=True,
        )
    try:
        output, _ = await asyncio.wait_for(child.communicate(), timeout)
    except TimeoutError:
        child.kill()
        await child.wait()
        raise RunnerStartError(f"the runner did not plan the load within {timeout:.0f}s") from None
    for line in reversed(output.decode("utf-8", "replace").splitlines()):
        with contextlib.suppress(ValueError):
            answer = json.loads(line)
            if isinstance(answer, dict) and ("plan" in answer or "nofit" in answer):
                return answer
    code = child.returncode or 0
    cause = _cause_line(log_path, log_start)
    raise RunnerStartError(_death(code, cause, log_path, " while planning the load"), code)


class ProcessRunner:
    """A model served by a runner process: the process and the connection to it together.

    This is what the daemon's scheduler holds for a loaded model (its ``Runner`` protocol).
    """

    def __init__(self, process: RunnerProcess, client: RunnerClient, health: dict[str, Any]):
        self.process = process
        """The child process."""
        self.client = client
        """The connection to it."""
        self.health = health
        """What the runner said about itself once loaded (context, slots, GPU layers...)."""
        self.lost_workers: list[str] = []
        """RPC workers found down after the runner went away (llama.cpp ends a runner whose
        worker connection fails); the next load of the model may go on without them."""
        client.explain_loss = self._explain_loss

    async def _explain_loss(self, reason: str) -> tuple[str, int | None]:
        """How the runner ended (its exit status and log's cause line), and first, when RPC
        workers stopped answering, which (llama.cpp ends a runner whose worker fails)."""
        blame = await self._blame_workers() if self.process.config.rpc_workers else None
        ended, returncode = await self.process.explain_loss(reason)
        return (f"{blame} ({ended})" if blame else ended), returncode

    async def _blame_workers(self) -> str | None:
        """Which RPC workers stopped answering, once the runner went away (None: all are up,
        so they are not why). Only a worker that refuses connections counts: one that is up
        but slow to answer may still be finishing the dead runner's last step."""
        workers = [w for w in self.process.config.rpc_workers if w not in self.health_dropped]
        statuses = await asyncio.to_thread(probe_all, workers)
        down = [s for s in statuses if not s.connected]
        if not down:
            return None
        self.lost_workers = [*self.health_dropped, *(s.endpoint for s in down)]
        named = "; ".join(f"RPC worker {s.endpoint} {s.problem}" for s in down)
        return (
            f"{named}; llama.cpp stops a runner whose worker fails, so the model loads again "
            "on the next request, without that worker if the model fits on the rest"
        )

    @property
    def health_dropped(self) -> list[str]:
        """Lost workers this runner was loaded without."""
        return list(self.health.get("rpc_dropped") or [])

    @classmethod
    async def start(
        cls,
        config: protocol.RunnerConfig,
        socket_path: Path,
        log_path: Path,
        timeout: float = 300.0,
        spares: SparePool | None = None,
    ) -> ProcessRunner:
        """Start a runner for ``config`` (on the spare process when it can) and wait until it
        serves."""
        process = RunnerProcess(config, socket_path, log_path)
        client = await process.start(timeout, spares)
        try:
            health = await client.health()
        except BaseException:
            await client.close()
            await asyncio.shield(process.stop())
            raise
        return cls(process, client, health)

    @property
    def pid(self) -> int | None:
        """The runner's process id."""
        return self.process.pid

    def alive(self) -> bool:
        """True while the process runs and the connection is open."""
        return self.process.alive() and self.client.alive

    @property
    def returncode(self) -> int | None:
        """How the process ended (negative: the signal); None while it runs."""
        return self.process.process.poll() if self.process.process else None

    def gpu_failure(self) -> str | None:
        """See :meth:`RunnerProcess.gpu_failure`. A runner that closed its connection is
        exiting: its end is waited for (briefly), so that a GPU fault is not missed because
        the daemon looked a moment before the process was gone."""
        child = self.process.process
        if not self.client.alive and child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=5)
        return self.process.gpu_failure()

    async def open_generation(
        self,
        request: protocol.GenerationRequest,
        on_cancelled: Callable[[protocol.GenerationResult], None] | None = None,
    ) -> GenerationStream:
        """See :meth:`RunnerClient.open_generation`."""
        return await self.client.open_generation(request, on_cancelled)

    async def embed(self, request: protocol.EmbeddingRequest) -> protocol.EmbeddingResult:
        """See :meth:`RunnerClient.embed`."""
        return await self.client.embed(request)

    async def stats(self) -> protocol.Stats:
        """See :meth:`RunnerClient.stats`."""
        return await self.client.stats()

    async def load_adapters(self, files: list[protocol.AdapterFile]) -> list[protocol.AdapterStats]:
        """See :meth:`RunnerClient.load_adapters`."""
        return await self.client.load_adapters(files)

    async def set_threads(
        self, threads: int, reason: str, cpus: list[int] | None = None
    ) -> protocol.ThreadStats:
        """See :meth:`RunnerClient.set_threads`."""
        return await self.client.set_threads(threads, reason, cpus)

    async def tokenize(
        self, text: str, *, add_special: bool = False, parse_special: bool = False
    ) -> list[int]:
        """See :meth:`RunnerClient.tokenize`."""
        return await self.client.tokenize(
            text, add_special=add_special, parse_special=parse_special
        )

    async def detokenize(self, tokens: list[int]) -> str:
        """See :meth:`RunnerClient.detokenize`."""
        return await self.client.detokenize(tokens)

    async def close(self) -> None:
        """Close the connection and stop the process."""
        with contextlib.suppress(Exception):
            await self.client.close()
        await self.process.stop()
