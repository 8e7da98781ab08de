"""The runner's socket server: NDJSON requests in, events out, the engine in between.

Prompt preparation (chat template, tokenization, truncation, grammar) runs in worker threads,
so a slow or hostile template never blocks the engine thread or other connections.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import os
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..devices.procfs import allowed_cpus, pin_process
from ..engine.jobs import EmbeddingJob, GenerationJob
from ..engine.loop import Engine
from ..engine.model import LlamaModel
from ..engine.reasoning import ReasoningBudget, grammar_after
from ..engine.sampling import GrammarError, check_sampling, grammar_for, prepare_logits_view
from ..engine.scoring import PromptScore
from ..engine.slots import common_prefix_length
from ..engine.text import unicode_problem
from ..engine.vision import ImageEmbeddings, VisionError, VisionProjector, is_image_token
from ..lora.adapterset import AdapterLoadError, AdapterSet
from ..prompt.template import TemplateRenderError, compile_template, render_chat
from .connection import Connection
from .protocol import (
    IMAGE_MARKER,
    AdapterFile,
    AdaptersEvent,
    AdaptersOp,
    AdapterUse,
    CancelOp,
    DetokenizeOp,
    DoneEvent,
    EmbeddingRequest,
    EmbedOp,
    ErrorEvent,
    GenerateOp,
    GenerationRequest,
    GenerationResult,
    HealthEvent,
    HealthOp,
    PromptReadyEvent,
    ProtocolError,
    Request,
    StatsEvent,
    StatsOp,
    TextEvent,
    ThreadsEvent,
    ThreadsOp,
    Timings,
    TokenizeOp,
    TokenLogprob,
    TokensEvent,
    decode,
)
from .threads import in_own_thread

__all__ = [
    "Prompt",
    "PromptError",
    "RunnerServer",
    "TemplateRenders",
    "prepare",
    "prepare_prompt",
]

log = logging.getLogger("localllm.runner.server")

NO_VISION = "this model cannot read images: it has no vision projector"

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


def _encodable(text: str, field: str) -> str:
    """``text`` if it can be tokenized (see :func:`.text.unicode_problem`)."""
    if (problem := unicode_problem(text, field)) is not None:
        raise PromptError(problem)
    return text


def _room_for_prompt(model: LlamaModel, request: GenerationRequest) -> int:
    """Prompt tokens allowed: the slot's context minus room to answer."""
    n_ctx = model.n_ctx_per_slot
    wanted = request.options.num_predict
    reserve = min(wanted if wanted > 0 else n_ctx // 4, n_ctx // 2)
    return n_ctx - max(1, reserve)


@dataclass(frozen=True)
class Prompt:
    """A request's prompt, ready for the engine."""

    tokens: list[int]
    """The prompt tokens."""
    keep: int
    """Leading tokens a context shift keeps (the system prompt, or the BOS token)."""
    tail: str = ""
    """The end of the rendered prompt text."""
    images: dict[int, ImageEmbeddings] = field(default_factory=dict)
    """The prompt's images by the position where each starts (see :mod:`.vision`)."""
    dropped_messages: int = 0
    """Older chat messages left out to fit the context (truncation)."""
    dropped_tokens: int = 0
    """Prompt tokens left out to fit the context (truncation), those messages' included."""
    template_ms: float = 0.0
    """Time spent rendering the chat template (every render truncation needed), its compile
    included."""
    compile_ms: float = 0.0
    """Of ``template_ms``, compiling the template (its first use in this process)."""
    tokenize_ms: float = 0.0
    """Time spent tokenizing (images included)."""


class _Spent:
    """Time a prompt's preparation spent rendering and tokenizing (``perf_counter_ns``)."""

    __slots__ = ("compile", "template", "tokenize")

    def __init__(self) -> None:
        self.compile = 0
        self.template = 0
        self.tokenize = 0

    def into(self, prompt: Prompt) -> Prompt:
        """``prompt`` with these times."""
        return replace(
            prompt,
            template_ms=self.template / 1e6,
            tokenize_ms=self.tokenize / 1e6,
            compile_ms=self.compile / 1e6,
        )


class _Images:
    """Tokenization for one request: with its images through the projector when it has any,
    remembering where they landed."""

    def __init__(
        self, model: LlamaModel, projector: VisionProjector | None, request: GenerationRequest
    ) -> None:
        self.model = model
        self.projector = projector
        self.files = _image_files(request.images)
        self.placed: dict[int, ImageEmbeddings] = {}
        if self.files and projector is None:
            raise PromptError(NO_VISION, "unsupported")

    def tokenize(
        self, text: str, add_special: bool, offset: int = 0, files: list[bytes] | None = None
    ) -> list[int]:
        """Tokens of ``text``, its image markers replaced by the pseudo-tokens of the images
        (``files``, by default all of the request's); ``offset`` is where the text starts in
        the prompt (after a ``context``)."""
        files = self.files if files is None else files
        if not files:
            self.placed = {}
            return self.model.tokenize(text, add_special=add_special, parse_special=True)
        assert self.projector is not None
        try:
            prepared = self.projector.prepare(text, files, add_special)
        except VisionError as exc:
            raise PromptError(str(exc), exc.code) from None
        self.placed = {offset + start: image for start, image in prepared.images.items()}
        return prepared.tokens

    def by_message(self, messages: list[dict[str, Any]]) -> list[list[bytes]] | None:
        """Each message's images, when the images are exactly those of the markers in the
        messages' contents, in order (None otherwise: then turns cannot be dropped)."""
        counts = [m["content"].count(IMAGE_MARKER) for m in messages]
        if sum(counts) != len(self.files):
            return None
        starts = [sum(counts[:i]) for i in range(len(counts))]
        return [self.files[start : start + n] for start, n in zip(starts, counts, strict=True)]


def _image_files(images: list[str]) -> list[bytes]:
    """The image files of a request, from standard base64."""
    if not isinstance(images, list):
        raise PromptError("images must be a list of base64 strings")
    files = []
    for index, image in enumerate(images, start=1):
        if not isinstance(image, str):
            raise PromptError(f"image {index} must be a base64 string")
        try:
            files.append(base64.b64decode(image, validate=True))
        except (binascii.Error, ValueError):
            raise PromptError(f"image {index} is not valid base64") from None
        if not files[-1]:
            raise PromptError(f"image {index} is empty")
    return files


def prepare(
    model: LlamaModel,
    request: GenerationRequest,
    default_template: str | None,
    projector: VisionProjector | None = None,
) -> Prompt:
    """Render and tokenize a request's prompt (with its images, through ``projector``),
    truncating it if asked and needed."""
    bos_only = 1 if model.add_bos else 0
    images = _Images(model, projector, request)
    spent = _Spent()
    if request.suffix is not None and images.files:
        raise PromptError("images go with a prompt or messages, not with a suffix (FIM)")
    if request.suffix is not None:
        _encodable(request.prompt or "", "prompt")
        _encodable(request.suffix, "suffix")
        began = time.perf_counter_ns()
        prompt = Prompt(_fill_in_the_middle(model, request), bos_only)
        spent.tokenize += time.perf_counter_ns() - began
    elif request.messages is not None and request.context:
        raise PromptError("context continues a prompt, not a chat: send the messages instead")
    elif request.messages is not None and not request.raw:
        prompt = _chat_prompt(model, request, default_template, images, spent)
    elif request.messages is not None:
        raise PromptError("raw requests take a prompt, not messages")
    else:
        text = _encodable(request.prompt or "", "prompt")
        context = _checked_context(model, request.context)
        began = time.perf_counter_ns()
        tokens = context + images.tokenize(text, not context, offset=len(context))
        spent.tokenize += time.perf_counter_ns() - began
        whole = len(tokens)
        tokens = _fit(model, request, tokens, keep=bos_only, images=bool(images.files))
        prompt = Prompt(
            tokens, bos_only, text[-200:], images.placed, dropped_tokens=whole - len(tokens)
        )
    prompt = spent.into(prompt)
    if request.options.num_keep >= 0:
        keep = min(request.options.num_keep, len(prompt.tokens))
        return replace(prompt, keep=keep)
    return prompt


def prepare_prompt(
    model: LlamaModel, request: GenerationRequest, default_template: str | None
) -> list[int]:
    """The prompt tokens of :func:`prepare`."""
    return prepare(model, request, default_template).tokens


def _checked_context(
    model: LlamaModel, context: list[int] | None, field: str = "context"
) -> list[int]:
    if not context:
        return []
    for token in context:
        if field == "context" and isinstance(token, int) and is_image_token(token):
            raise PromptError(
                f"{field} holds the positions of an image: a context with images cannot be "
                "continued; send the messages with their images again"
            )
        if not isinstance(token, int) or not 0 <= token < model.n_vocab:
            raise PromptError(f"{field} holds {token!r}, which is not a token of this model")
    return list(context)


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
    model: LlamaModel,
    request: GenerationRequest,
    default_template: str | None,
    images: _Images,
    spent: _Spent,
) -> Prompt:
    template = request.template or default_template or _FALLBACK_TEMPLATE
    bos, eos = model.token_text(model.bos_id), model.token_text(model.eos_id)
    messages = [{**m, "content": _text(m.get("content"))} for m in request.messages or []]
    for index, message in enumerate(messages):
        if not isinstance(message.get("role"), str):
            raise PromptError("every message needs a string role")
        _encodable(message["content"], f"messages[{index}].content")

    rendered = [""]
    # Compiled apart from the first render, and timed apart: a template's first use compiles
    # it (several ms for a GGUF's template), and the runner judges a template by its renders.
    began = time.perf_counter_ns()
    if compile_template(template):
        spent.compile = time.perf_counter_ns() - began
    spent.template += time.perf_counter_ns() - began

    def tokens_for(
        conversation: list[dict[str, Any]],
        generation_prompt: bool,
        with_images: bool = False,
        files: list[bytes] | None = None,
    ) -> list[int]:
        began = time.perf_counter_ns()
        try:
            text = render_chat(
                template,
                conversation,
                add_generation_prompt=generation_prompt,
                bos_token=bos,
                eos_token=eos,
                tools=request.tools,
                extra=request.template_kwargs,
            )
        except TemplateRenderError as exc:
            raise PromptError(str(exc)) from None
        except UnicodeEncodeError:
            raise PromptError("the conversation is not valid Unicode (a lone surrogate)") from None
        rendered[0] = text
        # Templates that write the BOS text themselves must not get a second one.
        add_special = model.add_bos and not (bos and text.startswith(bos))
        rendered_at = time.perf_counter_ns()
        spent.template += rendered_at - began
        try:
            if with_images:
                return images.tokenize(text, add_special, files=files)
            return model.tokenize(text, add_special=add_special, parse_special=True)
        finally:
            spent.tokenize += time.perf_counter_ns() - rendered_at

    tokens = tokens_for(messages, request.add_generation_prompt, with_images=True)
    whole = len(tokens)
    tail = rendered[0][-200:]
    system = [m for m in messages if m["role"] == "system"]
    keep = (
        common_prefix_length(tokens_for(system, False), tokens)
        if system
        else (1 if model.add_bos else 0)
    )
    room = _room_for_prompt(model, request)
    with_images = bool(images.files)
    per_message = images.by_message(messages) if with_images else None
    if len(tokens) <= room or not request.truncate or (with_images and per_message is None):
        tokens = _fit(model, request, tokens, keep=0, images=with_images)
        return Prompt(tokens, keep, tail, images.placed)
    # Drop whole turns from the front, keeping system messages and the last turn (and the
    # images of the turns kept).
    system_at = [i for i, m in enumerate(messages) if m["role"] == "system"]
    rest_at = [i for i, m in enumerate(messages) if m["role"] != "system"]
    while len(rest_at) > 1 and len(tokens) > room:
        rest_at = rest_at[1:]
        kept = system_at + rest_at
        files = [f for i in kept for f in per_message[i]] if per_message is not None else None
        conversation = [messages[i] for i in kept]
        tokens = tokens_for(conversation, request.add_generation_prompt, with_images, files)
    tokens = _fit(model, request, tokens, keep=keep, images=with_images)
    return Prompt(
        tokens,
        keep,
        tail,
        images.placed,
        dropped_messages=len(messages) - len(system_at) - len(rest_at),
        dropped_tokens=whole - len(tokens),
    )


