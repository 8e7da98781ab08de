"""The OpenAI-compatible API: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``,
``/v1/models``, each also without the ``/v1`` prefix (as llama-server serves them, for clients
configured with a bare base URL).

Streams are server-sent events ending with ``data: [DONE]``; ``stream_options.include_usage``
adds a last chunk with ``usage`` and no choices. Errors use OpenAI's shape
``{"error": {"message", "type", "param", "code"}}`` (:func:`.errorshapes.openai_error`).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import secrets
import struct
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from localllm.store.models import LocalModel

from ..errors import HTTPProblem, problem_from
from ..generation import embed, resolve_model
from ..loadconfig import runner_config
from ..options import merge_options, named_options
from ..prompt.tools import ToolPlan
from ..runner.protocol import TokenLogprob
from ..state import DaemonState, StateDep
from ..toolcalls import ToolCall
from .core import Ask, Delta, Done, Plan, Reply, Turn, Whole, plan, plan_batch
from .errorshapes import openai_error
from .logprobs import LegacyLogprobs, chat_logprobs, check_top_logprobs
from .schemas_openai import (
    ChatCompletionRequest,
    CompletionRequest,
    ContentPart,
    EmbeddingRequest,
    Message,
    ResponseFormat,
)
from .streaming import ClosingStreamingResponse, dumps, sse_event
from .tooling import reasoning_effort_think
from .vision import Images, no_vision

__all__ = ["router"]

log = logging.getLogger("localllm.daemon")

router = APIRouter()
"""The routes without a prefix; the app mounts them under ``/v1`` and at the root."""


def _usage(dones: Sequence[Done], n: int) -> dict[str, Any]:
    """OpenAI's ``usage`` of one answer (its choices in order, ``n`` per prompt): each
    prompt counted once (its choices share it), the completion tokens of every choice
    added up."""
    first = dones[0]
    t = first.timings
    prompts = dones[::n]
    prompt = sum(done.prompt_tokens for done in prompts)
    cached = sum(done.cached_tokens for done in prompts)
    completion = sum(done.output_tokens for done in dones)
    reasoning = sum(done.reasoning_tokens for done in dones)
    load_s = first.outcome.load_seconds if first.outcome is not None else 0.0
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {"reasoning_tokens": reasoning},
        # localllm: a reasoning budget closed some choice's reasoning (the answer followed)
        **({"reasoning_budget_exhausted": True} if any(d.budget_exhausted for d in dones) else {}),
        # localllm's own timings (of the first choice), so clients can show TTFT and
        # prefill vs decode speed.
        "timings": {
            "ttft_ms": round(t.ttft_ms, 3),
            "queued_ms": round(t.queued_ms, 3),
            "prompt_ms": round(t.prompt_ms, 3),
            "prompt_tokens_per_s": round(t.prompt_tokens_per_s, 2),
            "decode_ms": round(t.decode_ms, 3),
            **({"parked_ms": round(t.parked_ms, 3)} if t.parked_ms else {}),
            "decode_tokens_per_s": round(t.decode_tokens_per_s, 2),
            "load_ms": round(load_s * 1000, 3),
            # where the time to the first token went, phase by phase
            **(
                {"first_token_ms": {k: round(ms, 3) for k, ms in first.first_token.items()}}
                if first.first_token
                else {}
            ),
        },
    }


def _finish_reason(done: Done) -> str:
    """``tool_calls`` when the answer made calls and none was cut, else ``length`` for a
    limit (a call cut by it included), else ``stop``."""
    if done.calls and not done.cut:
        return "tool_calls"
    return "length" if done.limited else "stop"


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


# Body fields that are sampling options of the same name.
_SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "top_k",
    "min_p",
    "typical_p",
    "repeat_penalty",
    "repeat_last_n",
    "mirostat",
    "mirostat_tau",
    "mirostat_eta",
)


def _ask(
    state: DaemonState, body: ChatCompletionRequest | CompletionRequest, max_tokens: int | None
) -> Ask:
    """What both routes share: the model, the sampling overrides, ``n``, ``logit_bias``."""
    model = resolve_model(state, body.model)
    if "completion" not in model.capabilities():
        raise HTTPProblem(400, f"{model.name.short} cannot generate text", param="model")
    overrides = named_options(body, _SAMPLING_FIELDS, max_tokens)
    if body.stop is not None:
        stops = [body.stop] if isinstance(body.stop, str) else list(body.stop)
        if len(stops) > 16:
            raise HTTPProblem(400, "stop may hold at most 16 strings", param="stop")
        overrides["stop"] = stops
    if body.lora is not None:
        overrides["adapters"] = body.lora
    return Ask(
        model=model,
        api="openai",
        options=merge_options(model, overrides, prefix=""),
        logit_bias=_logit_bias(body.logit_bias),
        n=body.n or 1,
    )


def _response_format(fmt: ResponseFormat | None) -> str | dict[str, Any] | None:
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return "json"
    schema = fmt.json_schema.schema_ if fmt.json_schema is not None else None
    if not isinstance(schema, dict):
        raise HTTPProblem(
            400, "response_format.json_schema.schema is required", param="response_format"
        )
    return schema


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


def _turns(model: LocalModel, body: ChatCompletionRequest, images: Images) -> list[Turn]:
    return [
        Turn(
            role="system" if m.role == "developer" else m.role,
            content=_text_content(model, m, i, images),
            # reasoning in the history, under llama-server's or vLLM's name
            thinking=m.reasoning_content or m.reasoning,
            tool_calls=m.tool_calls,
            # a tool result's name is the tool's (OpenAI's deprecated function messages)
            tool_name=m.name if m.role == "tool" else None,
            tool_call_id=m.tool_call_id,
        )
        for i, m in enumerate(body.messages)
    ]


def _include_usage(body: ChatCompletionRequest | CompletionRequest) -> bool:
    return bool(body.stream_options and body.stream_options.include_usage)


def _sse_error(problem: HTTPProblem) -> bytes:
    return sse_event({"error": openai_error(problem)["error"]})


ChoiceFn = Callable[[int, Whole], dict[str, Any]]
DeltaFn = Callable[[int, Delta | None, Done | None], dict[str, Any]]


async def _answer(
    state: DaemonState,
    request: Request,
    planned: Plan,
    body: ChatCompletionRequest | CompletionRequest,
    shape: tuple[ChoiceFn, DeltaFn],
) -> Response:
    """Run ``planned`` (its choices at once) and answer in OpenAI's shape (``shape``: how a
    whole choice and a streamed delta look), whole or as chunks that carry each choice's
    ``index``."""
    choice, delta = shape
    if isinstance(body, ChatCompletionRequest):
        object_name, id_prefix = "chat.completion", "chatcmpl"
    else:
        object_name, id_prefix = "text_completion", "cmpl"
    stream, include_usage = bool(body.stream), _include_usage(body)
    reply = await Reply.open(state, request, planned)
    name = planned.ask.model.name.short
    ident = f"{id_prefix}-{secrets.token_hex(12)}"
    base = {"id": ident, "created": int(time.time()), "model": name}

    if not stream:
        wholes = await reply.whole(request)
        return JSONResponse(
            {
                **base,
                "object": object_name,
                "system_fingerprint": "localllm",
                "choices": [choice(index, whole) for index, whole in enumerate(wholes)],
                "usage": _usage([whole.done for whole in wholes], planned.ask.n),
            },
            headers=reply.timing_headers(wholes[0].done),
        )

    chunk_object = f"{object_name}.chunk" if object_name == "chat.completion" else object_name
    # Every chunk starts alike: encoded once, then only its choices (and extras) per chunk.
    head = (
        b"data: "
        + dumps({**base, "object": chunk_object, "system_fingerprint": "localllm"})[:-1]
        + b',"choices":'
    )

    def chunk(parts: list[dict[str, Any]], **extra: Any) -> bytes:
        more = b"," + dumps(extra)[1:-1] if extra else b""
        return head + dumps(parts) + more + b"}\n\n"

    usage_null = {"usage": None} if include_usage else {}

    async def body() -> AsyncIterator[bytes]:
        dones: dict[int, Done] = {}
        try:
            async for index, event in reply.events():
                if isinstance(event, Done):
                    dones[index] = event
                    yield chunk([delta(index, None, event)], **usage_null)
                else:
                    yield chunk([delta(index, event, None)], **usage_null)
            if include_usage:
                yield chunk([], usage=_usage([dones[i] for i in sorted(dones)], planned.ask.n))
        except Exception as exc:
            yield _sse_error(problem_from(exc, name))
            return
        yield sse_event("[DONE]")

    return ClosingStreamingResponse(
        body(), media_type="text/event-stream", on_close=reply.close, timing=reply
    )


def _chat_template_kwargs(value: dict[str, Any] | None) -> dict[str, Any]:
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


def _openai_calls(
    tools: ToolPlan | None, calls: list[ToolCall], first: int, streamed: bool
) -> list[dict[str, Any]]:
    assert tools is not None
    out = []
    for number, call in enumerate(calls):
        item: dict[str, Any] = {
            "id": tools.call_id(call),
            "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
        }
        out.append({"index": first + number, **item} if streamed else item)
    return out


@router.post("/chat/completions", summary="Chat completion (OpenAI)")
async def chat_completions(
    body: ChatCompletionRequest, request: Request, state: StateDep
) -> Response:
    """OpenAI's chat completions, streamed as SSE when ``stream`` is true: tools, reasoning
    (``reasoning_effort`` in, ``reasoning_content`` out), ``logprobs``, ``n`` choices."""
    ask = _ask(state, body, body.max_completion_tokens or body.max_tokens)
    top = check_top_logprobs(body.top_logprobs)
    if top and not body.logprobs:
        raise HTTPProblem(400, "top_logprobs requires logprobs to be true", param="top_logprobs")
    ask.logprobs, ask.top_logprobs = bool(body.logprobs), top
    ask.format = _response_format(body.response_format)
    ask.tools, ask.tool_choice = body.tools, body.tool_choice
    ask.parallel = body.parallel_tool_calls
    # a model that does not reason takes only "none"
    ask.think = reasoning_effort_think(body.reasoning_effort)
    ask.think_field = "reasoning_effort"
    ask.template_kwargs = _chat_template_kwargs(body.chat_template_kwargs)
    ask.images = Images(state.settings, ask.model)
    ask.turns = _turns(ask.model, body, ask.images)
    planned = plan(state, ask)
    tools = planned.tools
    calls_sent = [0] * ask.n
    first_chunk = [True] * ask.n

    def logprobs_of(items: list[TokenLogprob]) -> dict[str, Any] | None:
        return chat_logprobs(items, top) if ask.logprobs else None

    def choice(index: int, whole: Whole) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": whole.content,
            "refusal": None,
        }
        if whole.thinking:  # llama-server's and DeepSeek's field for reasoning
            message["reasoning_content"] = whole.thinking
        if whole.calls:
            message["content"] = whole.content or None
            message["tool_calls"] = _openai_calls(tools, whole.calls, 0, False)
        return {
            "index": index,
            "message": message,
            "finish_reason": _finish_reason(whole.done),
            "logprobs": logprobs_of(whole.logprobs),
        }

    def delta(index: int, piece: Delta | None, done: Done | None) -> dict[str, Any]:
        content: dict[str, Any] = {}
        if first_chunk[index]:
            content["role"] = "assistant"
            first_chunk[index] = False
        items: list[TokenLogprob] = []
        if piece is not None:
            items = piece.logprobs
            if piece.thinking:
                content["reasoning_content"] = piece.thinking
            if piece.content or not (piece.calls or piece.thinking):
                content["content"] = piece.content
            if piece.calls:
                content["tool_calls"] = _openai_calls(tools, piece.calls, calls_sent[index], True)
                calls_sent[index] += len(piece.calls)
        elif done is not None:
            items = done.logprobs
        return {
            "index": index,
            "delta": content,
            "finish_reason": _finish_reason(done) if done is not None else None,
            "logprobs": logprobs_of(items) if items else None,
        }

    return await _answer(state, request, planned, body, (choice, delta))


def _prompts(value: str | list[str] | list[int] | list[list[int]]) -> list[str | list[int]]:
    """OpenAI's ``prompt``: a string, a list of strings, one prompt as token ids, or a list
    of them; each one is a prompt of its own."""
    if isinstance(value, str):
        return [value]
    if not value:
        return [""]
    if all(isinstance(item, int) for item in value):
        return [list(value)]  # type: ignore[arg-type]
    prompts: list[str | list[int]] = []
    for index, item in enumerate(value):
        if isinstance(item, list) and not item:
            raise HTTPProblem(400, f"prompt[{index}] is an empty list of tokens", param="prompt")
        prompts.append(item)  # type: ignore[arg-type]
    return prompts


def _prompt_ask(ask: Ask, prompt: str | list[int], body: CompletionRequest) -> Ask:
    """``ask`` for one of the request's prompts."""
    one = dataclasses.replace(ask)
    if isinstance(prompt, list):
        if body.suffix:
            raise HTTPProblem(400, "suffix goes with a text prompt, not tokens", param="suffix")
        one.prompt_tokens = prompt
    else:
        one.prompt, one.raw, one.suffix = prompt, True, body.suffix or None
    # an echoed token prompt is shown as its tokens' text, which the prefill reports
    one.prompt_logprobs = bool(body.echo) and (ask.logprobs or isinstance(prompt, list))
    return one


