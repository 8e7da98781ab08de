"""The Ollama-compatible API: ``/api/*`` and ``/``.

Streams are NDJSON; durations are nanoseconds; errors are ``{"error": "..."}`` with Ollama's
status codes. The final chunk of a generation also carries localllm's own fields
(``ttft_duration``, ``prompt_cached_count``, ``prompt_eval_rate``, ``eval_rate``...), which
Ollama clients ignore.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, PlainTextResponse

from localllm import __version__
from localllm.store.models import LocalModel

from ..engine.text import unicode_problem
from ..errors import HTTPProblem, problem_from
from ..generation import embed, load_only, parse_keep_alive, resolve_model
from ..loadconfig import drafter_label, runner_config
from ..options import merge_options
from ..prompt.chat import chat_template
from ..prompt.template import jinja_override
from ..prompt.thinking import plan_thinking
from ..prompt.tools import ToolPlan, plan_tools
from ..state import DaemonState, StateDep
from ..toolcalls import ToolCall
from . import models as model_routes
from .core import Ask, Delta, Done, Reply, Turn, plan
from .discover import local_speed
from .logprobs import check_top_logprobs, ollama_logprobs
from .schemas_ollama import (
    ChatMessage,
    ChatRequest,
    EmbeddingsRequest,
    EmbedRequest,
    GenerateRequest,
    Options,
)
from .streaming import NDJSON, ClosingStreamingResponse, dumps, ndjson_line
from .tooling import parse_think
from .vision import Images, with_markers

__all__ = ["OLLAMA_API_VERSION", "ollama_tool_calls", "router", "timing_fields"]

log = logging.getLogger("localllm.daemon")

OLLAMA_API_VERSION = "0.9.0"
"""The Ollama release whose ``/api`` surface this daemon implements, reported as ``version``
by ``/api/version`` for the clients that check it (VS Code Copilot's Ollama provider wants at
least 0.6.4, the release whose ``/api/show`` reports ``capabilities``). 0.9.0 is the release
that added ``think`` (``message.thinking``, the ``thinking`` capability), and covers what is
served here: chat and generate with tools (calls streamed whole, as 0.8 streams them),
thinking and structured outputs, embed, show with capabilities, create from files or a
model with quantize, pull, copy, delete, ps, blobs, and images for models with a vision
projector (refused for a model without one, as 0.9.0 does). Raise it only together with
the routes and fields of a later release; localllm's own version is ``localllm_version``
(``logprobs``, ``shift`` and ``truncate``, from later releases, are served as extras)."""

router = APIRouter()
router.include_router(model_routes.router)


def now_rfc3339() -> str:
    """The current time as Ollama writes ``created_at``."""
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _options_dict(options: Options | None) -> dict[str, Any]:
    return options.model_dump(exclude_none=True) if options is not None else {}


def _format(value: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    """``format``: ``"json"`` for any JSON, a JSON schema object for structured output."""
    if value is None or value == "":
        return None
    if value == "json" or isinstance(value, dict):
        return value
    raise HTTPProblem(400, 'format must be "json" or a JSON schema object', param="format")


def require_unicode(text: str | None, field: str) -> None:
    """400 naming ``field`` when ``text`` cannot be tokenized (a lone surrogate)."""
    if text and (problem := unicode_problem(text, field)) is not None:
        raise HTTPProblem(400, problem, param=field)


def _ask(state: DaemonState, body: GenerateRequest | ChatRequest) -> Ask:
    """What /api/generate and /api/chat share: model, keep_alive, options, format,
    ``logprobs`` and ``top_logprobs``, ``shift``, ``truncate``, ``think``."""
    model = resolve_model(state, body.model_name())
    keep_alive = parse_keep_alive(body.keep_alive)
    options = merge_options(model, _options_dict(body.options))
    if "completion" not in model.capabilities():
        raise HTTPProblem(400, f"{model.name.short} does not support generate", param="model")
    top = check_top_logprobs(body.top_logprobs)
    return Ask(
        model=model,
        api="ollama",
        options=options,
        keep_alive=keep_alive,
        format=_format(body.format),
        # top_logprobs alone asks for log probabilities too: alternatives need the token.
        logprobs=bool(body.logprobs) or top > 0,
        top_logprobs=top,
        shift=body.shift,
        truncate=body.truncate is True,
        think=parse_think(body.think),
    )


def _turns(model: LocalModel, messages: list[ChatMessage], images: Images) -> list[Turn]:
    """Ollama's messages as turns. A message's ``images`` go to ``images`` (which checks
    them) and their markers before its text, as Ollama places them, whatever the role
    (Ollama reads images on any message)."""
    turns = []
    for index, message in enumerate(messages):
        content = message.content or ""
        if message.images:
            where = f"messages[{index}].images"
            markers = [
                images.add_base64(image, f"{where}[{i}]") for i, image in enumerate(message.images)
            ]
            content = with_markers(content, markers, f"messages[{index}].content")
        turns.append(
            Turn(
                role=message.role,
                content=content,
                thinking=message.thinking or None,
                tool_calls=message.tool_calls or None,
                tool_name=message.tool_name,
                tool_call_id=message.tool_call_id,
            )
        )
    return turns


def ollama_tool_calls(plan: ToolPlan, calls: list[Any], first_index: int) -> list[dict[str, Any]]:
    """Calls in Ollama's shape: ``{"id", "function": {"index", "name", "arguments"}}``."""
    return [
        {
            "id": plan.call_id(call),
            "function": {"index": first_index + i, "name": call.name, "arguments": call.arguments},
        }
        for i, call in enumerate(calls)
    ]


