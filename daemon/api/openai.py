"""The OpenAI-compatible API: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``,
``/v1/models``, each also without the ``/v1`` prefix (as llama-server serves them, for clients
configured with a bare base URL).

Streams are server-sent events ending with ``data: [DONE]``; ``stream_options.include_usage``
adds a last chunk with ``usage`` and no choices. Errors use OpenAI's shape
``{"error": {"message", "type", "param", "code"}}`` (rendered in :mod:`..app`).
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
import struct
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from localllm.models import LocalModel

from ..errors import HTTPProblem, problem_from
from ..generation import Job, Outcome, embed, resolve_model, start, until_disconnect
from ..options import merge_options, runner_config, sampling_options
from ..runner.protocol import GenerationRequest
from ..state import DaemonState, StateDep
from ..toolcalls import Parsed, ToolCall
from .ollama import chat_messages, no_vision
from .schemas_ollama import ChatMessage
from .schemas_openai import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    Message,
    ResponseFormat,
)
from .streaming import ClosingStreamingResponse, sse_event
from .tooling import ToolPlan, model_template, plan_tools, split_output

__all__ = ["error_body", "router"]

log = logging.getLogger("localllm.daemon")

router = APIRouter()
"""The routes without a prefix; the app mounts them under ``/v1`` and at the root."""

_FINISH = {"stop": "stop", "length": "length", "cancel": "stop"}


def _usage(outcome: Outcome) -> dict[str, Any]:
    t = outcome.result.timings
    return {
        "prompt_tokens": t.prompt_tokens,
        "completion_tokens": t.completion_tokens,
        "total_tokens": t.prompt_tokens + t.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": t.cached_tokens},
        # localllm's own timings, so clients can show TTFT and prefill vs decode speed.
        "timings": {
            "ttft_ms": round(t.ttft_ms, 3),
            "queued_ms": round(t.queued_ms, 3),
            "prompt_ms": round(t.prompt_ms, 3),
            "prompt_tokens_per_s": round(t.prompt_tokens_per_s, 2),
            "decode_ms": round(t.decode_ms, 3),
            "decode_tokens_per_s": round(t.decode_tokens_per_s, 2),
            "load_ms": round(outcome.load_seconds * 1000, 3),
        },
    }


def _sampling(
    model: LocalModel, body: ChatCompletionRequest | CompletionRequest, max_tokens: int | None
) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    if max_tokens is not None:
        overrides["num_predict"] = max_tokens
    for key in ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty"):
        value = getattr(body, key)
        if value is not None:
            overrides[key] = value
    if body.stop is not None:
        stops = [body.stop] if isinstance(body.stop, str) else list(body.stop)
        if len(stops) > 16:
            raise HTTPProblem(400, "stop may hold at most 16 strings", param="stop")
        overrides["stop"] = stops
    return merge_options(model, overrides, prefix="")


def _apply_response_format(job: GenerationRequest, fmt: ResponseFormat | None) -> None:
    if fmt is None or fmt.type == "text":
        return
    if fmt.type == "json_object":
        job.options.json_mode = True
        return
    schema = fmt.json_schema.schema_ if fmt.json_schema is not None else None
    if not isinstance(schema, dict):
        raise HTTPProblem(
            400, "response_format.json_schema.schema is required", param="response_format"
        )
    job.options.json_schema = schema


def _text_content(model: LocalModel, message: Message, index: int) -> str:
    if message.content is None or isinstance(message.content, str):
        return message.content or ""
    parts = []
    for part in message.content:
        if part.type in ("image_url", "input_image", "image"):
            raise HTTPProblem(400, no_vision(model), param=f"messages[{index}].content")
        if part.type != "text":
            raise HTTPProblem(
                400,
                f"content parts of type {part.type!r} are not supported (only text)",
                param=f"messages[{index}].content",
            )
        parts.append(part.text or "")
    return "".join(parts)


def _messages(
    model: LocalModel, body: ChatCompletionRequest, plan: ToolPlan | None
) -> list[dict[str, Any]]:
    converted = []
    for i, m in enumerate(body.messages):
        message = ChatMessage(
            role="system" if m.role == "developer" else m.role,
            content=_text_content(model, m, i),
            tool_calls=m.tool_calls,
            tool_call_id=m.tool_call_id,
            # a tool result's name is the tool's (OpenAI's deprecated function messages)
            tool_name=m.name if m.role == "tool" else None,
        )
        converted.append(message)
    return chat_messages(model, converted, plan=plan)


def _include_usage(body: ChatCompletionRequest | CompletionRequest) -> bool:
    return bool(body.stream_options and body.stream_options.include_usage)


def _check_model(model: LocalModel) -> None:
    if "completion" not in model.capabilities():
        raise HTTPProblem(400, f"{model.name.short} cannot generate text", param="model")


async def _answer(
    state: DaemonState,
    request: Request,
    job: Job,
    *,
    stream: bool,
    include_usage: bool,
    object_name: str,
    id_prefix: str,
    choice: Callable[[Parsed, str | None], dict[str, Any]],
    delta: Callable[[Parsed | None, str | None, bool], dict[str, Any]],
    plan: ToolPlan | None = None,
) -> Response:
    """Run ``job`` and answer in OpenAI's shape; with a tool ``plan`` the text is parsed for
    calls (streamed: text before a call streams as it comes, each call comes whole)."""
    name = job.model.name.short
    generation = await start(state, request, job)
    ident = f"{id_prefix}-{secrets.token_hex(12)}"
    created = int(time.time())
    base = {"id": ident, "created": created, "model": name, "system_fingerprint": "localllm"}

    if not stream:
        text, outcome = await generation.whole(request)
        parsed = split_output(plan, text)
        finish = "tool_calls" if parsed.calls else _FINISH.get(outcome.result.done_reason, "stop")
        return JSONResponse(
            {
                **base,
                "object": object_name,
                "choices": [choice(parsed, finish)],
                "usage": _usage(outcome),
            }
        )
    parser = plan.parser() if plan is not None else None
    calls_sent = 0

    def limited(parsed: Parsed) -> Parsed:
        nonlocal calls_sent
        if plan is not None and not plan.parallel:
            parsed.calls = parsed.calls[: max(1 - calls_sent, 0)]
        calls_sent += len(parsed.calls)
        return parsed

    chunk_object = f"{object_name}.chunk" if object_name == "chat.completion" else object_name

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return sse_event({**base, "object": chunk_object, "choices": choices, **extra})

    async def body() -> AsyncIterator[bytes]:
        first = True
        try:
            async for event in generation.events():
                if isinstance(event, Outcome):
                    if event.result.done_reason == "error":
                        yield _sse_error(500, event.result.error or "generation failed")
                        return
                    if parser is not None:
                        rest = limited(parser.finish())
                        if rest:
                            yield chunk([delta(rest, None, first)])
                            first = False
                    finish = _FINISH.get(event.result.done_reason, "stop")
                    if calls_sent:
                        finish = "tool_calls"
                    yield chunk([delta(None, finish, first)])
                    if include_usage:
                        yield chunk([], usage=_usage(event))
                else:
                    parsed = limited(parser.feed(event)) if parser else Parsed(content=event)
                    if parsed:
                        yield chunk([delta(parsed, None, first)])
                        first = False
        except Exception as exc:
            yield _sse_error(problem_from(exc, name))
            return
        yield sse_event("[DONE]")

    return ClosingStreamingResponse(
        body(), media_type="text/event-stream", on_close=generation.close
    )


def _sse_error(problem: HTTPProblem | int, message: str = "") -> bytes:
    if isinstance(problem, int):
        problem = HTTPProblem(problem, message)
    return sse_event({"error": error_body(problem)["error"]})


_OVERFLOW_PARAM = {"chat/completions": "messages", "completions": "prompt", "embeddings": "input"}


def error_body(problem: HTTPProblem, path: str = "") -> dict[str, Any]:
    """OpenAI's error object for ``problem`` on the route at ``path``.

    A prompt over the context is OpenAI's ``context_length_exceeded`` (what its clients and
    agents that trim history look for), naming the request field that holds the prompt."""
    code, param = problem.code, problem.param
    if code in ("context_overflow", "context_length_exceeded"):
        code = "context_length_exceeded"
        route = path.removeprefix("/v1").strip("/")
        param = param or _OVERFLOW_PARAM.get(route)
    kinds = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "invalid_request_error",
        429: "rate_limit_error",
        501: "not_implemented",
        503: "server_busy",
    }
    return {
        "error": {
            "message": problem.message,
            "type": kinds.get(problem.status, "api_error"),
            "param": param,
            "code": code,
        }
    }


@router.post("/chat/completions", summary="Chat completion (OpenAI)")
async def chat_completions(
    body: ChatCompletionRequest, request: Request, state: StateDep
) -> Response:
    """OpenAI's chat completions, streamed as SSE when ``stream`` is true."""
    model = resolve_model(state, body.model)
    _check_model(model)
    formatted = body.response_format is not None and body.response_format.type != "text"
    plan = plan_tools(
        model,
        body.tools,
        tool_choice=body.tool_choice,
        parallel=body.parallel_tool_calls,
        constrained_output=formatted,
    )
    max_tokens = body.max_completion_tokens or body.max_tokens
    options = _sampling(model, body, max_tokens)
    runner_request = GenerationRequest(
        id="",
        messages=_messages(model, body, plan),
        template=model_template(model),
        options=sampling_options(options),
        tools=plan.tools if plan is not None else None,
    )
    _apply_response_format(runner_request, body.response_format)
    if plan is not None and plan.grammar is not None:
        runner_request.options.grammar = plan.grammar
    job = Job.for_model(state, model, options, runner_request, None, "openai")
    call_index = 0

    def openai_calls(calls: list[ToolCall], streamed: bool) -> list[dict[str, Any]]:
        nonlocal call_index
        assert plan is not None
        out = []
        for call in calls:
            item: dict[str, Any] = {
                "id": plan.call_id(call),
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
            }
            if streamed:
                item = {"index": call_index, **item}
            call_index += 1
            out.append(item)
        return out

    def choice(parsed: Parsed, finish: str | None) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
        if parsed.thinking:  # llama-server's and DeepSeek's field for reasoning
            message["reasoning_content"] = parsed.thinking
        if parsed.calls:
            message["content"] = parsed.content or None
            message["tool_calls"] = openai_calls(parsed.calls, streamed=False)
        return {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}

    def delta(parsed: Parsed | None, finish: str | None, first: bool) -> dict[str, Any]:
        content: dict[str, Any] = {}
        if first:
            content["role"] = "assistant"
        if parsed is not None:
            if parsed.thinking:
                content["reasoning_content"] = parsed.thinking
            if parsed.content or not (parsed.calls or parsed.thinking):
                content["content"] = parsed.content
            if parsed.calls:
                content["tool_calls"] = openai_calls(parsed.calls, streamed=True)
        return {"index": 0, "delta": content, "finish_reason": finish, "logprobs": None}

    return await _answer(
        state,
        request,
        job,
        stream=bool(body.stream),
        include_usage=_include_usage(body),
        object_name="chat.completion",
        id_prefix="chatcmpl",
        choice=choice,
        delta=delta,
        plan=plan,
    )


