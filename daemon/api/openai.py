"""The OpenAI-compatible API: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``,
``/v1/models``, each also without the ``/v1`` prefix (as llama-server serves them, for clients
configured with a bare base URL).

Streams are server-sent events ending with ``data: [DONE]``; ``stream_options.include_usage``
adds a last chunk with ``usage`` and no choices. Errors use OpenAI's shape
``{"error": {"message", "type", "param", "code"}}`` (rendered in :mod:`..app`).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import logging
import secrets
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from localllm.models import LocalModel

from ..errors import HTTPProblem, problem_from
from ..generation import Generation, Job, Outcome, embed, resolve_model, start
from ..options import merge_options, runner_config, sampling_options
from ..runner.protocol import (
    GenerationRequest,
    SamplingOptions,
    TokenLogprob,
)
from ..state import DaemonState, StateDep
from ..toolcalls import Parsed, ToolCall
from .logprobs import LegacyLogprobs, apply_logprobs, chat_logprobs, check_top_logprobs
from .ollama import chat_messages
from .schemas_ollama import ChatMessage
from .schemas_openai import (
    ChatCompletionRequest,
    CompletionRequest,
    ContentPart,
    EmbeddingRequest,
    Message,
    ResponseFormat,
)
from .streaming import ClosingStreamingResponse, dumps, sse_event
from .tooling import (
    AnswerStream,
    ThinkPlan,
    ToolPlan,
    model_template,
    plan_thinking,
    plan_tools,
    reasoning_effort_think,
)
from .vision import Images, no_vision

__all__ = ["error_body", "router"]

log = logging.getLogger("localllm.daemon")

router = APIRouter()
"""The routes without a prefix; the app mounts them under ``/v1`` and at the root."""

_FINISH = {"stop": "stop", "length": "length", "cancel": "stop"}

T = TypeVar("T")


def _usage(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """OpenAI's ``usage`` of one answer: the prompt counted once (its ``n`` choices share
    it), the completion tokens of every choice added up."""
    first = outcomes[0]
    t = first.result.timings
    completion = sum(o.result.timings.completion_tokens for o in outcomes)
    return {
        "prompt_tokens": t.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": t.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": t.cached_tokens},
        # localllm's own timings (of the first choice), so clients can show TTFT and
        # prefill vs decode speed.
        "timings": {
            "ttft_ms": round(t.ttft_ms, 3),
            "queued_ms": round(t.queued_ms, 3),
            "prompt_ms": round(t.prompt_ms, 3),
            "prompt_tokens_per_s": round(t.prompt_tokens_per_s, 2),
            "decode_ms": round(t.decode_ms, 3),
            "decode_tokens_per_s": round(t.decode_tokens_per_s, 2),
            "load_ms": round(first.load_seconds * 1000, 3),
        },
    }


def _logit_bias(value: dict[str, float] | None) -> dict[str, float]:
    """OpenAI's ``logit_bias``: token ids (as strings) to a bias from -100 to 100. The runner
    checks that the ids are in the model's vocabulary."""
    if not value:
        return {}
    if len(value) > 1024:
        raise HTTPProblem(400, "logit_bias may name at most 1024 tokens", param="logit_bias")
    out = {}
    for key, bias in value.items():
        where = f"logit_bias.{key}"
        if not key.strip().isdigit():
            raise HTTPProblem(
                400, f"logit_bias keys must be token ids, got {key!r}", param="logit_bias"
            )
        if not -100 <= bias <= 100:  # NaN fails this too
            raise HTTPProblem(400, f"{where} must be between -100 and 100", param=where)
        out[str(int(key))] = float(bias)
    return out


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


def _runner_options(
    body: ChatCompletionRequest | CompletionRequest, options: dict[str, Any]
) -> SamplingOptions:
    sampling = sampling_options(options)
    sampling.logit_bias = _logit_bias(body.logit_bias)
    return sampling


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


_DETAILS = ("auto", "low", "high")


