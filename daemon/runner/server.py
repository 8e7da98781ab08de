"""The runner's socket server: NDJSON requests in, events out, the engine in between.

Prompt preparation (chat template, tokenization, truncation, grammar) runs in worker threads,
so a slow or hostile template never blocks the engine thread or other connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .chat import TemplateRenderError, render_chat
from .engine import EmbeddingJob, Engine, GenerationJob
from .model import LlamaModel
from .protocol import EmbeddingRequest, GenerationRequest, from_dict
from .sampling import GrammarError, grammar_for

__all__ = ["PromptError", "RunnerServer", "prepare_prompt"]

log = logging.getLogger("localllm.runner.server")

# Used when a model has no chat template: turns are separated by blank lines.
_FALLBACK_TEMPLATE = "{% for message in messages %}{{ message['content'] }}\n\n{% endfor %}"


class PromptError(ValueError):
    """A request that cannot be turned into prompt tokens; ``code`` is the protocol error code."""

    def __init__(self, message: str, code: str = "bad_request") -> None:
        super().__init__(message)
        self.code = code


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    raise PromptError("message content must be a string")


def _room_for_prompt(model: LlamaModel, request: GenerationRequest) -> int:
    """Prompt tokens allowed: the slot's context minus room to answer."""
    n_ctx = model.n_ctx_per_slot
    wanted = request.options.num_predict
    reserve = min(wanted if wanted > 0 else n_ctx // 4, n_ctx // 2)
    return n_ctx - max(1, reserve)


def prepare_prompt(
    model: LlamaModel, request: GenerationRequest, default_template: str | None
) -> list[int]:
    """Render and tokenize a request's prompt, truncating it if asked and needed."""
    if request.suffix is not None:
        return _fill_in_the_middle(model, request)
    if request.messages is not None and not request.raw:
        return _chat_prompt(model, request, default_template)
    if request.messages is not None:
        raise PromptError("raw requests take a prompt, not messages")
    tokens = model.tokenize(request.prompt or "", add_special=True, parse_special=True)
    return _fit(model, request, tokens, keep=1 if model.add_bos else 0)


def _fill_in_the_middle(model: LlamaModel, request: GenerationRequest) -> list[int]:
    fim = model.fim
    if fim is None:
        raise PromptError(
            "this model has no fill-in-the-middle tokens, so suffix is not supported", "unsupported"
        )
    before = model.tokenize(request.prompt or "", add_special=False, parse_special=False)
    after = model.tokenize(request.suffix or "", add_special=False, parse_special=False)
    # Keep the text nearest the cursor when the context is short: the end of the prefix and
    # the start of the suffix.
    room = _room_for_prompt(model, request) - 4
    if len(before) + len(after) > room:
        if not request.truncate:
            raise _overflow(model, len(before) + len(after) + 4)
        keep_after = min(len(after), room // 4)
        after = after[:keep_after]
        before = before[-(room - keep_after) :] if room > keep_after else []
    tokens = [fim.prefix, *before, fim.suffix, *after, fim.middle]
    return [model.bos_id, *tokens] if model.add_bos and model.bos_id >= 0 else tokens


def _chat_prompt(
    model: LlamaModel, request: GenerationRequest, default_template: str | None
) -> list[int]:
    template = request.template or default_template or _FALLBACK_TEMPLATE
    bos, eos = model.token_text(model.bos_id), model.token_text(model.eos_id)
    messages = [{**m, "content": _text(m.get("content"))} for m in request.messages or []]
    for message in messages:
        if not isinstance(message.get("role"), str):
            raise PromptError("every message needs a string role")

    def tokens_for(conversation: list[dict[str, Any]], generation_prompt: bool) -> list[int]:
        try:
            text = render_chat(
                template,
                conversation,
                add_generation_prompt=generation_prompt,
                bos_token=bos,
                eos_token=eos,
            )
        except TemplateRenderError as exc:
            raise PromptError(str(exc)) from None
        # Templates that write the BOS text themselves must not get a second one.
        add_special = model.add_bos and not (bos and text.startswith(bos))
        return model.tokenize(text, add_special=add_special, parse_special=True)

    tokens = tokens_for(messages, request.add_generation_prompt)
    room = _room_for_prompt(model, request)
    if len(tokens) <= room or not request.truncate:
        return _fit(model, request, tokens, keep=0)
    # Drop whole turns from the front, keeping system messages and the last turn.
    system = [m for m in messages if m["role"] == "system"]
    rest = [m for m in messages if m["role"] != "system"]
    while len(rest) > 1 and len(tokens) > room:
        rest = rest[1:]
        tokens = tokens_for(system + rest, request.add_generation_prompt)
    keep = len(tokens_for(system, False)) if system else (1 if model.add_bos else 0)
    return _fit(model, request, tokens, keep=keep)


def _overflow(model: LlamaModel, count: int) -> PromptError:
    return PromptError(
        f"the prompt is {count} tokens, more than fit in this model's context of "
        f"{model.n_ctx_per_slot} tokens per request; shorten it, raise num_ctx, "
        "or ask for truncation",
        "context_overflow",
    )


def _fit(model: LlamaModel, request: GenerationRequest, tokens: list[int], keep: int) -> list[int]:
    if not tokens:
        raise PromptError("the prompt is empty")
    if len(tokens) < model.n_ctx_per_slot and not (
        request.truncate and len(tokens) > _room_for_prompt(model, request)
    ):
        return tokens
    if not request.truncate:
        raise _overflow(model, len(tokens))
    room = _room_for_prompt(model, request)
    keep = min(keep, room // 2)
    return tokens[:keep] + tokens[len(tokens) - (room - keep) :]


class _Connection:
    """One client connection; events from the engine thread are written on the loop.

    The engine emits one event per generated token per stream. Waking the event loop for each
    would cost a self-pipe write per token; instead events queue up and one wake-up writes
    everything that arrived meanwhile (one step of 8 streams: one wake-up, one write).
    """

    def __init__(self, writer: asyncio.StreamWriter, loop: asyncio.AbstractEventLoop) -> None:
        self.writer = writer
        self.loop = loop
        self.active: set[str] = set()
        self.closed = False
        self._pending: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def send(self, event: dict[str, Any]) -> None:
        """Write one event (on the loop's thread)."""
        self._write([event])

    def _write(self, events: list[dict[str, Any]]) -> None:
        for event in events:
            if event.get("event") in ("done", "error", "embedding"):
                self.active.discard(str(event.get("id")))
        if self.closed:
            return
        data = "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in events)
        try:
            self.writer.write(data.encode())
        except (ConnectionError, RuntimeError):
            self.closed = True

    def _flush(self) -> None:
        with self._lock:
            events, self._pending = self._pending, []
        self._write(events)

    def _emit(self, event: dict[str, Any]) -> None:
        with self._lock:
            self._pending.append(event)
            wake = len(self._pending) == 1
        if wake:
            self.loop.call_soon_threadsafe(self._flush)

    def emitter(self) -> Callable[[dict[str, Any]], None]:
        """A thread-safe callback for the engine."""
        return self._emit


class RunnerServer:
    """Serves one engine on a Unix socket."""

    def __init__(self, model: LlamaModel, engine: Engine, socket_path: Path) -> None:
        self.model = model
        self.engine = engine
        self.socket_path = socket_path
        self.default_template = model.config.chat_template or model.chat_template()
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[_Connection] = set()

    async def start(self) -> None:
        """Listen on the socket (mode 0600)."""
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        old_umask = os.umask(0o077)
        try:
            self._server = await asyncio.start_unix_server(
                self._handle, path=str(self.socket_path), limit=64 << 20
            )
        finally:
            os.umask(old_umask)
        os.chmod(self.socket_path, 0o600)

    async def close(self) -> None:
        """Stop listening and drop connections."""
        if self._server is not None:
            self._server.close()
            for connection in list(self._connections):
                connection.closed = True
                connection.writer.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    def health(self) -> dict[str, Any]:
        """Facts about the loaded model, for the daemon's /api/ps."""
        model = self.model
        return {
            "status": "ok",
            "pid": os.getpid(),
            "model_path": model.config.model_path,
            "description": model.describe(),
            "n_slots": model.n_slots,
            "n_ctx_per_slot": model.n_ctx_per_slot,
            "n_ctx": model.n_ctx,
            "n_ctx_train": model.n_ctx_train,
            "n_batch": model.n_batch,
            "n_threads": model.n_threads,
            "gpu_offload": model.gpu_offload,
            "gpu_layers": model.n_gpu_layers,
            "kv_cache_type": model.config.kv_cache_type,
            "flash_attention": model.config.flash_attention,
            "fill_in_the_middle": model.fim is not None,
            "chat_template": self.default_template is not None,
        }

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = _Connection(writer, asyncio.get_running_loop())
        self._connections.add(connection)
        tasks: set[asyncio.Task[None]] = set()
        try:
            while line := await reader.readline():
                try:
                    message = json.loads(line)
                    if not isinstance(message, dict):
                        raise ValueError("not an object")
                except ValueError:
                    connection.send(
                        {
                            "event": "error",
                            "id": None,
                            "message": "malformed message",
                            "code": "bad_request",
                        }
                    )
                    continue
                task = asyncio.create_task(self._dispatch(connection, message))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            connection.closed = True
            # Whatever this client started is nobody's business any more.
            for job_id in list(connection.active):
                self.engine.cancel(job_id)
            self._connections.discard(connection)
            writer.close()

    async def _dispatch(self, connection: _Connection, message: dict[str, Any]) -> None:
        op = message.get("op")
        request_id = message.get("id")
        try:
            if op == "generate":
                await self._generate(connection, message.get("request") or {})
            elif op == "embed":
                await self._embed(connection, message.get("request") or {})
            elif op == "cancel":
                # Also stops a request still being prepared from reaching the engine.
                connection.active.discard(str(request_id))
                self.engine.cancel(str(request_id))
            elif op == "health":
                connection.send({"event": "health", "id": request_id, "health": self.health()})
            elif op == "stats":
                connection.send(
                    {"event": "stats", "id": request_id, "stats": asdict(self.engine.stats())}
                )
            elif op == "tokenize":
                tokens = await asyncio.to_thread(
                    self.model.tokenize, str(message.get("text", "")), False, False
                )
                connection.send({"event": "tokens", "id": request_id, "tokens": tokens})
            else:
                raise PromptError(f"unknown op {op!r}")
        except PromptError as exc:
            connection.send(
                {"event": "error", "id": request_id, "message": str(exc), "code": exc.code}
            )
        except Exception as exc:
            log.exception("request failed")
            connection.send(
                {
                    "event": "error",
                    "id": request_id,
                    "message": f"internal error: {exc}",
                    "code": "internal",
                }
            )

    async def _generate(self, connection: _Connection, data: dict[str, Any]) -> None:
        try:
            request = GenerationRequest.from_json(data)
        except TypeError as exc:
            raise PromptError(f"malformed generate request: {exc}") from None
        connection.active.add(request.id)
        try:
            tokens = await asyncio.to_thread(
                prepare_prompt, self.model, request, self.default_template
            )
            grammar = await asyncio.to_thread(grammar_for, request.options)
        except GrammarError as exc:
            raise PromptError(str(exc)) from None
        except PromptError as exc:
            connection.active.discard(request.id)
            connection.send(
                {"event": "error", "id": request.id, "message": str(exc), "code": exc.code}
            )
            return
        if request.id not in connection.active:  # the client left while we prepared
            return
        self.engine.submit(
            GenerationJob(
                id=request.id,
                prompt=tokens,
                options=request.options,
                grammar=grammar,
                emit=connection.emitter(),
            )
        )

    async def _embed(self, connection: _Connection, data: dict[str, Any]) -> None:
        request: EmbeddingRequest = from_dict(EmbeddingRequest, data)
        limit = self.model.n_ctx_per_slot
        inputs = []
        for text in request.inputs:
            tokens = await asyncio.to_thread(self.model.tokenize, str(text), True, False)
            if not tokens:
                raise PromptError("cannot embed an empty input")
            if len(tokens) > limit:
                if not request.truncate:
                    raise PromptError(
                        f"an input is {len(tokens)} tokens, more than the context of {limit}",
                        "context_overflow",
                    )
                tokens = tokens[:limit]
            inputs.append(tokens)
        connection.active.add(request.id)
        self.engine.embed(
            EmbeddingJob(
                id=request.id, inputs=inputs, normalize=request.normalize, emit=connection.emitter()
            )
        )