@router.post("/completions", summary="Text completion (OpenAI), with suffix for FIM")
async def completions(body: CompletionRequest, request: Request, state: StateDep) -> Response:
    """OpenAI's legacy completions: a raw prompt, or fill-in-the-middle with ``suffix``."""
    model = resolve_model(state, body.model)
    _check_model(model)
    if isinstance(body.prompt, list):
        if len(body.prompt) != 1:
            raise HTTPProblem(400, "prompt must be a single string", param="prompt")
        prompt = body.prompt[0]
    else:
        prompt = body.prompt
    options = _sampling(model, body, body.max_tokens)
    runner_request = GenerationRequest(
        id="",
        prompt=prompt,
        raw=True,
        suffix=body.suffix or None,
        options=sampling_options(options),
    )
    job = Job.for_model(state, model, options, runner_request, None, "openai")
    echo = prompt if body.echo else ""

    def choice(parsed: Parsed, finish: str | None) -> dict[str, Any]:
        return {
            "index": 0,
            "text": echo + parsed.content,
            "finish_reason": finish,
            "logprobs": None,
        }

    def delta(parsed: Parsed | None, finish: str | None, first: bool) -> dict[str, Any]:
        shown = (echo if first else "") + (parsed.content if parsed is not None else "")
        return {"index": 0, "text": shown, "finish_reason": finish, "logprobs": None}

    return await _answer(
        state,
        request,
        job,
        stream=bool(body.stream),
        include_usage=_include_usage(body),
        object_name="text_completion",
        id_prefix="cmpl",
        choice=choice,
        delta=delta,
    )