def _image_part(part: ContentPart, where: str, images: Images) -> str:
    """An ``image_url`` part → its marker. ``detail`` is accepted: llama.cpp's projector sizes
    the image itself, so every level reads the image the same way."""
    value = part.image_url
    if isinstance(value, dict):
        detail = value.get("detail")
        if detail is not None and detail not in _DETAILS:
            raise HTTPProblem(
                400,
                f"{where}.image_url.detail must be one of auto, low, high, got {detail!r}",
                param=f"{where}.image_url.detail",
            )
        return images.add_url(value.get("url"), f"{where}.image_url.url")
    if isinstance(value, str):
        return images.add_url(value, f"{where}.image_url")
    raise HTTPProblem(
        400, f"{where}.image_url must be an object with a url", param=f"{where}.image_url"
    )


def _text_content(model: LocalModel, message: Message, index: int, images: Images) -> str:
    if message.content is None or isinstance(message.content, str):
        return message.content or ""
    parts = []
    for number, part in enumerate(message.content):
        where = f"messages[{index}].content[{number}]"
        if part.type in ("image_url", "input_image", "image"):
            if "vision" not in model.capabilities():
                raise HTTPProblem(400, no_vision(model), param=f"messages[{index}].content")
            if part.type != "image_url":
                raise HTTPProblem(
                    400,
                    f"{where}: content parts of type {part.type!r} are not part of chat "
                    "completions; send images as image_url parts",
                    param=where,
                )
            if message.role != "user":
                # OpenAI takes image parts in user messages only.
                raise HTTPProblem(
                    400,
                    f"{where}: images are only allowed in user messages, not {message.role}",
                    param=where,
                )
            parts.append(_image_part(part, where, images))
            continue
        if part.type != "text":
            raise HTTPProblem(
                400,
                f"content parts of type {part.type!r} are not supported (only text)",
                param=f"messages[{index}].content",
            )
        parts.append(part.text or "")
    return "".join(parts)


def _messages(
    model: LocalModel, body: ChatCompletionRequest, plan: ToolPlan | None, images: Images
) -> list[dict[str, Any]]:
    converted = []
    for i, m in enumerate(body.messages):
        message = ChatMessage(
            role="system" if m.role == "developer" else m.role,
            content=_text_content(model, m, i, images),
            tool_calls=m.tool_calls,
            tool_call_id=m.tool_call_id,
            # a tool result's name is the tool's (OpenAI's deprecated function messages)
            tool_name=m.name if m.role == "tool" else None,
            # reasoning in the history, under llama-server's or vLLM's name
            thinking=m.reasoning_content or m.reasoning,
        )
        converted.append(message)
    return chat_messages(model, converted, plan=plan)


def _include_usage(body: ChatCompletionRequest | CompletionRequest) -> bool:
    return bool(body.stream_options and body.stream_options.include_usage)


def _check_model(model: LocalModel) -> None:
    if "completion" not in model.capabilities():
        raise HTTPProblem(400, f"{model.name.short} cannot generate text", param="model")


def _jobs(
    state: DaemonState,
    model: LocalModel,
    options: dict[str, Any],
    runner_request: GenerationRequest,
    n: int,
) -> list[Job]:
    """``n`` jobs for one prompt. Sent together, the engine prefills the prompt once and
    shares it into the other sequences. With a seed, choice i samples with seed + i: the
    choices differ, and each is reproducible on its own."""
    jobs = []
    for index in range(n):
        copy = dataclasses.replace(
            runner_request, options=dataclasses.replace(runner_request.options)
        )
        if index and copy.options.seed >= 0:
            copy.options.seed = (copy.options.seed + index) & 0xFFFFFFFF
        jobs.append(Job.for_model(state, model, options, copy, None, "openai"))
    return jobs


