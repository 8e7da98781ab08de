"""OpenAI's Responses API, stateless: ``POST /v1/responses``.

As Ollama offers it for Codex: ``input`` (a string, or ``message``, ``function_call``,
``function_call_output`` and ``reasoning`` items), ``instructions``, function ``tools``,
``tool_choice``, ``reasoning.effort``; the answer is a response object whose ``output`` holds
``reasoning``, ``message`` and ``function_call`` items, or a stream of the API's
``response.*`` events, each with its ``sequence_number``.

Nothing is stored: ``previous_response_id`` and ``conversation`` get a 400 (send the whole
conversation as ``input``), ``store: true`` is accepted but the answer says ``store: false``,
and there is no ``GET /v1/responses/{id}``. Errors take OpenAI's shape.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from localllm.store.models import LocalModel

from ..errors import HTTPProblem, problem_from
from ..generation import resolve_model
from ..options import merge_options
from ..prompt.tools import ToolPlan
from ..state import StateDep
from ..toolcalls import ToolCall
from .core import Ask, Delta, Done, Reply, Turn, plan
from .errorshapes import error_route, openai_error
from .streaming import ClosingStreamingResponse, dumps
from .tooling import flat_tool, reasoning_effort_think
from .vision import Images, no_vision

__all__ = ["ResponsesRequest", "router"]


def _render(request: Request, problem: HTTPProblem) -> Response:
    return JSONResponse(
        openai_error(problem, request.url.path), status_code=problem.status, headers=problem.headers
    )


router = APIRouter(route_class=error_route(_render))
"""The route; the app mounts it under ``/v1``."""


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Reasoning(_Body):
    """``reasoning``: ``effort`` switches the template's reasoning (``none`` off, any other
    level on, and the level itself for templates with ``reasoning_effort``); ``summary`` adds
    the reasoning to the item's ``summary`` too, whole (a local model's reasoning is not
    summarised)."""

    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = Field(
        None, description="The deprecated name of summary."
    )


class TextFormat(_Body):
    """``text.format``: ``text``, ``json_object`` or ``json_schema`` (by grammar)."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(_Body):
    """``text``: the answer's format; ``verbosity`` only at its default, ``medium`` (a local
    model has no verbosity control)."""

    format: TextFormat | None = None
    verbosity: Literal["medium"] | None = None


class StreamOptions(_Body):
    """``stream_options``: obfuscation pads events against network side channels; none
    are added here (the daemon answers on loopback), so only ``false`` is accepted."""

    include_obfuscation: Literal[False] | None = None


class ResponsesRequest(_Body):
    """POST /v1/responses. Accepted without an effect on a local daemon, so that clients that
    always send them work: ``user``, ``safety_identifier`` (abuse monitoring),
    ``prompt_cache_key`` (cache routing: the daemon reuses cached prefixes on its own),
    ``store`` (nothing is stored) and ``metadata`` (only echoed in the answer)."""

    model: str = Field(..., min_length=1)
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = Field(
        None, description='Function tools: {"type": "function", "name", "parameters"}.'
    )
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: int | None = Field(
        None, ge=1, description="Calls past this many in one answer are dropped."
    )
    max_output_tokens: int | None = Field(None, ge=1, le=1 << 24)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    reasoning: Reasoning | None = None
    text: TextConfig | None = None
    truncation: Literal["auto", "disabled"] | None = Field(
        None, description="auto: drop the oldest turns of a conversation over the context."
    )
    include: list[str] | None = Field(
        None,
        description='Only "reasoning.encrypted_content": reasoning items carry their text '
        "there too (plain: nothing here needs encrypting), which is read back from input.",
    )
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    background: bool | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None


# --- request -------------------------------------------------------------------------------