def timing_fields(done: Done) -> dict[str, Any]:
    """Ollama's final-chunk metrics in nanoseconds, plus localllm's own fields."""
    t = done.timings
    outcome = done.outcome
    evaluated = max(t.prompt_tokens - t.cached_tokens, 0)
    return {
        "total_duration": int(outcome.total_seconds * 1e9) if outcome else int(t.total_ms * 1e6),
        "load_duration": int(outcome.load_seconds * 1e9) if outcome else 0,
        "prompt_eval_count": t.prompt_tokens,
        "prompt_eval_duration": int(t.prompt_ms * 1e6),
        "eval_count": t.completion_tokens,
        "eval_duration": int(t.decode_ms * 1e6),
        # localllm extras: TTFT and the two phases apart; clients ignore unknown keys.
        "ttft_duration": int(t.ttft_ms * 1e6),
        "queue_duration": int(t.queued_ms * 1e6),
        # first token prefilled while every slot was busy: the wait for a slot after it
        **({"park_duration": int(t.parked_ms * 1e6)} if t.parked_ms else {}),
        "prompt_cached_count": t.cached_tokens,
        "prompt_evaluated_count": evaluated,
        "prompt_eval_rate": round(t.prompt_tokens_per_s, 2),
        "eval_rate": round(t.decode_tokens_per_s, 2),
        "draft_count": t.draft_tokens,
        "draft_accepted_count": t.draft_accepted,
        **({"drafter": t.drafter} if t.drafter else {}),
        # The CPU threads its steps ran with, against the runner's own count, and why fewer.
        **(
            {"threads_min": t.threads_min, "threads_max": t.threads_max, "threads_of": t.threads_of}
            if t.threads_of
            else {}
        ),
        **({"threads_why": t.threads_why} if t.threads_why else {}),
        # localllm: where the time to the first token went, phase by phase (nanoseconds)
        **(
            {"ttft_breakdown": {k: int(ms * 1e6) for k, ms in done.first_token.items()}}
            if done.first_token
            else {}
        ),
    }


def _final(model: str, done: Done, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": model,
        "created_at": now_rfc3339(),
        **extra,
        "done": True,
        # a call cut by the token limit is the limit, never a call
        "done_reason": "length" if done.limited else "stop",
        **timing_fields(done),
        # localllm: the reasoning budget closed the reasoning block (the answer followed)
        **({"thinking_budget_exhausted": True} if done.budget_exhausted else {}),
    }