@dataclass
class _Choice:
    """One of an answer's ``n`` choices while it is written."""

    index: int
    """The choice's ``index``."""
    job: Job
    """Its generation."""
    answer: AnswerStream = field(default_factory=AnswerStream)
    """Its output parser (made again once the prompt is rendered)."""
    first: bool = True
    """No chunk of it has been sent yet (the first carries the role, or the echo)."""
    calls: int = 0
    """Tool calls given a streamed ``index`` so far."""
    pending: list[TokenLogprob] = field(default_factory=list)
    """Log probabilities of tokens whose text a parser still holds back."""
    legacy: LegacyLogprobs | None = None
    """The legacy completions API's log probabilities, with their text offsets."""


ChoiceFn = Callable[[_Choice, Parsed, str | None, list[TokenLogprob]], dict[str, Any]]
DeltaFn = Callable[[_Choice, Parsed | None, str | None, list[TokenLogprob]], dict[str, Any]]


async def _all(awaitables: Sequence[Awaitable[T]]) -> list[T]:
    """Await all together; the first failure cancels the rest and is raised."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def _answer(
    state: DaemonState,
    request: Request,
    jobs: list[Job],
    *,
    stream: bool,
    include_usage: bool,
    object_name: str,
    id_prefix: str,
    choice: ChoiceFn,
    delta: DeltaFn,
    tools: ToolPlan | None = None,
    think: ThinkPlan | None = None,
    legacy_logprobs: int | None = None,
) -> Response:
    """Run ``jobs`` (the ``n`` choices of one prompt, all at once) and answer in OpenAI's
    shape. Each choice's text goes through its own :class:`AnswerStream` (reasoning split
    out, calls parsed: streamed, text before a call streams as it comes, each call comes
    whole); streamed chunks carry the choice's ``index``."""
    name = jobs[0].model.name.short
    choices = [_Choice(index, job) for index, job in enumerate(jobs)]
    if legacy_logprobs is not None:
        for c in choices:
            c.legacy = LegacyLogprobs(legacy_logprobs)
    ident = f"{id_prefix}-{secrets.token_hex(12)}"
    base = {
        "id": ident,
        "created": int(time.time()),
        "model": name,
        "system_fingerprint": "localllm",
    }

    if not stream:

        async def run(c: _Choice) -> tuple[Parsed, str, Outcome]:
            generation = await start(state, request, c.job)
            try:
                text, outcome = await generation.whole(request)
            finally:
                generation.close()
            parsed = AnswerStream(tools, think, generation.stream.prompt_tail).whole(text)
            reason = _FINISH.get(outcome.result.done_reason, "stop")
            return parsed, "tool_calls" if parsed.calls else reason, outcome

        results = await _all([run(c) for c in choices])
        return JSONResponse(
            {
                **base,
                "object": object_name,
                "choices": [
                    choice(c, parsed, finish, outcome.logprobs)
                    for c, (parsed, finish, outcome) in zip(choices, results, strict=True)
                ],
                "usage": _usage([outcome for _, _, outcome in results]),
            }
        )

    # All choices start at once (so the engine shares the prompt); the first one's start
    # decides the status code: a bad request fails it before anything is sent.
    starts = [asyncio.ensure_future(start(state, request, c.job)) for c in choices]
    fanout = _Fanout(starts)
    try:
        await asyncio.shield(starts[0])
    except BaseException:
        fanout.close()
        raise
    chunk_object = f"{object_name}.chunk" if object_name == "chat.completion" else object_name

    # Every chunk starts alike: encoded once, then only its choices (and extras) per chunk.
    head = b"data: " + dumps({**base, "object": chunk_object})[:-1] + b',"choices":'

    def chunk(parts: list[dict[str, Any]], **extra: Any) -> bytes:
        more = b"," + dumps(extra)[1:-1] if extra else b""
        return head + dumps(parts) + more + b"}\n\n"

    async def body() -> AsyncIterator[bytes]:
        outcomes: list[Outcome | None] = [None] * len(choices)
        try:
            async for index, item in fanout.items():
                c = choices[index]
                if isinstance(item, BaseException):
                    yield _sse_error(problem_from(item, name))
                    return
                if isinstance(item, Generation):
                    c.answer = AnswerStream(tools, think, item.stream.prompt_tail)
                    continue
                if isinstance(item, Outcome):
                    if item.result.done_reason == "error":
                        yield _sse_error(500, item.result.error or "generation failed")
                        return
                    rest = c.answer.finish()
                    if rest:
                        yield chunk([delta(c, rest, None, c.pending)])
                        c.pending = []
                    finish = _FINISH.get(item.result.done_reason, "stop")
                    if c.answer.calls_made:
                        finish = "tool_calls"
                    yield chunk([delta(c, None, finish, c.pending)])
                    c.pending = []
                    outcomes[index] = item
                    continue
                c.pending += item.logprobs or []
                parsed = c.answer.feed(item.text) if item.text else Parsed()
                if parsed:
                    yield chunk([delta(c, parsed, None, c.pending)])
                    c.pending = []
            if include_usage:
                yield chunk([], usage=_usage([o for o in outcomes if o is not None]))
        except Exception as exc:
            yield _sse_error(problem_from(exc, name))
            return
        yield sse_event("[DONE]")

    return ClosingStreamingResponse(body(), media_type="text/event-stream", on_close=fanout.close)


