"""One model step of the agent loop: the conversation and the tools on offer sent to the
daemon, the answer streamed back (reasoning, text, and the calls the model makes).

Steps go through Ollama's ``/api/chat``, as every chat of ``localllm run`` and the TUI does,
so the chat's options (``num_ctx`` included), ``keep_alive``, ``think``, images on any
message (a tool's images too) and the full timings travel as for any other answer. A step
that must call a tool (``--tools required``: the API's ``tool_choice``) goes through
``/v1/chat/completions`` instead, the route that takes ``tool_choice``; that route carries
the sampling options but neither ``keep_alive`` nor the runner's own options (``num_ctx``...),
so such an option is refused there with a clear error, never dropped; and images a tool
returned travel there in a user message after the tool's result (OpenAI's chat takes
images in user messages only). Its usage timings are given back in Ollama's field names.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._exceptions import LocalLLMError

if TYPE_CHECKING:
    from ..client import AsyncClient, Think

__all__ = ["StepReply", "StepRequest", "model_step", "openai_messages"]

Writer = Callable[[str, str], Awaitable[None]]
"""Takes each streamed piece: (reasoning, text), either may be empty."""

# Ollama options that chat completions takes under the same name.
_SAME_NAME = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "typical_p",
    "repeat_penalty",
    "repeat_last_n",
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "mirostat",
    "mirostat_tau",
    "mirostat_eta",
    "stop",
)


@dataclass
class StepRequest:
    """What one step sends."""

    model: str
    messages: Sequence[Mapping[str, Any]]
    """The conversation so far, in ``/api/chat``'s shape."""
    tools: Sequence[Mapping[str, Any]] = ()
    """The functions on offer."""
    options: Mapping[str, Any] = field(default_factory=dict)
    keep_alive: str | float | None = None
    think: Think | None = None
    format: str | dict[str, Any] | None = None
    force: bool = False
    """The step must call a tool (``tool_choice: required``)."""


@dataclass
class StepReply:
    """What one step gave back."""

    content: str = ""
    thinking: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)
    """The calls, in ``/api/chat``'s shape: ``{"id", "function": {"name", "arguments"}}``."""
    final: dict[str, Any] = field(default_factory=dict)
    """The final chunk's fields (timings, ``done_reason``), in Ollama's names."""
    seconds: float = 0.0
    """Wall time of the step, as the chat saw it."""


async def model_step(client: AsyncClient, request: StepRequest, write: Writer) -> StepReply:
    """Run one step, streaming its pieces to ``write``."""
    began = time.monotonic()
    if request.force:
        reply = await _forced_step(client, request, write)
    else:
        reply = await _chat_step(client, request, write)
    reply.seconds = time.monotonic() - began
    return reply


async def _chat_step(client: AsyncClient, request: StepRequest, write: Writer) -> StepReply:
    reply = StepReply()
    content: list[str] = []
    thinking: list[str] = []
    stream = client.chat_stream(
        request.model,
        list(request.messages),  # type: ignore[arg-type]
        format=request.format,
        options=request.options or None,
        keep_alive=request.keep_alive,
        think=request.think,
        tools=list(request.tools) or None,
    )
    async for chunk in stream:
        message = chunk.get("message") or {}
        piece, reasoning = message.get("content") or "", message.get("thinking") or ""
        if piece or reasoning:
            content.append(piece)
            thinking.append(reasoning)
            await write(reasoning, piece)
        for call in message.get("tool_calls") or []:
            reply.calls.append(_ollama_call(call, len(reply.calls)))
        if chunk.get("done"):
            reply.final = {k: v for k, v in chunk.items() if k not in ("message", "model")}
    reply.content, reply.thinking = "".join(content), "".join(thinking)
    return reply


def _ollama_call(call: Mapping[str, Any], index: int) -> dict[str, Any]:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if isinstance(arguments, str):  # a template may give them as text
        with contextlib.suppress(json.JSONDecodeError):
            arguments = json.loads(arguments)
    return {
        "id": str(call.get("id") or f"call_{index}"),
        "function": {"name": str(function.get("name") or ""), "arguments": arguments},
    }


# -- the forced step, through chat completions ------------------------------------------------