def _refuse_state(body: ResponsesRequest) -> None:
    if body.previous_response_id is not None:
        raise HTTPProblem(
            400,
            "previous_response_id is not supported: this server is stateless and stores no "
            "responses; send the whole conversation as input",
            param="previous_response_id",
        )
    if body.conversation is not None:
        raise HTTPProblem(
            400,
            "conversation is not supported: this server is stateless; send the whole "
            "conversation as input",
            param="conversation",
        )
    if body.background:
        raise HTTPProblem(
            400, "background responses are not supported (they need storage)", param="background"
        )
    for index, value in enumerate(body.include or []):
        if value != "reasoning.encrypted_content":
            raise HTTPProblem(
                400,
                f'include[{index}] {value!r} is not supported (only "reasoning.encrypted_content")',
                param=f"include[{index}]",
            )


def _input_image(part: dict[str, Any], at: str, images: Images) -> str:
    """An ``input_image`` part → its marker: ``image_url`` must be a ``data:`` URL (a
    ``file_id`` needs the Files API, which a local daemon has not)."""
    detail = part.get("detail")
    if detail is not None and detail not in ("auto", "low", "high"):
        raise HTTPProblem(
            400, f"{at}.detail must be one of auto, low, high, got {detail!r}", param=f"{at}.detail"
        )
    if part.get("file_id") is not None and part.get("image_url") is None:
        raise HTTPProblem(
            400,
            f"{at}.file_id is not supported (no Files API); send image_url as a data: URL",
            param=f"{at}.file_id",
        )
    return images.add_url(part.get("image_url"), f"{at}.image_url")


