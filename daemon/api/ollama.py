"""The Ollama-compatible API: ``/api/*`` and ``/``.

Streams are NDJSON; durations are nanoseconds; errors are ``{"error": "..."}`` with Ollama's
status codes. The final chunk of a generation also carries localllm's own fields
(``ttft_duration``, ``prompt_cached_count``, ``prompt_eval_rate``, ``eval_rate``...), which
Ollama clients ignore.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse

from localllm import __version__
from localllm.models import LocalModel

from ..errors import HTTPProblem, problem_from
from ..generation import (
    Job,
    Outcome,
    embed,
    load_only,
    parse_keep_alive,
    resolve_model,
    start,
    timing_fields,
)
from ..options import drafter_label, merge_options, runner_config, sampling_options
from ..runner.protocol import GenerationRequest, SamplingOptions, TokenLogprob
from ..runner.text import unicode_problem
from ..state import DaemonState, StateDep
from ..toolcalls import Parsed
from . import models as model_routes
from .logprobs import apply_logprobs, check_top_logprobs, ollama_logprobs
from .schemas_ollama import (
    ChatMessage,
    ChatRequest,
    EmbeddingsRequest,
    EmbedRequest,
    GenerateRequest,
    Options,
)
from .streaming import NDJSON, ClosingStreamingResponse, dumps, ndjson_line
from .tooling import (
    AnswerStream,
    ThinkPlan,
    ToolPlan,
    history_tool_calls,
    jinja_override,
    map_call_id,
    model_template,
    parse_think,
    plan_thinking,
    plan_tools,
)
from .vision import Images, no_vision, with_markers

__all__ = ["OLLAMA_API_VERSION", "chat_messages", "no_vision", "ollama_tool_calls", "router"]

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


def apply_format(sampling: SamplingOptions, value: str | dict[str, Any] | None) -> None:
    """``format``: ``"json"`` for any JSON, a JSON schema object for structured output."""
    if value is None or value == "":
        return
    if value == "json":
        sampling.json_mode = True
    elif isinstance(value, dict):
        sampling.json_schema = value
    else:
        raise HTTPProblem(400, 'format must be "json" or a JSON schema object', param="format")


def require_unicode(text: str | None, field: str) -> None:
    """400 naming ``field`` when ``text`` cannot be tokenized (a lone surrogate)."""
    if text and (problem := unicode_problem(text, field)) is not None:
        raise HTTPProblem(400, problem, param=field)


def _prepare(
    state: DaemonState, body: GenerateRequest | ChatRequest
) -> tuple[LocalModel, float | None, dict[str, Any]]:
    """The checks /api/generate and /api/chat share: model, keep_alive, merged options."""
    model = resolve_model(state, body.model_name())
    keep_alive = parse_keep_alive(body.keep_alive)
    options = merge_options(model, _options_dict(body.options))
    if "completion" not in model.capabilities():
        raise HTTPProblem(400, f"{model.name.short} does not support generate", param="model")
    return model, keep_alive, options


def _sampling(body: GenerateRequest | ChatRequest, options: dict[str, Any]) -> SamplingOptions:
    """Sampling of a generate or chat request: its options, ``format``, ``logprobs`` and
    ``top_logprobs``, and ``shift``."""
    sampling = sampling_options(options)
    apply_format(sampling, body.format)
    top = check_top_logprobs(body.top_logprobs)
    # top_logprobs alone asks for log probabilities too: alternatives need the chosen token.
    apply_logprobs(sampling, bool(body.logprobs) or top > 0, top)
    if body.shift is False:
        sampling.shift = False
    return sampling


def chat_messages(
    model: LocalModel,
    messages: list[ChatMessage],
    system: str | None = None,
    plan: ToolPlan | None = None,
    images: Images | None = None,
) -> list[dict[str, Any]]:
    """The conversation the runner renders: system prompt, the model's MESSAGEs, the chat.

    Calls and tool results keep the fields chat templates read (Hugging Face's convention):
    an assistant's ``tool_calls`` with arguments as objects, a tool result's
    ``tool_call_id`` and its tool's ``name`` (Ollama's ``tool_name``), an assistant's
    reasoning as ``reasoning_content`` (what Qwen3's and DeepSeek's templates read) and
    ``thinking`` (Ollama's name). A message's ``images`` go to ``images`` (which checks them)
    and their markers before its text, as Ollama places them, whatever the role (Ollama
    reads images on any message)."""
    out: list[dict[str, Any]] = []
    has_system = any(m.role == "system" for m in messages)
    system_text = system if system is not None else model.system
    if system_text and not has_system:
        out.append({"role": "system", "content": system_text})
    for example in model.messages:
        out.append(
            {"role": str(example.get("role", "user")), "content": example.get("content", "")}
        )
    for index, message in enumerate(messages):
        content = message.content or ""
        if message.images:
            where = f"messages[{index}].images"
            if images is None:
                raise HTTPProblem(400, no_vision(model), param=where)
            markers = [
                images.add_base64(image, f"{where}[{i}]") for i, image in enumerate(message.images)
            ]
            content = with_markers(content, markers, f"messages[{index}].content")
        item: dict[str, Any] = {"role": message.role.lower(), "content": content}
        if message.thinking:
            item["reasoning_content"] = message.thinking
            item["thinking"] = message.thinking
        if message.tool_calls:
            item["tool_calls"] = history_tool_calls(
                message.tool_calls, f"messages[{index}].tool_calls", plan
            )
        if message.tool_name:
            item["tool_name"] = message.tool_name
            item["name"] = message.tool_name
        if message.tool_call_id:
            item["tool_call_id"] = map_call_id(message.tool_call_id, plan)
        out.append(item)
    return out


def ollama_tool_calls(plan: ToolPlan, calls: list[Any], first_index: int) -> list[dict[str, Any]]:
    """Calls in Ollama's shape: ``{"id", "function": {"index", "name", "arguments"}}``."""
    return [
        {
            "id": plan.call_id(call),
            "function": {"index": first_index + i, "name": call.name, "arguments": call.arguments},
        }
        for i, call in enumerate(calls)
    ]


def _final(model: str, outcome: Outcome, extra: dict[str, Any]) -> dict[str, Any]:
    result = outcome.result
    done_reason = result.done_reason if result.done_reason in ("stop", "length") else "stop"
    return {
        "model": model,
        "created_at": now_rfc3339(),
        **extra,
        "done": True,
        "done_reason": done_reason,
        **timing_fields(outcome),
    }


def _fields(
    chat: bool, parsed: Parsed, calls: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """An answer's fields: ``message`` (chat) or ``response`` and ``thinking`` (generate)."""
    if chat:
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
        if parsed.thinking:
            message["thinking"] = parsed.thinking
        if calls:
            message["tool_calls"] = calls
        return {"message": message}
    fields: dict[str, Any] = {"response": parsed.content}
    if parsed.thinking:
        fields["thinking"] = parsed.thinking
    return fields


async def _run(
    state: DaemonState,
    request: Request,
    job: Job,
    *,
    stream: bool,
    chat: bool,
    tools: ToolPlan | None = None,
    think: ThinkPlan | None = None,
    return_context: bool = False,
) -> Response:
    """Run ``job`` and answer as NDJSON (stream) or one JSON object.

    The output goes through an :class:`AnswerStream`: reasoning comes out as ``thinking``
    (streamed before the answer), and with a tool ``plan`` (chat only) the text before a call
    streams as it comes and each call arrives whole in a chunk of its own, as Ollama streams
    them. Log probabilities travel with the chunk whose text they produced (text a parser
    holds back takes its tokens' log probabilities along to the chunk that releases it)."""
    name = job.model.name.short
    options = job.request.options
    top = options.top_logprobs
    generation = await start(state, request, job)
    # Only now is the rendered prompt known: did the template open the reasoning block?
    answer = AnswerStream(tools, think, generation.stream.prompt_tail)
    calls_sent = 0

    def calls_of(parsed: Parsed) -> list[dict[str, Any]] | None:
        nonlocal calls_sent
        if not parsed.calls or tools is None:
            return None
        calls = ollama_tool_calls(tools, parsed.calls, calls_sent)
        calls_sent += len(calls)
        return calls

    def final(outcome: Outcome, parsed: Parsed, logprobs: list[TokenLogprob]) -> dict[str, Any]:
        fields = _fields(chat, parsed, calls_of(parsed))
        if options.logprobs:
            fields["logprobs"] = ollama_logprobs(logprobs, top)
        body = _final(name, outcome, {**fields, **generation.truncation()})
        if return_context and outcome.result.context is not None:
            body["context"] = outcome.result.context
        return body

    if not stream:
        text, outcome = await generation.whole(request)
        return JSONResponse(final(outcome, answer.whole(text), outcome.logprobs))

    # Every line starts with the model's name: encoded once, then spliced with the rest.
    head = b'{"model":' + dumps(name) + b',"created_at":"'

    def line(fields: dict[str, Any]) -> bytes:
        inner = dumps(fields)[1:-1]
        return b"".join(
            (head, now_rfc3339().encode(), b'",', inner, b"," if inner else b"", b'"done":false}\n')
        )

    def lines_for(parsed: Parsed, logprobs: list[TokenLogprob]) -> list[bytes]:
        pieces = []
        if parsed.thinking:  # reasoning first, as Ollama streams it
            pieces.append(_fields(chat, Parsed(thinking=parsed.thinking)))
        if parsed.content:
            pieces.append(_fields(chat, Parsed(content=parsed.content)))
        calls = calls_of(parsed)
        if calls:
            pieces.append(_fields(chat, Parsed(), calls))
        if pieces and options.logprobs:
            pieces[0]["logprobs"] = ollama_logprobs(logprobs, top)
        return [line(fields) for fields in pieces]

    async def body() -> AsyncIterator[bytes]:
        pending: list[TokenLogprob] = []
        try:
            async for item in generation.chunks():
                if isinstance(item, Outcome):
                    if item.result.done_reason == "error":
                        yield ndjson_line({"error": item.result.error or "generation failed"})
                        return
                    rest = answer.finish()
                    if rest:
                        for out in lines_for(rest, pending):
                            yield out
                        pending = []
                    yield ndjson_line(final(item, Parsed(), pending))
                    return
                pending += item.logprobs or []
                parsed = answer.feed(item.text) if item.text else Parsed()
                if parsed:
                    for out in lines_for(parsed, pending):
                        yield out
                    pending = []
        except Exception as exc:
            problem = problem_from(exc, name)
            if problem.status >= 500:
                log.warning("%s: stream failed: %s", name, exc, exc_info=problem.code == "internal")
            yield ndjson_line({"error": problem.message})

    return ClosingStreamingResponse(body(), media_type=NDJSON, on_close=generation.close)


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
    state: DaemonState,
    request: Request,
    model: LocalModel,
    options: dict[str, Any],
    keep_alive: float | None,
    extra: dict[str, Any],
) -> JSONResponse:
    name = model.name.short
    if keep_alive == 0:
        await state.scheduler.unload(model.name.full)
        return _load_response(name, "unload", extra)
    config = runner_config(state.settings, model, options)
    await load_only(state, request, model, config, keep_alive)
    return _load_response(name, "load", extra)


# The runner's template for a model that has none (its prepare() falls back to the same).
_PLAIN_TEMPLATE = "{% for message in messages %}{{ message['content'] }}\n\n{% endfor %}"


def _continuation(
    model: LocalModel,
    body: GenerateRequest,
    template: str | None,
    kwargs: dict[str, Any],
    prompt: str,
) -> str:
    """The templated prompt of a generate request that continues ``context``.

    Ollama renders the new prompt and puts it after the context's tokens; the runner takes
    ``context`` only before a prompt it does not template, so the template is rendered here
    (in the same sandbox the runner uses). The model's default system prompt was part of
    the earlier exchange and is not repeated; a ``system`` in the request is. The prompt
    continues a sequence, so the template's BOS text is left out (``bos_token`` is empty).
    """
    from ..runner.chat import TemplateRenderError, render_chat

    messages: list[dict[str, Any]] = []
    if body.system:
        messages.append({"role": "system", "content": body.system})
    messages.append({"role": "user", "content": prompt})
    try:
        return render_chat(
            template or model.info.chat_template or _PLAIN_TEMPLATE,
            messages,
            add_generation_prompt=True,
            extra=kwargs,
        )
    except TemplateRenderError as exc:
        raise HTTPProblem(400, str(exc), param="template") from None


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
    model, keep_alive, options = _prepare(state, body)
    think = parse_think(body.think)
    images = Images(state.settings, model)
    markers = [
        images.add_base64(image, f"images[{i}]") for i, image in enumerate(body.images or [])
    ]
    prompt = with_markers(body.prompt or "", markers, "prompt")
    if not prompt and not body.suffix:
        return await _load_or_unload(state, request, model, options, keep_alive, {"response": ""})
    if body.suffix:
        # fill-in-the-middle is its own prompt format: no template, no earlier exchange
        for field, value in (("context", body.context), ("think", think), ("images", markers)):
            if value:
                raise HTTPProblem(400, f"{field} cannot be combined with suffix", param=field)
    runner_request = GenerationRequest(
        id="", options=_sampling(body, options), truncate=body.truncate is True
    )
    thinking: ThinkPlan | None = None
    if body.raw or body.suffix:
        runner_request.prompt = prompt
        runner_request.raw = bool(body.raw)
        runner_request.suffix = body.suffix
        if body.raw and think:
            # no template to switch: the reasoning the model writes is split out
            thinking = plan_thinking(model, think)
    else:
        template = jinja_override(body.template) or model_template(model)
        thinking = plan_thinking(model, think, template=template)
        if body.context:
            kwargs = thinking.template_kwargs() if thinking is not None else {}
            runner_request.prompt = _continuation(model, body, template, kwargs, prompt)
            runner_request.raw = True
            runner_request.context = list(body.context)
        else:
            user = [ChatMessage(role="user", content=prompt)]
            runner_request.messages = chat_messages(model, user, body.system)
            runner_request.template = template
    runner_request.images = images.encoded
    # Ollama returns the context of templated answers only (a raw prompt has no turn to
    # continue).
    runner_request.return_context = not body.raw
    if thinking is not None:
        thinking.apply(runner_request)
    job = Job.for_model(state, model, options, runner_request, keep_alive, "ollama")
    return await _run(
        state,
        request,
        job,
        stream=body.stream is not False,
        chat=False,
        think=thinking,
        return_context=not body.raw,
    )


@router.post("/api/chat", summary="Chat with a model")
async def chat(body: ChatRequest, request: Request, state: StateDep) -> Response:
    """Ollama's /api/chat: messages rendered with the model's chat template; ``tools``,
    ``think``, ``logprobs``."""
    model, keep_alive, options = _prepare(state, body)
    plan = plan_tools(model, body.tools, constrained_output=bool(body.format))
    thinking = plan_thinking(model, parse_think(body.think))
    empty_message = {"message": {"role": "assistant", "content": ""}}
    if not body.messages:
        return await _load_or_unload(state, request, model, options, keep_alive, empty_message)
    images = Images(state.settings, model)
    runner_request = GenerationRequest(
        id="",
        messages=chat_messages(model, body.messages, plan=plan, images=images),
        template=model_template(model),
        options=_sampling(body, options),
        # Ollama drops a long chat's oldest turns; only truncate: false asks for the 400.
        truncate=body.truncate is not False,
        images=images.encoded,
    )
    if plan is not None:
        plan.apply(runner_request)
    if thinking is not None:
        thinking.apply(runner_request)
    job = Job.for_model(state, model, options, runner_request, keep_alive, "ollama")
    return await _run(
        state,
        request,
        job,
        stream=body.stream is not False,
        chat=True,
        tools=plan,
        think=thinking,
    )


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
    for loaded in state.scheduler.loaded():
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
                "queued_requests": loaded.pending,
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
        if devices := loaded.health.get("devices"):
            # Split across RPC workers: each device with the layers it holds.
            models[-1]["devices"] = devices
            models[-1]["rpc_dropped"] = loaded.health.get("rpc_dropped") or []
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
            "queued_requests": model.pending,
            "expires_at": model.expires_at,
            "keep_alive": model.keep_alive,
            "recent": [vars(r) for r in list(model.recent)[-16:]],
            "history": state.scheduler.history.series(model.name),
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
                }
            )
        models.append(entry)
    return {
        "time": datetime.now(UTC).timestamp(),
        "queue_depth": state.scheduler.queued,
        "max_queue": state.settings.max_queue,
        "models": models,
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