@router.post("/completions", summary="Text completion (OpenAI), with suffix for FIM")
async def completions(body: CompletionRequest, request: Request, state: StateDep) -> Response:
    """OpenAI's legacy completions: a raw prompt (or several, or token ids), or
    fill-in-the-middle with ``suffix``; ``logprobs`` (an int: alternatives per token), ``n``
    choices per prompt; ``echo`` with ``logprobs`` scores the prompt itself (its tokens' log
    probabilities, from the prefill), ``max_tokens: 0`` generates nothing: the
    log-likelihood requests of evaluation harnesses."""
    ask = _ask(state, body, body.max_tokens or None)
    prompts = _prompts(body.prompt)
    if body.best_of is not None and body.best_of != ask.n:
        raise HTTPProblem(
            400, "best_of is not supported (only best_of equal to n)", param="best_of"
        )
    top = check_top_logprobs(body.logprobs, "logprobs")
    ask.logprobs, ask.top_logprobs = body.logprobs is not None, top
    ask.prefill_only = body.max_tokens == 0
    planned = plan_batch(state, [_prompt_ask(ask, prompt, body) for prompt in prompts])
    n = ask.n
    count = len(prompts) * n
    legacy = [LegacyLogprobs(top) for _ in range(count)]
    echoes: list[str | None] = [p if isinstance(p, str) else None for p in prompts]

    def echo(index: int, done: Done | None) -> tuple[str, dict[str, Any] | None]:
        """The echoed prompt of a choice and its tokens' log probabilities."""
        if not body.echo:
            return "", None
        scored = done.prompt_logprobs if done is not None else None
        if scored is None and index % n:
            # the prompt was scored once, for its first choice: the same tokens
            scored = shared.get(index - index % n)
        text = echoes[index // n]
        if text is None:  # a token prompt: its tokens' text
            text = "".join(entry.token for entry in scored or [])
        shown = legacy[index].shape(scored, prompt=True) if ask.logprobs and scored else None
        legacy[index].offset = len(text)
        return text, shown

    shared: dict[int, list[TokenLogprob]] = {}

    def joined(first: dict[str, Any] | None, then: dict[str, Any] | None) -> Any:
        if first is None or then is None:
            return first or then
        return {key: first[key] + then[key] for key in first}

    def choice(index: int, whole: Whole) -> dict[str, Any]:
        if whole.done.prompt_logprobs is not None:
            shared[index] = whole.done.prompt_logprobs
        text, scored = echo(index, whole.done)
        generated = legacy[index].shape(whole.logprobs) if ask.logprobs else None
        return {
            "index": index,
            "text": text + whole.content,
            "finish_reason": "length" if whole.done.limited else "stop",
            "logprobs": joined(scored, generated),
        }

    first_chunk = [True] * count

    def delta(index: int, piece: Delta | None, done: Done | None) -> dict[str, Any]:
        shown, scored = echo(index, done) if first_chunk[index] else ("", None)
        first_chunk[index] = False
        items = piece.logprobs if piece is not None else done.logprobs if done else []
        generated = legacy[index].shape(items) if ask.logprobs and items else None
        return {
            "index": index,
            "text": shown + (piece.content if piece else ""),
            "finish_reason": ("length" if done.limited else "stop") if done else None,
            "logprobs": joined(scored, generated),
        }

    if body.echo and body.stream and any(p.options.prompt_logprobs for p in _requests(planned)):
        # The scored prompt (its log probabilities, a token prompt's text) is known at the
        # end of its generation: the answer is held until then and sent as one chunk per
        # choice, so the prompt's text and offsets come first, as they must.
        whole = await _answer(state, request, planned, _whole(body), (choice, delta))
        return _as_stream(whole, _include_usage(body))
    return await _answer(state, request, planned, body, (choice, delta))


def _requests(planned: Plan) -> list[Any]:
    return [job.request for job in planned.jobs]


def _whole(body: CompletionRequest) -> CompletionRequest:
    return body.model_copy(update={"stream": False})


def _as_stream(whole: Response, include_usage: bool) -> Response:
    """A whole completion (already run) sent as a stream: one chunk per choice, then the
    usage when asked for, then ``[DONE]``."""
    answer = json.loads(bytes(whole.body))
    usage = answer.pop("usage")
    events = [sse_event({**answer, "choices": [c]}) for c in answer["choices"]]
    if include_usage:
        events.append(sse_event({**answer, "choices": [], "usage": usage}))
    events.append(sse_event("[DONE]"))

    async def body() -> AsyncIterator[bytes]:
        for event in events:
            yield event

    return ClosingStreamingResponse(body(), media_type="text/event-stream")


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