def _text_of(
    model: LocalModel,
    content: Any,
    where: str,
    kinds: set[str],
    images: Images | None = None,
) -> str:
    """The text of a content list; ``input_image`` parts become markers where ``images`` is
    given (user, system and tool-output content), and are a 400 elsewhere."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise HTTPProblem(400, f"{where} must be a string or a list of parts", param=where)
    parts = []
    for index, part in enumerate(content):
        at = f"{where}[{index}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "input_image":
            if "vision" not in model.capabilities():
                raise HTTPProblem(400, no_vision(model), param=at)
            if images is None:
                raise HTTPProblem(
                    400, f"{at}: images are not allowed in assistant content", param=at
                )
            parts.append(_input_image(part, at, images))
            continue
        if kind not in kinds:
            raise HTTPProblem(
                400,
                f"{at}.type {kind!r} is not supported here (only {', '.join(sorted(kinds))})",
                param=f"{at}.type",
            )
        text = part.get("text", part.get("refusal"))
        if not isinstance(text, str):
            raise HTTPProblem(400, f"{at}.text must be a string", param=f"{at}.text")
        parts.append(text)
    return "".join(parts)


def _reasoning_text(item: dict[str, Any]) -> str:
    for key in ("content", "summary"):
        parts = item.get(key)
        if isinstance(parts, list):
            text = "".join(p.get("text", "") for p in parts if isinstance(p, dict))
            if text:
                return text
    encrypted = item.get("encrypted_content")
    return encrypted if isinstance(encrypted, str) else ""


_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


def _conversation(model: LocalModel, body: ResponsesRequest, images: Images) -> list[Turn]:
    """``instructions`` and ``input`` as turns."""
    converted: list[Turn] = []
    if body.instructions:
        converted.append(Turn(role="system", content=body.instructions))
    items = [{"role": "user", "content": body.input}] if isinstance(body.input, str) else body.input
    names: dict[str, str] = {}  # call_id → function name, for the outputs' tool_name
    reasoning = ""  # a reasoning item belongs to the assistant turn after it

    def assistant() -> Turn:
        nonlocal reasoning
        last = converted[-1] if converted else None
        if last is not None and last.role == "assistant" and not reasoning:
            return last
        message = Turn(role="assistant", content="", thinking=reasoning or None)
        reasoning = ""
        converted.append(message)
        return message

    for index, item in enumerate(items):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise HTTPProblem(400, f"{where} must be an object", param=where)
        kind = item.get("type", "message")
        if kind == "message":
            role = _ROLES.get(item.get("role", ""))
            if role is None:
                raise HTTPProblem(
                    400,
                    f"{where}.role must be user, assistant, system or developer",
                    param=f"{where}.role",
                )
            kinds = {"output_text", "refusal"} if role == "assistant" else {"input_text"}
            # Some clients send their earlier answers back as input_text: both read as text.
            text = _text_of(
                model,
                item.get("content", ""),
                f"{where}.content",
                kinds | {"input_text"},
                None if role == "assistant" else images,
            )
            if role == "assistant":
                message = assistant()
                if message.tool_calls:  # text after calls starts a turn of its own
                    message = Turn(role="assistant", content="")
                    converted.append(message)
                message.content = (message.content or "") + text
            else:
                converted.append(Turn(role=role, content=text))
        elif kind == "function_call":
            call_id, name = item.get("call_id"), item.get("name")
            if not isinstance(call_id, str) or not isinstance(name, str):
                raise HTTPProblem(
                    400, f"{where} needs a string call_id and name", param=f"{where}.call_id"
                )
            names[call_id] = name
            arguments = item.get("arguments") or "{}"
            try:
                parsed = json.loads(arguments) if isinstance(arguments, str) else None
            except ValueError:
                parsed = None
            if not isinstance(parsed, dict):
                raise HTTPProblem(
                    400,
                    f"{where}.arguments must be a JSON object in a string",
                    param=f"{where}.arguments",
                )
            message = assistant()
            call = {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": parsed},
            }
            message.tool_calls = [*(message.tool_calls or []), call]
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise HTTPProblem(400, f"{where}.call_id is required", param=f"{where}.call_id")
            output = _text_of(
                model, item.get("output", ""), f"{where}.output", {"input_text"}, images
            )
            converted.append(
                Turn(
                    role="tool", content=output, tool_call_id=call_id, tool_name=names.get(call_id)
                )
            )
        elif kind == "reasoning":
            reasoning += _reasoning_text(item)
        elif kind == "item_reference":
            raise HTTPProblem(
                400,
                f"{where}: item references need stored items; this server is stateless",
                param=f"{where}.type",
            )
        else:
            raise HTTPProblem(
                400,
                f"{where}.type {kind!r} is not supported (message, function_call, "
                "function_call_output, reasoning)",
                param=f"{where}.type",
            )
    if len(converted) == (1 if body.instructions else 0):
        raise HTTPProblem(400, "input holds no messages", param="input")
    return converted


_TOOL_KEYS = {"type", "name", "description", "parameters", "strict"}


def _tools(body: ResponsesRequest) -> tuple[list[dict[str, Any]], bool]:
    """Flat function tools in the nested shape the tool planner takes; whether any is strict."""
    out = []
    strict = False
    for index, tool in enumerate(body.tools or []):
        where = f"tools[{index}]"
        if isinstance(tool, dict) and "type" not in tool:
            raise HTTPProblem(400, f"{where}.type is required", param=f"{where}.type")
        tool = flat_tool(
            tool,
            where,
            _TOOL_KEYS,
            ("function",),
            " is not supported: only function tools (hosted tools such as web search run at "
            "OpenAI, not here)",
        )
        function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
        strict = strict or bool(tool.get("strict"))
        out.append({"type": "function", "function": function})
    return out, strict


def _tool_echo(tool: dict[str, Any]) -> dict[str, Any]:
    """A function tool as the response object lists it (every field it has, null unset)."""
    return {
        "type": "function",
        "name": tool.get("name"),
        "description": tool.get("description"),
        "parameters": tool.get("parameters"),
        "strict": tool.get("strict"),
    }


def _choice(value: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    """Responses' ``tool_choice`` in Chat Completions' shape."""
    if value is None or isinstance(value, str):
        return value
    kind = value.get("type")
    if kind == "function":
        return {"type": "function", "function": {"name": value.get("name")}}
    if kind == "allowed_tools":
        tools = value.get("tools")
        nested = [
            {"type": "function", "function": {"name": t.get("name")}} if isinstance(t, dict) else t
            for t in (tools if isinstance(tools, list) else [])
        ]
        return {
            "type": "allowed_tools",
            "allowed_tools": {"mode": value.get("mode", "auto"), "tools": nested},
        }
    raise HTTPProblem(
        400,
        f"tool_choice.type {kind!r} is not supported (function or allowed_tools)",
        param="tool_choice.type",
    )


_RENAMES = (
    ("tool_choice.function.name", "tool_choice.name"),
    ("tool_choice.allowed_tools.", "tool_choice."),
    (".function.", "."),
)


def _format(text: TextConfig | None) -> str | dict[str, Any] | None:
    fmt = text.format if text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return "json"
    if fmt.schema_ is None:
        raise HTTPProblem(400, "text.format.schema is required", param="text.format.schema")
    return fmt.schema_


# --- answer --------------------------------------------------------------------------------


def _sse(data: dict[str, Any]) -> bytes:
    return b"event: " + str(data["type"]).encode() + b"\ndata: " + dumps(data) + b"\n\n"


def _new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


class _Output:
    """Parsed output → output items, with the stream events that build them (the same for
    a streamed and a whole answer). Numbers every event it makes."""

    def __init__(
        self, plan: ToolPlan | None, *, summary: bool, encrypted: bool, max_calls: int | None
    ) -> None:
        self.plan = plan
        self.summary = summary
        self.encrypted = encrypted
        self.max_calls = max_calls
        self.items: list[dict[str, Any]] = []
        self.sequence = 0
        self._open: str | None = None  # "reasoning" or "message" while one streams
        self._text = ""
        self._space = ""
        self._calls = 0

    def event(self, kind: str, **fields: Any) -> bytes:
        """One numbered stream event."""
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return _sse(data)

    def _where(self) -> dict[str, Any]:
        return {"item_id": self.items[-1]["id"], "output_index": len(self.items) - 1}

    def _add_item(self, item: dict[str, Any]) -> list[bytes]:
        self.items.append(item)
        return [
            self.event("response.output_item.added", output_index=len(self.items) - 1, item=item)
        ]

    def _open_item(self, kind: str) -> list[bytes]:
        events = self.close()
        self._open, self._text = kind, ""
        if kind == "reasoning":
            item = {"id": _new_id("rs"), "type": "reasoning", "summary": [], "content": []}
            part = {"type": "reasoning_text", "text": ""}
        else:
            item = {
                "id": _new_id("msg"),
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        events += self._add_item(item)
        events.append(
            self.event("response.content_part.added", **self._where(), content_index=0, part=part)
        )
        return events

    def close(self, status: str = "completed") -> list[bytes]:
        """Events finishing the item that streams (``status`` for a cut-off answer)."""
        kind, text = self._open, self._text
        if kind is None:
            return []
        self._open = None
        where = {**self._where(), "content_index": 0}
        item = self.items[-1]
        events = []
        if kind == "reasoning":
            part: dict[str, Any] = {"type": "reasoning_text", "text": text}
            events.append(self.event("response.reasoning_text.done", **where, text=text))
            events.append(self.event("response.content_part.done", **where, part=part))
            item["content"] = [part]
            if self.summary:
                summary = {"type": "summary_text", "text": text}
                at = {**self._where(), "summary_index": 0}
                empty = {"type": "summary_text", "text": ""}
                events.append(self.event("response.reasoning_summary_part.added", **at, part=empty))
                events.append(self.event("response.reasoning_summary_text.delta", **at, delta=text))
                events.append(self.event("response.reasoning_summary_text.done", **at, text=text))
                events.append(
                    self.event("response.reasoning_summary_part.done", **at, part=summary)
                )
                item["summary"] = [summary]
            if self.encrypted:
                item["encrypted_content"] = text
        else:
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            events.append(self.event("response.output_text.done", **where, text=text, logprobs=[]))
            events.append(self.event("response.content_part.done", **where, part=part))
            item["content"] = [part]
        item["status"] = status
        events.append(
            self.event("response.output_item.done", output_index=len(self.items) - 1, item=item)
        )
        return events

    def add(self, parsed: Delta) -> list[bytes]:
        """Events for the next parsed piece."""
        events: list[bytes] = []
        if parsed.thinking:
            self._space = ""
            if self._open != "reasoning":
                events += self._open_item("reasoning")
            self._text += parsed.thinking
            events.append(
                self.event(
                    "response.reasoning_text.delta",
                    **self._where(),
                    content_index=0,
                    delta=parsed.thinking,
                )
            )
        if parsed.content:
            text = self._space + parsed.content
            if self._open != "message" and not text.strip():
                self._space = text  # whitespace between reasoning and a call is no message
            else:
                self._space = ""
                if self._open != "message":
                    events += self._open_item("message")
                self._text += text
                events.append(
                    self.event(
                        "response.output_text.delta",
                        **self._where(),
                        content_index=0,
                        delta=text,
                        logprobs=[],
                    )
                )
        for call in parsed.calls:
            self._space = ""
            if self.max_calls is not None and self._calls >= self.max_calls:
                continue  # max_tool_calls: further calls are dropped
            self._calls += 1
            events += self._call(call)
        return events

    def _call(self, call: ToolCall) -> list[bytes]:
        assert self.plan is not None
        events = self.close()
        arguments = json.dumps(call.arguments, ensure_ascii=False)
        item = {
            "id": _new_id("fc"),
            "type": "function_call",
            "status": "in_progress",
            "call_id": self.plan.call_id(call),
            "name": call.name,
            "arguments": "",
        }
        events += self._add_item(item)
        where = self._where()
        events.append(
            self.event("response.function_call_arguments.delta", **where, delta=arguments)
        )
        events.append(
            self.event(
                "response.function_call_arguments.done",
                **where,
                name=call.name,
                arguments=arguments,
            )
        )
        item["arguments"] = arguments
        item["status"] = "completed"
        events.append(
            self.event("response.output_item.done", output_index=len(self.items) - 1, item=item)
        )
        return events


def _status(done: Done) -> str:
    """``incomplete`` when the answer ran into max_output_tokens (or a call it cut off),
    else ``completed``."""
    return "incomplete" if done.limited else "completed"


def _usage(done: Done) -> dict[str, Any]:
    return {
        "input_tokens": done.prompt_tokens,
        # the daemon writes every prefix to its cache on its own, none on request
        "input_tokens_details": {"cached_tokens": done.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": done.output_tokens,
        "output_tokens_details": {"reasoning_tokens": done.reasoning_tokens},
        "total_tokens": done.prompt_tokens + done.output_tokens,
    }


@router.post("/responses", summary="Responses (OpenAI), stateless")
async def responses(body: ResponsesRequest, request: Request, state: StateDep) -> Response:
    """OpenAI's Responses API without storage, streamed as its events when ``stream``."""
    _refuse_state(body)
    model = resolve_model(state, body.model)
    overrides: dict[str, Any] = {}
    if body.max_output_tokens is not None:
        overrides["num_predict"] = body.max_output_tokens
    for key in ("temperature", "top_p"):
        value = getattr(body, key)
        if value is not None:
            overrides[key] = value
    tools, strict = _tools(body)
    effort = body.reasoning.effort if body.reasoning is not None else None
    ask = Ask(
        model=model,
        api="openai",
        options=merge_options(model, overrides, prefix=""),
        format=_format(body.text),
        tools=tools,
        tool_choice=_choice(body.tool_choice),
        parallel=body.parallel_tool_calls,
        strict=strict,
        tool_renames=_RENAMES,
        # as Chat Completions' reasoning_effort: absent, the template's default; none, off;
        # a level, on at that level (for templates with levels)
        think=reasoning_effort_think(effort, field="reasoning.effort"),
        think_field="reasoning.effort",
        truncate=body.truncation == "auto",
        images=Images(state.settings, model),
    )
    assert ask.images is not None
    ask.turns = _conversation(model, body, ask.images)
    planned = plan(state, ask)
    sampling = planned.jobs[0].request.options
    reply = await Reply.open(state, request, planned)
    reasoning = body.reasoning
    output = _Output(
        planned.tools,
        summary=reasoning is not None and bool(reasoning.summary or reasoning.generate_summary),
        encrypted="reasoning.encrypted_content" in (body.include or []),
        max_calls=body.max_tool_calls,
    )
    name = model.name.short
    created = int(time.time())
    ident = _new_id("resp")

    def response(status: str, done: Done | None, **extra: Any) -> dict[str, Any]:
        fmt = body.text.format if body.text is not None else None
        return {
            "id": ident,
            "object": "response",
            "created_at": created,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": None,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "max_tool_calls": body.max_tool_calls,
            "model": name,
            "output": output.items,
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": None,
            "reasoning": {
                "effort": reasoning.effort if reasoning else None,
                "summary": (reasoning.summary or reasoning.generate_summary) if reasoning else None,
            },
            "store": False,  # nothing is stored, whatever the request said
            # the values the answer was sampled with (the request's, else the model's)
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "presence_penalty": sampling.presence_penalty,
            "frequency_penalty": sampling.frequency_penalty,
            "top_logprobs": 0,
            "text": {
                "format": fmt.model_dump(by_alias=True, exclude_none=True)
                if fmt
                else {"type": "text"}
            },
            "tool_choice": body.tool_choice if body.tool_choice is not None else "auto",
            "tools": [_tool_echo(tool) for tool in body.tools or []],
            "truncation": body.truncation or "disabled",
            # null until the answer is done, as OpenAI's own response.created example shows
            # and Open Responses requires (present, possibly null)
            "usage": _usage(done) if done is not None else None,
            "metadata": body.metadata or {},
            "completed_at": None,
            # one tier here; Open Responses requires the field, OpenAI names "default"
            "service_tier": "default",
            "safety_identifier": body.safety_identifier,
            "prompt_cache_key": body.prompt_cache_key,
            **({"user": body.user} if body.user is not None else {}),
            **extra,
        }

    def finished(done: Done) -> dict[str, Any]:
        """The final response object, once the output items are closed."""
        if done.limited:
            extra = {"incomplete_details": {"reason": "max_output_tokens"}}
            return response("incomplete", done, **extra)
        return response("completed", done, completed_at=int(time.time()))

    if not body.stream:
        (whole,) = await reply.whole(request)
        output.add(Delta(whole.content, whole.thinking, whole.calls))
        output.close(_status(whole.done))
        return JSONResponse(finished(whole.done), headers=reply.timing_headers(whole.done))

    async def stream() -> AsyncIterator[bytes]:
        yield output.event("response.created", response=response("in_progress", None))
        yield output.event("response.in_progress", response=response("in_progress", None))
        try:
            async for _, event in reply.events():
                if isinstance(event, Done):
                    status = _status(event)
                    for out in output.close(status):
                        yield out
                    yield output.event(f"response.{status}", response=finished(event))
                    return
                for out in output.add(event):
                    yield out
        except Exception as exc:
            problem = problem_from(exc, name)
            error = openai_error(problem)["error"]
            fields = {"code": error["code"], "message": error["message"], "param": error["param"]}
            # OpenAI's document puts the fields at the top of the event, Open Responses in an
            # "error" object: both are sent, so a client of either reads them
            yield output.event("error", **fields, error={"type": error["type"], **fields})
            # the error's own code where it has one (Codex reads context_length_exceeded)
            failed = {"code": error["code"] or "server_error", "message": problem.message}
            yield output.event("response.failed", response=response("failed", None, error=failed))

    return ClosingStreamingResponse(
        stream(), media_type="text/event-stream", on_close=reply.close, timing=reply
    )