def _fields(
    chat: bool, content: str, thinking: str, calls: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """An answer's fields: ``message`` (chat) or ``response`` and ``thinking`` (generate)."""
    if chat:
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if thinking:
            message["thinking"] = thinking
        if calls:
            message["tool_calls"] = calls
        return {"message": message}
    fields: dict[str, Any] = {"response": content}
    if thinking:
        fields["thinking"] = thinking
    return fields


async def _run(
    state: DaemonState, request: Request, ask: Ask, *, stream: bool, chat: bool
) -> Response:
    """Plan and run ``ask``; answer as NDJSON (stream) or one JSON object.

    Reasoning comes out as ``thinking`` (streamed before the answer), and with tools (chat
    only) the text before a call streams as it comes and each call arrives whole in a chunk
    of its own, as Ollama streams them. Log probabilities travel with the chunk whose text
    they produced."""
    planned = plan(state, ask)
    tools = planned.tools
    name = ask.model.name.short
    top = ask.top_logprobs
    reply = await Reply.open(state, request, planned)
    calls_sent = 0

    def calls_of(calls: list[ToolCall]) -> list[dict[str, Any]] | None:
        nonlocal calls_sent
        if not calls or tools is None:
            return None
        shaped = ollama_tool_calls(tools, calls, calls_sent)
        calls_sent += len(shaped)
        return shaped

    def final(done: Done, extra: dict[str, Any]) -> dict[str, Any]:
        # localllm: what truncation dropped from a long chat's start (Ollama says nothing)
        body = _final(name, done, {**extra, **done.truncation})
        context = done.outcome.result.context if done.outcome is not None else None
        if ask.return_context and context is not None:
            body["context"] = context
        return body

    if not stream:
        (whole,) = await reply.whole(request)
        fields = _fields(chat, whole.content, whole.thinking, calls_of(whole.calls))
        if ask.logprobs:
            fields["logprobs"] = ollama_logprobs(whole.logprobs, top)
        return JSONResponse(final(whole.done, fields), headers=reply.timing_headers(whole.done))

    # Every line starts with the model's name: encoded once, then spliced with the rest.
    head = b'{"model":' + dumps(name) + b',"created_at":"'

    def line(fields: dict[str, Any]) -> bytes:
        inner = dumps(fields)[1:-1]
        return b"".join(
            (head, now_rfc3339().encode(), b'",', inner, b"," if inner else b"", b'"done":false}\n')
        )

    def lines_for(delta: Delta) -> list[bytes]:
        pieces = []
        if delta.thinking:  # reasoning first, as Ollama streams it
            pieces.append(_fields(chat, "", delta.thinking))
        if delta.content:
            pieces.append(_fields(chat, delta.content, ""))
        calls = calls_of(delta.calls)
        if calls:
            pieces.append(_fields(chat, "", "", calls))
        if pieces and ask.logprobs:
            pieces[0]["logprobs"] = ollama_logprobs(delta.logprobs, top)
        return [line(fields) for fields in pieces]

    async def body() -> AsyncIterator[bytes]:
        try:
            async for _, event in reply.events():
                if isinstance(event, Done):
                    extra: dict[str, Any] = _fields(chat, "", "")
                    if ask.logprobs:
                        extra["logprobs"] = ollama_logprobs(event.logprobs, top)
                    yield ndjson_line(final(event, extra))
                    return
                for out in lines_for(event):
                    yield out
        except Exception as exc:
            problem = problem_from(exc, name)
            if problem.status >= 500:
                log.warning("%s: stream failed: %s", name, exc, exc_info=problem.code == "internal")
            yield ndjson_line({"error": problem.message})

    return ClosingStreamingResponse(body(), media_type=NDJSON, on_close=reply.close, timing=reply)


def _load_response(name: str, done_reason: str, extra: dict[str, Any]) -> JSONResponse:
    return JSONResponse(
        {
            "model": name,
            "created_at": now_rfc3339(),
            **extra,
            "done": True,
            "done_reason": done_reason,
        }
    )


async def _load_or_unload(
    state: DaemonState, request: Request, ask: Ask, extra: dict[str, Any]
) -> JSONResponse:
    model = ask.model
    name = model.name.short
    if ask.keep_alive == 0:
        await state.scheduler.unload(model.name.full)
        return _load_response(name, "unload", extra)
    config = runner_config(state.settings, model, ask.options)
    await load_only(state, request, model, config, ask.keep_alive)
    return _load_response(name, "load", extra)


@router.post("/api/generate", summary="Generate a completion")
async def generate(body: GenerateRequest, request: Request, state: StateDep) -> Response:
    """Ollama's /api/generate: a prompt (templated unless ``raw``), optional ``suffix``,
    ``context`` from an earlier answer, ``think``, ``logprobs``."""
    if body.raw:
        # Ollama's rule: raw means the prompt is the whole input, so nothing may wrap it.
        for field in ("system", "template", "context"):
            if getattr(body, field):
                raise HTTPProblem(
                    400,
                    f"raw mode does not support template, system, or context ({field} was given)",
                    param=field,
                )
    for field in ("prompt", "system", "suffix"):
        # Checked here because the runner sees a templated prompt as a chat message.
        require_unicode(getattr(body, field), field)
    ask = _ask(state, body)
    images = Images(state.settings, ask.model)
    markers = [
        images.add_base64(image, f"images[{i}]") for i, image in enumerate(body.images or [])
    ]
    prompt = with_markers(body.prompt or "", markers, "prompt")
    if not prompt and not body.suffix:
        return await _load_or_unload(state, request, ask, {"response": ""})
    if body.suffix:
        # fill-in-the-middle is its own prompt format: no template, no earlier exchange
        for field, value in (("context", body.context), ("think", ask.think), ("images", markers)):
            if value:
                raise HTTPProblem(400, f"{field} cannot be combined with suffix", param=field)
    ask.prompt = prompt
    ask.raw = bool(body.raw)
    ask.suffix = body.suffix or None
    ask.system = body.system
    ask.template = jinja_override(body.template)
    ask.context = list(body.context) if body.context else None
    ask.images = images
    # Ollama returns the context of templated answers only (a raw prompt has no turn to
    # continue).
    ask.return_context = not body.raw
    return await _run(state, request, ask, stream=body.stream is not False, chat=False)


@router.post("/api/chat", summary="Chat with a model")
async def chat(body: ChatRequest, request: Request, state: StateDep) -> Response:
    """Ollama's /api/chat: messages rendered with the model's chat template; ``tools``,
    ``think``, ``logprobs``."""
    ask = _ask(state, body)
    ask.tools = body.tools
    if not body.messages:
        # the request's tools and think are checked all the same
        template = chat_template(ask.model)
        plan_tools(template, body.tools, constrained_output=ask.format is not None)
        plan_thinking(template, ask.think)
        empty = {"message": {"role": "assistant", "content": ""}}
        return await _load_or_unload(state, request, ask, empty)
    # Ollama drops a long chat's oldest turns; only truncate: false asks for the 400.
    ask.truncate = body.truncate is not False
    ask.images = Images(state.settings, ask.model)
    ask.turns = _turns(ask.model, body.messages, ask.images)
    return await _run(state, request, ask, stream=body.stream is not False, chat=True)


def _shorten(vector: list[float], dimensions: int | None) -> list[float]:
    if dimensions is None or dimensions >= len(vector):
        return vector
    cut = vector[:dimensions]
    norm = math.sqrt(sum(x * x for x in cut)) or 1.0
    return [x / norm for x in cut]


@router.post("/api/embed", summary="Embed text")
async def embed_route(body: EmbedRequest, request: Request, state: StateDep) -> JSONResponse:
    """Ollama's /api/embed: one normalised vector per input."""
    model = resolve_model(state, body.model_name())
    keep_alive = parse_keep_alive(body.keep_alive)
    options = merge_options(model, _options_dict(body.options))
    inputs = [body.input] if isinstance(body.input, str) else list(body.input)
    if not [text for text in inputs if text]:
        config = runner_config(state.settings, model, options)
        load_seconds = await load_only(state, request, model, config, keep_alive)
        return JSONResponse(
            {
                "model": model.name.short,
                "embeddings": [],
                "load_duration": int(load_seconds * 1e9),
            }
        )
    result, load_seconds, total = await embed(
        state,
        request,
        model,
        runner_config(state.settings, model, options),
        inputs,
        truncate=body.truncate is not False,
        keep_alive=keep_alive,
    )
    return JSONResponse(
        {
            "model": model.name.short,
            "embeddings": [_shorten(v, body.dimensions) for v in result.embeddings],
            "total_duration": int(total * 1e9),
            "load_duration": int(load_seconds * 1e9),
            "prompt_eval_count": result.prompt_tokens,
        }
    )


@router.post("/api/embeddings", summary="Embed text (legacy)")
async def embeddings_route(
    body: EmbeddingsRequest, request: Request, state: StateDep
) -> JSONResponse:
    """Ollama's legacy /api/embeddings: ``{"embedding": [...]}`` for one prompt."""
    model = resolve_model(state, body.model_name())
    keep_alive = parse_keep_alive(body.keep_alive)
    options = merge_options(model, _options_dict(body.options))
    config = runner_config(state.settings, model, options)
    if not body.prompt:
        await load_only(state, request, model, config, keep_alive)
        return JSONResponse({"embedding": []})
    result, _, _ = await embed(
        state, request, model, config, [body.prompt], truncate=True, keep_alive=keep_alive
    )
    return JSONResponse({"embedding": result.embeddings[0] if result.embeddings else []})


@router.get("/api/version", summary="The Ollama API version served, and localllm's own")
@router.head("/api/version", include_in_schema=False)
async def version() -> dict[str, str]:
    """``{"version": <Ollama API version>, "localllm_version": <this daemon's version>}``."""
    return {"version": OLLAMA_API_VERSION, "localllm_version": __version__}


@router.get("/", summary="Liveness", response_class=PlainTextResponse)
@router.head("/", include_in_schema=False, response_class=PlainTextResponse)
async def root() -> PlainTextResponse:
    """Plain text saying the daemon runs (no API key needed)."""
    return PlainTextResponse("localllm is running")


@router.get("/api/ps", summary="Loaded models")
async def ps(state: StateDep) -> dict[str, Any]:
    """Ollama's /api/ps (``size`` and ``size_vram`` from the memory plan), plus localllm's
    slot count, runner process id, whether the model is pinned (negative keep_alive), and for
    a model split across RPC workers its ``devices`` (layers on each) and ``rpc_dropped``."""
    models = []
    loaded_models = state.scheduler.loaded()
    live = await asyncio.gather(*(state.scheduler.stats(m, timeout=0.5) for m in loaded_models))
    for loaded, stat in zip(loaded_models, live, strict=True):
        model = loaded.model
        size, size_vram = loaded.memory_size()
        expires = loaded.expires_at
        models.append(
            {
                "name": model.name.short,
                "model": model.name.short,
                "size": size,
                "digest": model.entry.digest.removeprefix("sha256:"),
                "details": model_routes.safe_details(model),
                "expires_at": (
                    datetime.fromtimestamp(expires, UTC).isoformat().replace("+00:00", "Z")
                    if expires is not None
                    else "9999-12-31T23:59:59Z"
                ),
                "size_vram": size_vram,
                "context_length": loaded.context_length,
                "slots": loaded.config.n_slots,
                "active_requests": loaded.active,
                "queued_requests": loaded.waiting,
                "runner_pid": loaded.pid,
                "kv_cache_type": loaded.config.kv_cache_type,
                "drafter": drafter_label(loaded.config),
                "kv_cells": int(loaded.health.get("n_ctx", 0) or 0),
                "pinned": loaded.pinned,
                "loaded_at": datetime.fromtimestamp(loaded.loaded_at, UTC)
                .isoformat()
                .replace("+00:00", "Z"),
            }
        )
        if stat is not None and stat.threads is not None:
            # How many CPU threads the runner uses now, and why (its CPU governor).
            models[-1]["threads"] = dataclasses.asdict(stat.threads)
        # LoRA adapters, and the other models sharing the runner (the base loaded once).
        models[-1].update(loaded.share.report(loaded))
        if allocated := loaded.health.get("allocated"):
            # What the load allocated on each device (CPU: the host's RAM), llama.cpp's figures.
            models[-1]["allocated"] = allocated
        if fallback := state.scheduler.gpu_health.fallback(loaded.key):
            models[-1]["gpu_fallback"] = fallback
        if devices := loaded.health.get("devices"):
            # Split across RPC workers: each device with the layers it holds.
            models[-1]["devices"] = devices
            models[-1]["rpc_dropped"] = loaded.health.get("rpc_dropped") or []
        # The speed model's prediction beside what the runner measured (no probe runs here).
        models[-1]["speed"] = await run_in_threadpool(
            local_speed, state, loaded, model, loaded.plan, probe=False
        )
    return {"models": models}


async def _snapshot(state: DaemonState) -> dict[str, Any]:
    loaded = state.scheduler.loaded()
    stats = await asyncio.gather(*(state.scheduler.stats(m, timeout=1.0) for m in loaded))
    models = []
    for model, stat in zip(loaded, stats, strict=True):
        entry: dict[str, Any] = {
            "name": model.name,
            "runner_pid": model.pid,
            "slots_total": model.config.n_slots,
            "context_length": model.context_length,
            "active_requests": model.active,
            "queued_requests": model.waiting,
            "expires_at": model.expires_at,
            "keep_alive": model.keep_alive,
            "recent": [vars(r) for r in list(model.recent)[-16:]],
            "history": state.scheduler.history.series(model.name),
            **model.share.report(model),
        }
        if stat is not None:
            entry.update(
                {
                    "slots": [vars(s) for s in stat.slots],
                    "runner_waiting": stat.waiting,
                    "kv_cells_used": stat.kv_cells_used,
                    "kv_cells_total": stat.kv_cells_total,
                    "decode_tokens_per_s": stat.decode_tokens_per_s,
                    "prefill_tokens_per_s": stat.prefill_tokens_per_s,
                    "requests_total": stat.requests_total,
                    "threads": dataclasses.asdict(stat.threads) if stat.threads else None,
                }
            )
        models.append(entry)
    return {
        "time": datetime.now(UTC).timestamp(),
        "queue_depth": state.scheduler.queued,
        "max_queue": state.settings.max_queue,
        "models": models,
        # The runner process started ahead for the next load ({pid, ready}; None: none now).
        "spare_runner": state.scheduler.spares.describe(),
    }


@router.get("/api/stats", summary="Live stats of loaded models (localllm)")
async def stats(
    request: Request,
    state: StateDep,
    stream: bool = False,
    interval: float = 0.25,
) -> Response:
    """A snapshot of every loaded model's slots, KV use and rates; ``stream=true`` sends one
    NDJSON line every ``interval`` seconds (0.05-10) until the client goes away."""
    if not stream:
        return JSONResponse(await _snapshot(state))
    if not (0.05 <= interval <= 10) or interval != interval:
        raise HTTPProblem(400, "interval must be between 0.05 and 10 seconds", param="interval")

    async def body() -> AsyncIterator[bytes]:
        while True:
            yield ndjson_line(await _snapshot(state))
            await asyncio.sleep(interval)

    return ClosingStreamingResponse(body(), media_type=NDJSON)


@router.get("/metrics", summary="Prometheus metrics", response_class=PlainTextResponse)
async def metrics(state: StateDep) -> Response:
    """Prometheus text exposition."""
    from ..metrics import CONTENT_TYPE_LATEST

    return Response(await state.metrics.render(state.scheduler), media_type=CONTENT_TYPE_LATEST)