class _Fanout:
    """The ``n`` generations of a streamed answer, read together.

    :meth:`items` yields ``(index, item)`` as they come from any choice: the choice's
    :class:`Generation` once it started, its chunks, its :class:`Outcome` (after which it is
    over), or an exception. With several choices each generation is read by a task of its
    own, so choices that wait for a slot get one as soon as earlier choices finish, whatever
    the client reads; a single choice is read in place.
    :meth:`close` stops them all (idempotent)."""

    def __init__(self, starts: list[asyncio.Future[Generation]]) -> None:
        self.starts = starts
        self._queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        self._readers: list[asyncio.Task[None]] = []

    async def _read(self, index: int) -> None:
        try:
            generation = await self.starts[index]
        except BaseException as exc:
            self._queue.put_nowait((index, exc))
            return
        try:
            self._queue.put_nowait((index, generation))
            async for item in generation.chunks():
                self._queue.put_nowait((index, item))
        except Exception as exc:
            self._queue.put_nowait((index, exc))
        finally:
            generation.close()

    async def items(self) -> AsyncIterator[tuple[int, Any]]:
        """Every choice's items until each has its outcome (or one fails)."""
        if len(self.starts) == 1:
            # One choice (nearly every request): read it here. A reader task would only
            # add a queue and a task wake-up per token; the generation's own pump already
            # frees the slot whatever the client reads.
            try:
                generation = await self.starts[0]
            except Exception as exc:
                yield 0, exc
                return
            yield 0, generation
            try:
                async for item in generation.chunks():
                    yield 0, item
            except Exception as exc:
                yield 0, exc
            return
        self._readers = [asyncio.create_task(self._read(i)) for i in range(len(self.starts))]
        open_choices = len(self.starts)
        while open_choices:
            index, item = await self._queue.get()
            if isinstance(item, Outcome | BaseException):
                open_choices -= 1
            yield index, item

    def close(self) -> None:
        """Stop every reader and every generation that started but is not read."""
        for reader in self._readers:
            reader.cancel()
        for future in self.starts:
            if not future.done():
                future.cancel()
            elif not future.cancelled() and future.exception() is None:
                # close() is idempotent; a reader cancelled before it ran never closes it
                future.result().close()


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


def _chat_thinking(model: LocalModel, body: ChatCompletionRequest) -> ThinkPlan | None:
    """``reasoning_effort`` as the model's reasoning switch (400 for a model that does not
    reason, unless it is ``none``)."""
    return plan_thinking(
        model, reasoning_effort_think(body.reasoning_effort), field="reasoning_effort"
    )


