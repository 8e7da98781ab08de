"""The daemon's side of a runner: start the process, talk to it, notice when it dies.

:class:`RunnerProcess` spawns ``python -m localllm.daemon.runner`` for one model and waits until
it answers. :class:`RunnerClient` multiplexes requests over the runner's Unix socket: each
request gets its own queue of events, keyed by id. If the connection drops (the runner crashed
or was killed), every pending request fails with :class:`RunnerDiedError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .protocol import (
    EmbeddingRequest,
    EmbeddingResult,
    GenerationRequest,
    GenerationResult,
    RunnerConfig,
    SlotStats,
    Stats,
    Timings,
    from_dict,
)

__all__ = [
    "RunnerClient",
    "RunnerDiedError",
    "RunnerError",
    "RunnerProcess",
    "RunnerStartError",
    "TokenChunk",
]

# Lines can carry a whole embedding batch; allow large ones.
_LINE_LIMIT = 64 << 20
# A cancelled request is confirmed at the engine's next step; don't wait forever for it.
_CANCEL_CONFIRM_S = 10.0


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

    def __init__(self, message: str) -> None:
        super().__init__(message, "runner_died")


class RunnerStartError(RunnerError):
    """The runner process could not load the model; the message holds its last log lines."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "load_failed")


@dataclass(frozen=True)
class TokenChunk:
    """Text generated for a request since the previous chunk."""

    text: str
    """The new text (always whole UTF-8 characters)."""


def _result(request_id: str, event: dict[str, Any]) -> GenerationResult:
    result = event.get("result") or {}
    return GenerationResult(
        id=request_id,
        text=result.get("text", ""),
        done_reason=result.get("done_reason", "stop"),
        timings=from_dict(Timings, result.get("timings") or {}),
        error=result.get("error"),
    )