def _encode(vector: list[float], encoding: str | None, dimensions: int | None) -> Any:
    if dimensions is not None and dimensions < len(vector):
        vector = vector[:dimensions]
        norm = sum(x * x for x in vector) ** 0.5 or 1.0
        vector = [x / norm for x in vector]
    if encoding == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return vector


@router.post("/embeddings", summary="Embeddings (OpenAI)")
async def embeddings(body: EmbeddingRequest, request: Request, state: StateDep) -> JSONResponse:
    """OpenAI's embeddings; ``encoding_format`` float or base64 (what the SDK asks for)."""
    model = resolve_model(state, body.model)
    options = merge_options(model, {})
    config = runner_config(state.settings, model, options)
    if isinstance(body.input, str):
        inputs = [body.input]
    elif all(isinstance(item, str) for item in body.input):
        inputs = [str(item) for item in body.input]
    else:
        inputs = await _texts_of_tokens(state, request, model, config, body.input)
    if not inputs or any(not text for text in inputs):
        raise HTTPProblem(400, "input must be a non-empty string or list of them", param="input")
    # OpenAI refuses an input over the model's context (400) rather than cutting it.
    result, _, _ = await embed(
        state, request, model, config, inputs, truncate=False, keep_alive=None
    )
    return JSONResponse(
        {
            "object": "list",
            "data": [
                {
                    "object": "embedding",
                    "index": i,
                    "embedding": _encode(v, body.encoding_format, body.dimensions),
                }
                for i, v in enumerate(result.embeddings)
            ],
            "model": model.name.short,
            "usage": {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens},
        }
    )