def _template_kwargs(value: dict[str, Any] | None) -> dict[str, Any]:
    """llama-server's ``chat_template_kwargs``: variables for the template (names only;
    the template decides what the values mean)."""
    if not value:
        return {}
    reserved = {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"}
    for key in value:
        if not key.isidentifier() or key in reserved:
            raise HTTPProblem(
                400,
                f"chat_template_kwargs.{key} cannot be set: it is not a free template variable",
                param="chat_template_kwargs",
            )
    return dict(value)


@router.post("/chat/completions", summary="Chat completion (OpenAI)")
async def chat_completions(
    body: ChatCompletionRequest, request: Request, state: StateDep
) -> Response:
    """OpenAI's chat completions, streamed as SSE when ``stream`` is true: tools, reasoning
    (``reasoning_effort`` in, ``reasoning_content`` out), ``logprobs``, ``n`` choices."""
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
    thinking = _chat_thinking(model, body)
    top = check_top_logprobs(body.top_logprobs)
    if top and not body.logprobs:
        raise HTTPProblem(400, "top_logprobs requires logprobs to be true", param="top_logprobs")
    want_logprobs = bool(body.logprobs)
    max_tokens = body.max_completion_tokens or body.max_tokens
    options = _sampling(model, body, max_tokens)
    images = Images(state.settings, model)
    runner_request = GenerationRequest(
        id="",
        messages=_messages(model, body, plan, images),
        template=model_template(model),
        options=_runner_options(body, options),
        images=images.encoded,
    )
    apply_logprobs(runner_request.options, want_logprobs, top)
    _apply_response_format(runner_request, body.response_format)
    if plan is not None:
        plan.apply(runner_request)
    if thinking is not None:
        thinking.apply(runner_request)
    # explicit template variables win over the ones reasoning_effort sets
    runner_request.template_kwargs.update(_template_kwargs(body.chat_template_kwargs))
    jobs = _jobs(state, model, options, runner_request, body.n or 1)

    def openai_calls(c: _Choice, calls: list[ToolCall], streamed: bool) -> list[dict[str, Any]]:
        assert plan is not None
        out = []
        for call in calls:
            item: dict[str, Any] = {
                "id": plan.call_id(call),
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
            }
            if streamed:
                item = {"index": c.calls, **item}
            c.calls += 1
            out.append(item)
        return out

    def logprobs_of(items: list[TokenLogprob]) -> dict[str, Any] | None:
        return chat_logprobs(items, top) if want_logprobs else None

    def choice(
        c: _Choice, parsed: Parsed, finish: str | None, items: list[TokenLogprob]
    ) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
        if parsed.thinking:  # llama-server's and DeepSeek's field for reasoning
            message["reasoning_content"] = parsed.thinking
        if parsed.calls:
            message["content"] = parsed.content or None
            message["tool_calls"] = openai_calls(c, parsed.calls, streamed=False)
        return {
            "index": c.index,
            "message": message,
            "finish_reason": finish,
            "logprobs": logprobs_of(items),
        }

    def delta(
        c: _Choice, parsed: Parsed | None, finish: str | None, items: list[TokenLogprob]
    ) -> dict[str, Any]:
        content: dict[str, Any] = {}
        if c.first:
            content["role"] = "assistant"
            c.first = False
        if parsed is not None:
            if parsed.thinking:
                content["reasoning_content"] = parsed.thinking
            if parsed.content or not (parsed.calls or parsed.thinking):
                content["content"] = parsed.content
            if parsed.calls:
                content["tool_calls"] = openai_calls(c, parsed.calls, streamed=True)
        return {
            "index": c.index,
            "delta": content,
            "finish_reason": finish,
            "logprobs": logprobs_of(items) if items else None,
        }

    return await _answer(
        state,
        request,
        jobs,
        stream=bool(body.stream),
        include_usage=_include_usage(body),
        object_name="chat.completion",
        id_prefix="chatcmpl",
        choice=choice,
        delta=delta,
        tools=plan,
        think=thinking,
    )


@router.post("/completions", summary="Text completion (OpenAI), with suffix for FIM")
async def completions(body: CompletionRequest, request: Request, state: StateDep) -> Response:
    """OpenAI's legacy completions: a raw prompt, or fill-in-the-middle with ``suffix``;
    ``logprobs`` (an int: alternatives per token), ``n`` choices."""
    model = resolve_model(state, body.model)
    _check_model(model)
    if isinstance(body.prompt, list):
        if len(body.prompt) != 1:
            raise HTTPProblem(400, "prompt must be a single string", param="prompt")
        prompt = body.prompt[0]
    else:
        prompt = body.prompt
    n = body.n or 1
    if body.best_of is not None and body.best_of != n:
        raise HTTPProblem(
            400, "best_of is not supported (only best_of equal to n)", param="best_of"
        )
    top = check_top_logprobs(body.logprobs, "logprobs")
    want_logprobs = body.logprobs is not None
    if want_logprobs and body.echo:
        # the prompt's own log probabilities would need a scoring pass the runner lacks
        raise HTTPProblem(400, "echo cannot be combined with logprobs", param="echo")
    options = _sampling(model, body, body.max_tokens)
    runner_request = GenerationRequest(
        id="",
        prompt=prompt,
        raw=True,
        suffix=body.suffix or None,
        options=_runner_options(body, options),
    )
    apply_logprobs(runner_request.options, want_logprobs, top)
    jobs = _jobs(state, model, options, runner_request, n)
    echo = prompt if body.echo else ""

    def logprobs_of(c: _Choice, items: list[TokenLogprob]) -> dict[str, Any] | None:
        return c.legacy.shape(items) if c.legacy is not None else None

    def choice(
        c: _Choice, parsed: Parsed, finish: str | None, items: list[TokenLogprob]
    ) -> dict[str, Any]:
        return {
            "index": c.index,
            "text": echo + parsed.content,
            "finish_reason": finish,
            "logprobs": logprobs_of(c, items),
        }

    def delta(
        c: _Choice, parsed: Parsed | None, finish: str | None, items: list[TokenLogprob]
    ) -> dict[str, Any]:
        shown = (echo if c.first else "") + (parsed.content if parsed is not None else "")
        c.first = False
        return {
            "index": c.index,
            "text": shown,
            "finish_reason": finish,
            "logprobs": logprobs_of(c, items) if items else None,
        }

    return await _answer(
        state,
        request,
        jobs,
        stream=bool(body.stream),
        include_usage=_include_usage(body),
        object_name="text_completion",
        id_prefix="cmpl",
        choice=choice,
        delta=delta,
        legacy_logprobs=top if want_logprobs else None,
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
    """OpenAI's embeddings; ``encoding_format`` float or base64 (what the SDK asks for);
    ``input`` as texts or as token ids of the model's own vocabulary."""
    model = resolve_model(state, body.model)
    options = merge_options(model, {})
    config = runner_config(state.settings, model, options)
    if isinstance(body.input, str):
        inputs: list[str] = [body.input]
    elif all(isinstance(item, str) for item in body.input):
        inputs = [str(item) for item in body.input]
    else:
        inputs = []
    if (inputs and any(not text for text in inputs)) or not body.input:
        raise HTTPProblem(400, "input must be a non-empty string or list of them", param="input")
    # OpenAI refuses an input over the model's context (400) rather than cutting it.
    if inputs:
        result, _, _ = await embed(
            state, request, model, config, inputs, truncate=False, keep_alive=None
        )
    else:
        arrays: list[list[int]] = (
            [body.input] if isinstance(body.input[0], int) else body.input  # type: ignore[list-item]
        )
        if any(not array for array in arrays):
            raise HTTPProblem(400, "input must not hold an empty token array", param="input")
        # The ids are the model's own vocabulary's, as llama-server and vLLM read them
        # (LangChain's OpenAIEmbeddings sends them by default); the runner checks them.
        result, _, _ = await embed(
            state, request, model, config, [], truncate=False, keep_alive=None, token_inputs=arrays
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