def _openai_options(options: Mapping[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {}
    for key, value in options.items():
        if key in _SAME_NAME:
            body[key] = value
        elif key == "num_predict":
            if isinstance(value, int) and value > 0:
                body["max_tokens"] = value
        else:
            raise LocalLLMError(
                f"the option {key} cannot go with --tools required: the step that must call a "
                "tool goes through /v1/chat/completions, which takes only sampling options "
                "(set it in a Modelfile PARAMETER instead)"
            )
    return body


def openai_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``/api/chat`` messages in chat completions' shape (see the module docstring)."""
    out: list[dict[str, Any]] = []
    held: list[str] = []  # images of tool results, sent after the run of tool messages

    def flush() -> None:
        if held:
            parts: list[dict[str, Any]] = [
                {"type": "text", "text": "(the images the tools above returned)"}
            ]
            parts += [_image_part(image) for image in held]
            out.append({"role": "user", "content": parts})
            held.clear()

    for message in messages:
        role = message.get("role", "user")
        if role != "tool":
            flush()
        item: dict[str, Any] = {"role": role, "content": message.get("content") or ""}
        images = list(message.get("images") or [])
        if role == "tool":
            item["tool_call_id"] = message.get("tool_call_id") or ""
            if message.get("tool_name"):
                item["name"] = message["tool_name"]
            held.extend(images)
        elif images:
            item["content"] = [
                {"type": "text", "text": item["content"]},
                *(_image_part(image) for image in images),
            ]
        if role == "assistant":
            if message.get("thinking"):
                item["reasoning_content"] = message["thinking"]
            if message.get("tool_calls"):
                item["tool_calls"] = [
                    {
                        "id": call.get("id") or f"call_{i}",
                        "type": "function",
                        "function": {
                            "name": call["function"]["name"],
                            "arguments": json.dumps(call["function"].get("arguments") or {}),
                        },
                    }
                    for i, call in enumerate(message["tool_calls"])
                ]
        out.append(item)
    flush()
    return out


# The first base64 characters of each image format the daemon reads (its header decides).
_MAGIC = {"iVBOR": "png", "/9j/": "jpeg", "R0lG": "gif", "Qk": "bmp"}


def _image_part(data: str) -> dict[str, Any]:
    kind = next((kind for magic, kind in _MAGIC.items() if data.startswith(magic)), "png")
    return {"type": "image_url", "image_url": {"url": f"data:image/{kind};base64,{data}"}}


def _forced_body(request: StepRequest) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": request.model,
        "messages": openai_messages(request.messages),
        "tools": list(request.tools),
        "tool_choice": "required",
        "stream_options": {"include_usage": True},
        **_openai_options(request.options),
    }
    if request.think is False:
        body["reasoning_effort"] = "none"
    elif isinstance(request.think, str):
        body["reasoning_effort"] = request.think
    if request.format == "json":
        body["response_format"] = {"type": "json_object"}
    elif isinstance(request.format, dict):
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": request.format},
        }
    return body


async def _forced_step(client: AsyncClient, request: StepRequest, write: Writer) -> StepReply:
    reply = StepReply()
    content: list[str] = []
    thinking: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finish = "stop"
    usage: dict[str, Any] = {}
    async for chunk in client.openai_chat_stream(_forced_body(request)):
        if chunk.get("usage"):
            usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            piece, reasoning = delta.get("content") or "", delta.get("reasoning_content") or ""
            if piece or reasoning:
                content.append(piece)
                thinking.append(reasoning)
                await write(reasoning, piece)
            for part in delta.get("tool_calls") or []:
                slot = calls.setdefault(int(part.get("index", len(calls))), {"arguments": ""})
                if part.get("id"):
                    slot["id"] = part["id"]
                function = part.get("function") or {}
                if function.get("name"):
                    slot["name"] = function["name"]
                slot["arguments"] += function.get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    for index in sorted(calls):
        slot = calls[index]
        try:
            arguments: Any = json.loads(slot["arguments"] or "{}")
        except json.JSONDecodeError:
            arguments = slot["arguments"]
        reply.calls.append(
            {
                "id": slot.get("id") or f"call_{index}",
                "function": {"name": slot.get("name", ""), "arguments": arguments},
            }
        )
    reply.content, reply.thinking = "".join(content), "".join(thinking)
    reply.final = _final_from_usage(usage, finish)
    return reply


def _final_from_usage(usage: Mapping[str, Any], finish: str) -> dict[str, Any]:
    """Chat completions' usage (with localllm's ``timings``) under Ollama's field names."""
    timings = usage.get("timings") or {}
    prompt = int(usage.get("prompt_tokens") or 0)
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)

    def ns(key: str) -> int:
        return int(float(timings.get(key) or 0) * 1e6)

    return {
        "done": True,
        "done_reason": "length" if finish == "length" else "stop",
        "total_duration": ns("ttft_ms") + ns("decode_ms") + ns("load_ms"),
        "load_duration": ns("load_ms"),
        "queue_duration": ns("queued_ms"),
        "ttft_duration": ns("ttft_ms"),
        "prompt_eval_count": prompt,
        "prompt_cached_count": cached,
        "prompt_evaluated_count": max(prompt - cached, 0),
        "prompt_eval_duration": ns("prompt_ms"),
        "prompt_eval_rate": float(timings.get("prompt_tokens_per_s") or 0),
        "eval_count": int(usage.get("completion_tokens") or 0),
        "eval_duration": ns("decode_ms"),
        "eval_rate": float(timings.get("decode_tokens_per_s") or 0),
    }
