"""The OpenAI-compatible API: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``,
``/v1/models``.

Streams are server-sent events ending with ``data: [DONE]``; ``stream_options.include_usage``
adds a last chunk with ``usage`` and no choices. Errors use OpenAI's shape
``{"error": {"message", "type", "param", "code"}}`` (rendered in :mod:`..app`).
"""

from __future__ import annotations

import base64
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
from ..generation import Job, Outcome, embed, resolve_model, start
from ..options import merge_options, runner_config, sampling_options
from ..runner.protocol import GenerationRequest
from ..state import DaemonState, StateDep
from .ollama import chat_messages
from .schemas_ollama import ChatMessage
from .schemas_openai import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    Message,
    ResponseFormat,
)
from .streaming import ClosingStreamingResponse, sse_event

__all__ = ["router"]

log = logging.getLogger("localllm.daemon")

router = APIRouter(prefix="/v1")

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


def _text_content(message: Message, index: int) -> str:
    if message.content is None or isinstance(message.content, str):
        return message.content or ""
    parts = []
    for part in message.content:
        if part.type != "text":
            raise HTTPProblem(
                400,
                f"content parts of type {part.type!r} are not supported (only text)",
                param=f"messages[{index}].content",
            )
        parts.append(part.text or "")
    return "".join(parts)


def _messages(model: LocalModel, body: ChatCompletionRequest) -> list[dict[str, Any]]:
    converted = [
        ChatMessage(role="system" if m.role == "developer" else m.role, content=_text_content(m, i))
        for i, m in enumerate(body.messages)
    ]
    return chat_messages(model, converted)


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
    choice: Callable[[str, str | None], dict[str, Any]],
    delta: Callable[[str | None, str | None, bool], dict[str, Any]],
) -> Response:
    name = job.model.name.short
    generation = await start(state, request, job)
    ident = f"{id_prefix}-{secrets.token_hex(12)}"
    created = int(time.time())
    base = {"id": ident, "created": created, "model": name, "system_fingerprint": "localllm"}

    if not stream:
        text, outcome = await generation.whole(request)
        finish = _FINISH.get(outcome.result.done_reason, "stop")
        return JSONResponse(
            {
                **base,
                "object": object_name,
                "choices": [choice(text, finish)],
                "usage": _usage(outcome),
            }
        )

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
                    finish = _FINISH.get(event.result.done_reason, "stop")
                    yield chunk([delta(None, finish, first)])
                    if include_usage:
                        yield chunk([], usage=_usage(event))
                else:
                    yield chunk([delta(event, None, first)])
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


def error_body(problem: HTTPProblem) -> dict[str, Any]:
    """OpenAI's error object for ``problem``."""
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
            "param": problem.param,
            "code": problem.code,
        }
    }


@router.post("/chat/completions", summary="Chat completion (OpenAI)")
async def chat_completions(
    body: ChatCompletionRequest, request: Request, state: StateDep
) -> Response:
    """OpenAI's chat completions, streamed as SSE when ``stream`` is true."""
    model = resolve_model(state, body.model)
    _check_model(model)
    if body.tools:
        raise HTTPProblem(400, f"{model.name.short} does not support tools", param="tools")
    max_tokens = body.max_completion_tokens or body.max_tokens
    options = _sampling(model, body, max_tokens)
    runner_request = GenerationRequest(
        id="", messages=_messages(model, body), options=sampling_options(options)
    )
    _apply_response_format(runner_request, body.response_format)
    job = Job.for_model(state, model, options, runner_request, None, "openai")

    def choice(text: str, finish: str | None) -> dict[str, Any]:
        return {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": finish,
            "logprobs": None,
        }

    def delta(text: str | None, finish: str | None, first: bool) -> dict[str, Any]:
        content: dict[str, Any] = {}
        if first:
            content["role"] = "assistant"
        if text is not None:
            content["content"] = text
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

    def choice(text: str, finish: str | None) -> dict[str, Any]:
        return {"index": 0, "text": echo + text, "finish_reason": finish, "logprobs": None}

    def delta(text: str | None, finish: str | None, first: bool) -> dict[str, Any]:
        shown = (echo if first else "") + (text or "")
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
    if isinstance(body.input, str):
        inputs = [body.input]
    elif all(isinstance(item, str) for item in body.input):
        inputs = [str(item) for item in body.input]
    else:
        raise HTTPProblem(400, "token arrays are not supported; send text", param="input")
    if not inputs or any(not text for text in inputs):
        raise HTTPProblem(400, "input must be a non-empty string or list of them", param="input")
    options = merge_options(model, {})
    result, _, _ = await embed(
        state,
        request,
        model,
        runner_config(state.settings, model, options),
        inputs,
        truncate=True,
        keep_alive=None,
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