class RunnerClient:
    """An asyncio connection to one runner, shared by all requests to its model."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._queues: dict[str, asyncio.Queue[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._write_lock = asyncio.Lock()
        self._closed_reason: str | None = None
        self._reader_task = asyncio.create_task(self._read_loop())

    @classmethod
    async def connect(cls, socket_path: str | Path) -> RunnerClient:
        """Connect to a runner's socket."""
        reader, writer = await asyncio.open_unix_connection(str(socket_path), limit=_LINE_LIMIT)
        return cls(reader, writer)

    @property
    def alive(self) -> bool:
        """False once the connection is gone."""
        return self._closed_reason is None

    def _next_id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._ids)}"

    async def _read_loop(self) -> None:
        reason = "the runner closed its connection"
        try:
            while True:
                line = await self._reader.readline()
                if not line:
                    break
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                queue = self._queues.get(str(event.get("id")))
                if queue is not None:
                    queue.put_nowait(event)
        except (ConnectionError, asyncio.IncompleteReadError, ValueError) as exc:
            reason = f"lost the connection to the runner ({exc})"
        finally:
            self._closed_reason = reason
            for queue in self._queues.values():
                queue.put_nowait({"event": "died", "message": reason})

    async def _send(self, message: dict[str, Any]) -> None:
        if self._closed_reason is not None:
            raise RunnerDiedError(self._closed_reason)
        data = (json.dumps(message, separators=(",", ":")) + "\n").encode()
        async with self._write_lock:
            try:
                self._writer.write(data)
                await self._writer.drain()
            except (ConnectionError, RuntimeError) as exc:
                raise RunnerDiedError(f"lost the connection to the runner ({exc})") from exc

    async def _call(self, message: dict[str, Any]) -> tuple[str, asyncio.Queue[dict[str, Any]]]:
        request_id = str(message.get("id") or message["request"]["id"])
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._queues[request_id] = queue
        try:
            await self._send(message)
        except BaseException:
            self._queues.pop(request_id, None)
            raise
        return request_id, queue

    @staticmethod
    def _raise_for(event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "died":
            raise RunnerDiedError(event.get("message", "the runner died"))
        if kind == "error":
            raise RunnerError(event.get("message", "runner error"), event.get("code", "internal"))

    async def _single(self, message: dict[str, Any]) -> dict[str, Any]:
        request_id, queue = await self._call(message)
        try:
            event = await queue.get()
            self._raise_for(event)
            return event
        finally:
            self._queues.pop(request_id, None)

    async def generate(
        self,
        request: GenerationRequest,
        on_cancelled: Callable[[GenerationResult], None] | None = None,
    ) -> AsyncIterator[TokenChunk | GenerationResult]:
        """Stream a generation: :class:`TokenChunk` items, then one :class:`GenerationResult`.

        Leaving the iteration early (``aclose()``, or cancelling the task) cancels the request
        in the runner; ``aclose()`` returns once the runner has freed the slot, and the
        cancelled request's result (timings so far) goes to ``on_cancelled``.
        """
        if not request.id:
            request.id = self._next_id("gen")
        request_id, queue = await self._call({"op": "generate", "request": request.to_dict()})
        finished = False
        try:
            while True:
                event = await queue.get()
                kind = event.get("event")
                if kind == "token":
                    yield TokenChunk(text=event.get("text", ""))
                elif kind == "done":
                    finished = True
                    yield _result(request_id, event)
                    return
                else:
                    finished = True
                    self._raise_for(event)
        finally:
            if not finished and self.alive:
                await asyncio.shield(self._cancel(request_id, queue, on_cancelled))
            self._queues.pop(request_id, None)

    async def _cancel(
        self,
        request_id: str,
        queue: asyncio.Queue[dict[str, Any]],
        on_cancelled: Callable[[GenerationResult], None] | None,
    ) -> None:
        """Cancel in the runner and wait until it confirms, so the slot is free on return."""
        with contextlib.suppress(RunnerError, ConnectionError, TimeoutError):
            await self._send({"op": "cancel", "id": request_id})
            async with asyncio.timeout(_CANCEL_CONFIRM_S):
                while (event := await queue.get()).get("event") not in ("done", "error", "died"):
                    pass
            if event.get("event") == "done" and on_cancelled is not None:
                on_cancelled(_result(request_id, event))

    async def embed(self, request: EmbeddingRequest) -> EmbeddingResult:
        """Embed texts with the runner's embedding context."""
        if not request.id:
            request.id = self._next_id("emb")
        event = await self._single({"op": "embed", "request": asdict(request)})
        return from_dict(EmbeddingResult, event["result"])

    async def stats(self) -> Stats:
        """The runner's gauges."""
        event = await self._single({"op": "stats", "id": self._next_id("stats")})
        data = event["stats"]
        stats: Stats = from_dict(Stats, data)
        stats.slots = [from_dict(SlotStats, slot) for slot in data.get("slots", [])]
        return stats

    async def health(self) -> dict[str, Any]:
        """Model facts and readiness: ``{status, n_slots, n_ctx_per_slot, gpu_layers, ...}``."""
        event = await self._single({"op": "health", "id": self._next_id("health")})
        return event["health"]

    async def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special-token parsing, no BOS)."""
        event = await self._single({"op": "tokenize", "id": self._next_id("tok"), "text": text})
        return list(event["tokens"])

    async def close(self) -> None:
        """Close the connection (the runner keeps running)."""
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()
        self._reader_task.cancel()
        with contextlib.suppress(BaseException):
            await self._reader_task


def _tail(path: Path, lines: int = 12) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


class RunnerProcess:
    """A runner child process for one model."""

    def __init__(self, config: RunnerConfig, socket_path: Path, log_path: Path) -> None:
        self.config = config
        """How the model is loaded."""
        self.socket_path = socket_path
        """Where the runner listens."""
        self.log_path = log_path
        """The runner's log (llama.cpp's output goes here)."""
        self.process: subprocess.Popen[bytes] | None = None
        """The child process once started."""

    def command(self) -> list[str]:
        """The command line that starts the runner."""
        c = self.config
        # -P: never put the working directory on sys.path (a source checkout there would
        # shadow the installed package).
        args = [
            sys.executable, "-P", "-m", "localllm.daemon.runner",
            "--model", c.model_path,
            "--socket", str(self.socket_path),
            "--slots", str(c.n_slots),
            "--ctx-per-slot", str(c.n_ctx_per_slot),
            "--batch", str(c.n_batch),
            "--kv-cells", str(c.kv_cells),
            "--threads", str(c.n_threads),
            "--gpu-layers", str(c.n_gpu_layers),
            "--kv-cache-type", c.kv_cache_type,
            "--flash-attention", c.flash_attention,
            "--log-file", str(self.log_path),
        ]  # fmt: skip
        for part in c.extra_model_paths:
            args += ["--model-part", part]
        if c.chat_template is not None:
            args += ["--chat-template", c.chat_template]
        return args

    async def start(self, timeout: float = 300.0) -> RunnerClient:
        """Start the process and return a connected client once the model is loaded.

        The runner writes ``ready`` to an inherited pipe once its socket listens; if it exits
        first, the pipe closes empty and the error carries the last lines of its log.
        """
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        ready_read, ready_write = os.pipe()
        try:
            with open(self.log_path, "ab") as log:
                self.process = subprocess.Popen(
                    [*self.command(), "--ready-fd", str(ready_write)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    cwd=str(self.log_path.parent),
                    pass_fds=(ready_write,),
                    start_new_session=True,
                )
        except BaseException:
            os.close(ready_read)
            raise
        finally:
            os.close(ready_write)
        loop = asyncio.get_running_loop()
        ready = loop.run_in_executor(None, os.read, ready_read, 64)
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
        if not signal_bytes.startswith(b"ready"):
            code = await loop.run_in_executor(None, self.process.wait)
            raise RunnerStartError(
                f"the runner exited with status {code} while loading the model:\n"
                f"{_tail(self.log_path)}"
            )
        client = await RunnerClient.connect(self.socket_path)
        await client.health()
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