def _fit_input(tokens: list[int], limit: int, truncate: bool, what: str) -> list[int]:
    """An embedding (or ranking) input within the context: cut when ``truncate``, else a
    context overflow naming ``what``."""
    if len(tokens) <= limit:
        return tokens
    if not truncate:
        raise PromptError(
            f"{what} is {len(tokens)} tokens, more than the context of {limit}; shorten it "
            "or allow truncation",
            "context_overflow",
        )
    return tokens[:limit]


def _overflow(model: LlamaModel, count: int) -> PromptError:
    return PromptError(
        f"the prompt is {count} tokens, more than fit in this model's context of "
        f"{model.n_ctx_per_slot} tokens per request; shorten it, raise num_ctx, "
        "or ask for truncation",
        "context_overflow",
    )


def _fit(
    model: LlamaModel,
    request: GenerationRequest,
    tokens: list[int],
    keep: int,
    images: bool = False,
) -> list[int]:
    if not tokens:
        raise PromptError("the prompt is empty")
    if len(tokens) < model.n_ctx_per_slot and not (
        request.truncate and len(tokens) > _room_for_prompt(model, request)
    ):
        return tokens
    if images and (request.truncate or len(tokens) >= model.n_ctx_per_slot):
        # Cutting tokens could cut an image in half.
        raise PromptError(
            f"the prompt with its images is {len(tokens)} tokens, more than fit in this "
            f"model's context of {model.n_ctx_per_slot} tokens per request (with room to "
            "answer when truncating); with images only whole earlier chat turns are dropped, "
            "never part of one: shorten it, send fewer images or raise num_ctx",
            "context_overflow",
        )
    if not request.truncate:
        raise _overflow(model, len(tokens))
    room = _room_for_prompt(model, request)
    keep = min(keep, room // 2)
    return tokens[:keep] + tokens[len(tokens) - (room - keep) :]


# Prompts up to this many characters (messages, prompt, suffix and tools together) are
# prepared on the loop: tokenizing 8,000 characters takes about a millisecond.
_LIGHT_CHARS = 8192
# A template that rendered in under this (ms) every time so far renders on the loop.
_QUICK_MS = 2.0


class TemplateRenders:
    """How long each chat template takes to render, to prepare a light prompt on the loop
    when its template has always rendered quickly (the slowest render seen decides: a
    template that once took long goes to a thread again). A render's time leaves out the
    template's compile: a template's first use compiles it (several ms for a GGUF's), which
    counted would send every later request to a thread."""

    def __init__(self, limit: int = 64) -> None:
        self._ms: dict[str, float] = {}
        self._limit = limit

    def quick(self, template: str) -> bool:
        """Whether every render of ``template`` so far took under :data:`_QUICK_MS` (never
        rendered yet: no)."""
        return self._ms.get(template, _QUICK_MS) < _QUICK_MS

    def record(self, template: str, render_ms: float) -> None:
        """A render of ``template`` took ``render_ms`` (its compile left out)."""
        self._ms[template] = max(self._ms.get(template, 0.0), render_ms)
        if len(self._ms) > self._limit:  # requests may bring their own templates
            self._ms.pop(next(iter(self._ms)))


def _light(request: GenerationRequest) -> bool:
    """Whether ``request``'s prompt is prepared quicker than a thread starts: text only, short,
    and no JSON schema or grammar to compile."""
    options = request.options
    if request.images or options.json_schema is not None:
        return False
    size = len(request.prompt or "") + len(request.suffix or "")
    if request.tools:
        size += len(str(request.tools))
    for message in request.messages or ():
        content = message.get("content")
        if not isinstance(content, str):
            return False  # parts: their text is joined while preparing
        size += len(content)
        if size > _LIGHT_CHARS:
            return False
    return size <= _LIGHT_CHARS


def _run_to_end(coroutine: Coroutine[Any, Any, None]) -> None:
    """Run ``coroutine``, one that never waits, to its end here."""
    try:
        coroutine.send(None)
    except StopIteration:
        return
    coroutine.close()
    raise RuntimeError("a request dispatched without waiting waited")


class RunnerServer:
    """Serves one engine on a Unix socket."""

    def __init__(
        self,
        model: LlamaModel,
        engine: Engine,
        socket_path: Path,
        projector: VisionProjector | None = None,
    ) -> None:
        self.model = model
        self.engine = engine
        self.projector = projector
        """The vision projector, when the model reads images."""
        self.socket_path = socket_path
        self.default_template = model.config.chat_template or model.chat_template()
        self.memory_plan: dict[str, Any] | None = None
        self.memory_plan_kept = False
        """Whether the plan was kept from an earlier load (:mod:`..memory.plancache`)."""
        """The memory plan the model was loaded by
        (:class:`~localllm.daemon.memory.plan.MemoryPlan`), if any."""
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[Connection] = set()
        self._renders = TemplateRenders()
        """How long each template takes to render: quick ones render on the loop."""
        # Dispatched requests; close() waits for them, because prompt preparation reads the
        # model's vocabulary from worker threads and the model must outlive them.
        self._tasks: set[asyncio.Task[None]] = set()
        self._start_cpus = sorted(allowed_cpus())
        """The CPUs the runner started with (what a share without CPUs goes back to)."""
        self._pinned: set[int] = set(self._start_cpus)

    def warm_up(self) -> None:
        """Prepare a one-message chat with the model's template once, while no request
        waits (after the runner said it is ready): a template's first use compiles it (8 ms
        for SmolLM2's), and one never rendered sends its first request's prompt to a thread
        of its own, so the first message after a load paid both. What it prepares is
        dropped. Likewise the view of the logits a first sample reads."""
        prepare_logits_view(self.model.n_vocab)
        template = self.default_template
        if template is None:
            return
        request = GenerationRequest(id="warm-up", messages=[{"role": "user", "content": "Hi"}])
        try:
            prompt = prepare(self.model, request, template)
        except Exception:  # the first request meets the same error and reports it
            log.debug("warming the chat template up failed", exc_info=True)
            return
        self._renders.record(template, prompt.template_ms - prompt.compile_ms)

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
        """Stop listening, drop connections and wait for requests being prepared."""
        if self._server is not None:
            self._server.close()
            for connection in list(self._connections):
                connection.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
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
            "gpu_layers": (
                model.n_gpu_layers
                if model.remote is None
                else model.remote.placement.local_gpu_layers
            ),
            "devices": model.remote.placement.report() if model.remote is not None else None,
            "allocated": model.allocated,
            "cpu_repack": model.cpu_repack,
            "rpc_dropped": [s.endpoint for s in model.remote.dropped] if model.remote else [],
            "kv_cache_type": model.config.kv_cache_type,
            "kv_unified": model.unified_kv,
            "flash_attention": model.config.flash_attention,
            "fill_in_the_middle": model.fim is not None,
            "chat_template": self.default_template is not None,
            "vision": self.projector is not None,
            "memory_plan": self.memory_plan,
            "memory_plan_kept": self.memory_plan_kept,
            "rank": model.rank_pooling,
        }

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = Connection(writer, asyncio.get_running_loop())
        self._connections.add(connection)
        try:
            while line := await reader.readline():
                read_at = time.perf_counter_ns()
                try:
                    message = decode(line)
                except ProtocolError as exc:
                    connection.send(ErrorEvent(id=exc.id, message=str(exc), code="bad_request"))
                    continue
                if not isinstance(message, Request):
                    connection.send(
                        ErrorEvent(id=message.id, message="not a request", code="bad_request")
                    )
                    continue
                if isinstance(message, GenerateOp | EmbedOp):
                    connection.active.add(message.id)
                quick = isinstance(message, GenerateOp) and self._quick(message.request)
                dispatch = self._dispatch(connection, message, read_at, quick)
                if quick:
                    # Prepared here and now: a task started a loop turn later (50-70 us after
                    # an idle gap) for a prompt that never waits.
                    _run_to_end(dispatch)
                else:
                    task = asyncio.create_task(dispatch)
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            connection.close()
            # Whatever this client started is nobody's business any more.
            for job_id in list(connection.active):
                self._cancel(connection, job_id)
            self._connections.discard(connection)

    async def _dispatch(
        self, connection: Connection, message: Request, read_at: int = 0, quick: bool = False
    ) -> None:
        """Run one request; whatever happens, a request that fails gets its error event.
        ``read_at``: when its line was read (``perf_counter_ns``); ``quick``: a generation
        whose prompt is prepared without waiting (see :meth:`_quick`)."""
        try:
            match message:
                case GenerateOp():
                    await self._generate(connection, message, read_at, quick)
                case EmbedOp():
                    await self._embed(connection, message)
                case CancelOp():
                    self._cancel(connection, message.id)
                case HealthOp():
                    connection.send(HealthEvent(id=message.id, health=self.health()))
                case StatsOp():
                    connection.send(StatsEvent(id=message.id, stats=self.engine.stats()))
                case AdaptersOp():
                    loaded = await self._load_adapters(message.adapters)
                    connection.send(AdaptersEvent(id=message.id, adapters=loaded))
                case ThreadsOp():
                    self._share_cores(message)
                    connection.send(
                        ThreadsEvent(id=message.id, threads=self.engine.governor.state())
                    )
                case TokenizeOp():
                    tokens = await asyncio.to_thread(
                        self.model.tokenize,
                        _encodable(message.text, "text"),
                        message.add_special,
                        message.parse_special,
                    )
                    connection.send(TokensEvent(id=message.id, tokens=tokens))
                case DetokenizeOp():
                    try:
                        text = await asyncio.to_thread(self.model.detokenize, message.tokens)
                    except ValueError as exc:
                        raise PromptError(str(exc)) from None
                    connection.send(TextEvent(id=message.id, text=text))
        except PromptError as exc:
            connection.send(ErrorEvent(id=message.id, message=str(exc), code=exc.code))
        except Exception as exc:
            log.exception("request %s failed", message.id)
            connection.send(
                ErrorEvent(id=message.id, message=f"internal error: {exc}", code="internal")
            )

    def _share_cores(self, op: ThreadsOp) -> None:
        """Apply the daemon's share of the cores: the governor's budget, and where the
        threads may run (the CPUs the runner started with when none are named)."""
        self.engine.set_budget(op.threads, op.reason)
        if self.engine.governor.fixed:
            return  # its threads stay as asked, and where they were
        cpus = op.cpus or self._start_cpus
        if set(cpus) != self._pinned and pin_process(cpus):
            self._pinned = set(cpus)

    async def _load_adapters(self, files: list[AdapterFile]) -> list[Any]:
        """Load LoRA adapters on the engine thread (between steps); a refusal is a
        ``bad_request`` naming the adapter."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[list[Any]] = loop.create_future()

        def settle(outcome: Any) -> None:
            if done.done():
                return
            if isinstance(outcome, BaseException):
                done.set_exception(outcome)
            else:
                done.set_result(outcome)

        def work() -> None:
            try:
                outcome: Any = self.engine.adapters.load(files)
            except BaseException as exc:
                outcome = exc
            loop.call_soon_threadsafe(settle, outcome)

        def refuse() -> None:
            loop.call_soon_threadsafe(settle, RuntimeError("the engine has stopped"))

        self.engine.call(work, refuse)
        try:
            return await done
        except AdapterLoadError as exc:
            raise PromptError(str(exc)) from None

    def _adapter_set(self, uses: list[AdapterUse]) -> AdapterSet:
        """A request's adapters, each loaded in this runner (``bad_request`` otherwise)."""
        try:
            adapters = AdapterSet.of(uses)
            self.engine.adapters.check(adapters)
        except AdapterLoadError as exc:
            raise PromptError(str(exc)) from None
        return adapters

    def _cancel(self, connection: Connection, request_id: str) -> None:
        if request_id in connection.preparing:
            # Not in the engine yet: _generate ends it once preparation returns.
            connection.cancelled.add(request_id)
        else:
            self.engine.cancel(request_id)

    def _quick(self, request: GenerationRequest) -> bool:
        """Whether ``request``'s prompt is prepared on the loop, without waiting: a short text
        prompt whose template rendered quickly before (well under a millisecond: a thread
        would cost more, its start and two hand-overs)."""
        return _light(request) and self._renders.quick(
            request.template or self.default_template or ""
        )

    async def _generate(
        self, connection: Connection, op: GenerateOp, read_at: int = 0, quick: bool = False
    ) -> None:
        """Prepare a generation's prompt and hand it to the engine; with ``quick`` (see
        :meth:`_quick`) on the loop, never waiting. Until it is handed over the engine starts
        no idle work, and stops the decode of any under way (see
        :meth:`.DecodeInterrupt.expecting`)."""
        with self.model.interrupt.expecting():
            await self._prepare_and_submit(connection, op, read_at, quick)

    async def _prepare_and_submit(
        self, connection: Connection, op: GenerateOp, read_at: int, quick: bool
    ) -> None:
        request = op.request
        request.id = op.id
        adapters = self._adapter_set(request.adapters)
        connection.preparing.add(op.id)

        def work() -> tuple[Prompt, str | None]:
            return (
                prepare(self.model, request, self.default_template, self.projector),
                grammar_for(request.options),
            )

        template = request.template or self.default_template or ""
        try:
            if quick:
                # A short text prompt whose template rendered quickly before takes well under a
                # millisecond here: a thread would cost more (its start, two hand-overs).
                prompt, grammar = work()
            else:
                # A thread of its own: encoding images computes graphs (see .threads), and a
                # long prompt or a schema's grammar must not hold the other requests' events.
                prompt, grammar = await in_own_thread(work, "localllm-prepare")
            check_sampling(request.options, self.model.n_vocab)
            self._renders.record(template, prompt.template_ms - prompt.compile_ms)
        except (GrammarError, ValueError) as exc:
            if isinstance(exc, PromptError):
                raise
            raise PromptError(str(exc)) from None
        finally:
            connection.preparing.discard(op.id)
        if op.id in connection.cancelled:
            connection.cancelled.discard(op.id)
            timings = Timings(prompt_tokens=len(prompt.tokens))
            connection.send(
                DoneEvent(
                    id=op.id,
                    result=GenerationResult(
                        id=op.id, text="", done_reason="cancel", timings=timings
                    ),
                )
            )
            return
        score = self._score(request, prompt) if request.options.prompt_logprobs else None
        budget, grammar = self._reasoning(request, prompt, grammar)
        ready = PromptReadyEvent(
            id=op.id,
            prompt_tokens=len(prompt.tokens),
            prompt_tail=prompt.tail,
            dropped_messages=prompt.dropped_messages,
            dropped_tokens=prompt.dropped_tokens,
            template_ms=prompt.template_ms,
            tokenize_ms=prompt.tokenize_ms,
            read_at=read_at,
            ready_at=time.perf_counter_ns(),
        )
        job = GenerationJob(
            id=op.id,
            prompt=prompt.tokens,
            keep=prompt.keep,
            options=request.options,
            grammar=grammar,
            emit=connection.emitter(),
            return_context=request.return_context,
            render_special=request.render_special,
            images=prompt.images,
            score=score,
            budget=budget,
            adapters=adapters,
        )
        connection.send_after(ready, lambda: self.engine.submit(job))

    def _reasoning(
        self, request: GenerationRequest, prompt: Prompt, grammar: str | None
    ) -> tuple[ReasoningBudget | None, str | None]:
        """How the rendered prompt leaves the reasoning block: closed (the template switched
        reasoning off), the grammar and its triggers stop waiting for the close tag; open or
        not yet opened, a grammar for the answer waits for it, and the budget (when there is
        one) counts the reasoning. Returns (budget, grammar)."""
        options = request.options
        if len(options.reasoning_tags) != 2:
            return None, grammar
        open_tag, close_tag = options.reasoning_tags
        tail = prompt.tail.rstrip()
        if tail.endswith(close_tag):
            if options.closed_triggers is not None:
                options.grammar_triggers = list(options.closed_triggers)
            return None, grammar
        if grammar is not None and options.grammar_after_reasoning:
            grammar, trigger = grammar_after(grammar, close_tag)
            options.grammar_triggers = [trigger]
        if options.reasoning_budget < 0:
            return None, grammar
        tokens = self.model.tokenize(close_tag, add_special=False, parse_special=True)
        inside = tail.endswith(open_tag)
        budget = ReasoningBudget(open_tag, close_tag, options.reasoning_budget, tokens, inside)
        return budget, grammar

    def _score(self, request: GenerationRequest, prompt: Prompt) -> PromptScore:
        """The collector of a prompt's log probabilities, holding its first token (which has
        nothing before it). A BOS the tokenizer added shows as no text, so the tokens' texts
        add up to the prompt as the client wrote it."""
        if prompt.images:
            raise PromptError("prompt log probabilities are for text prompts, not images")
        first = prompt.tokens[0]
        added_bos = not request.context and self.model.add_bos and first == self.model.bos_id
        data = self.model.piece(first, special=not added_bos)
        entry = TokenLogprob(data.decode("utf-8", errors="replace"), 0.0, list(data))
        return PromptScore(prompt.tokens, entry)

    async def _embed(self, connection: Connection, op: EmbedOp) -> None:
        request = op.request
        adapters = self._adapter_set(request.adapters)
        limit = self.model.n_ctx_per_slot
        inputs = []
        texts: list[str | list[int]] = list(request.inputs)
        if request.token_inputs is not None:
            if request.inputs:
                raise PromptError("give inputs as texts or as token ids, not both")
            texts = list(request.token_inputs)
        if request.rank_pairs is not None:
            if texts:
                raise PromptError("give texts to embed or pairs to rank, not both")
            inputs = await asyncio.to_thread(self._rank_inputs, request)
        for index, text in enumerate(texts):
            if isinstance(text, list):
                tokens = _checked_context(self.model, text, f"input[{index}]")
            else:
                tokens = await asyncio.to_thread(
                    self.model.tokenize, _encodable(str(text), f"input[{index}]"), True, False
                )
            if not tokens:
                raise PromptError(f"input[{index}] is empty: there is nothing to embed")
            inputs.append(_fit_input(tokens, limit, request.truncate, f"input[{index}]"))
        rank = request.rank_pairs is not None
        self.engine.embed(
            EmbeddingJob(
                id=op.id,
                inputs=inputs,
                normalize=request.normalize and not rank,
                emit=connection.emitter(),
                rank=rank,
                adapters=adapters,
            )
        )

    def _rank_inputs(self, request: EmbeddingRequest) -> list[list[int]]:
        """The token sequences of a rank request's (query, document) pairs."""
        if not self.model.rank_pooling:
            raise PromptError(
                "this model cannot rank: its GGUF declares no rank pooling", "unsupported"
            )
        limit = self.model.n_ctx_per_slot
        inputs = []
        for index, (query, document) in enumerate(request.rank_pairs or []):
            _encodable(query, "query")
            tokens = self.model.rank_tokens(query, _encodable(document, f"documents[{index}]"))
            what = f"documents[{index}] with the query"
            inputs.append(_fit_input(tokens, limit, request.truncate, what))
        return inputs