async def _texts_of_tokens(
    state: DaemonState,
    request: Request,
    model: LocalModel,
    config: Any,
    value: list[Any],
) -> list[str]:
    """Token-array ``input`` (one array, or a list of them) as text, checked to be exact.

    The ids are the model's own vocabulary's, as llama-server and vLLM read them. The runner
    embeds text, so the ids are turned into text and that text must tokenize back to the
    very same ids: otherwise the embedding would be of other tokens, and the request gets a
    400 instead."""
    arrays: list[list[int]] = [value] if value and isinstance(value[0], int) else value
    if not arrays or any(not array for array in arrays):
        raise HTTPProblem(400, "input must not hold an empty token array", param="input")

    async def convert() -> list[str]:
        lease = await state.scheduler.acquire(model, config, None)
        async with lease:
            texts = []
            for index, ids in enumerate(arrays):
                text = await lease.runner.detokenize(ids)
                if await lease.runner.tokenize(text) != ids:
                    raise HTTPProblem(
                        400,
                        f"input[{index}]: these token ids do not spell a text that tokenizes "
                        "back to the same ids in this model's vocabulary; send the text instead",
                        param="input",
                    )
                texts.append(text)
            return texts

    try:
        return await until_disconnect(request, convert())
    except HTTPProblem:
        raise
    except Exception as exc:
        raise problem_from(exc, model.name.short) from exc


def _model_object(name: str, created: float) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": int(created), "owned_by": "library"}


@router.get("/models", summary="List models (OpenAI)")
async def list_models(state: StateDep) -> dict[str, Any]:
    """Every local model."""
    entries = await run_in_threadpool(state.store.list)
    return {"object": "list", "data": [_model_object(e.name.short, e.modified) for e in entries]}


@router.get("/models/{model_id:path}", summary="Describe a model (OpenAI)")
async def get_model(model_id: str, state: StateDep) -> dict[str, Any]:
    """One local model; 404 if it does not exist."""
    model = resolve_model(state, model_id)
    return _model_object(model.name.short, model.entry.modified)
