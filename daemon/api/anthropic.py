"""Anthropic's Messages API: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

Claude Code and the ``anthropic`` Python client can use a local model through these routes, as
Ollama allows. A request is translated into the daemon's own chat request (the model's chat
template renders the system prompt, the turns, ``tool_use`` / ``tool_result`` blocks and the
tools); the model's output is split back into ``thinking``, ``text`` and ``tool_use`` blocks.

Every field of the request is honoured or refused with a 400 naming it. The ones without an
effect on a local model say why in :class:`MessagesRequest`. Headers: ``anthropic-version``
and ``anthropic-beta`` are accepted and need nothing (there is one version of this API here).
The daemon's API key (``LOCALLLM_API_KEY``) is checked by :mod:`..security`, which reads
``Authorization: Bearer`` only: Claude Code's ``ANTHROPIC_AUTH_TOKEN`` sends that, while an
``x-api-key`` header (``ANTHROPIC_API_KEY``, the Python client's ``api_key``) is not read there.

Errors take Anthropic's shape ``{"type": "error", "error": {"type", "message"}}`` with
Anthropic's status codes (an unknown model is 404 ``not_found_error``, a full queue is 529
``overloaded_error``); an error after a stream has started is an ``event: error``.

This module also holds what :mod:`.responses` shares with it: the output pipeline (stop
sequences, reasoning, tool calls), the thinking switch and request-error rendering.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from localllm.models import LocalModel

from ..errors import ClientGone, HTTPProblem, field_path, problem_from, validation_problem
from ..generation import Generation, Job, Outcome, resolve_model, start, until_disconnect
from ..options import merge_options, sampling_options
from ..runner.protocol import GenerationRequest
from ..state import DaemonState, StateDep
from ..toolcalls import Parsed, ToolCall
from .ollama import chat_messages
from .schemas_ollama import ChatMessage
from .streaming import ClosingStreamingResponse, dumps
from .tooling import AnswerStream, ThinkPlan, ToolPlan, model_template, plan_thinking, plan_tools
from .vision import Images, no_vision

__all__ = [
    "CountTokensRequest",
    "MessagesRequest",
    "ReplyEnd",
    "ReplyParser",
    "chat_history",
    "check_generates",
    "check_strict",
    "collect_reply",
    "error_route",
    "plan_renamed",
    "read_reply",
    "render_error",
    "reply_parser",
    "request_problem",
    "router",
]

log = logging.getLogger("localllm.daemon")


# --- shared with the Responses API ---------------------------------------------------------


def request_problem(exc: RequestValidationError) -> HTTPProblem:
    """A 400 for a request body that failed validation, naming the field; unknown fields
    are named together (no parameter is silently ignored, so they are refused)."""
    errors = list(exc.errors())
    unknown = [field_path(e.get("loc", ())) for e in errors if e.get("type") == "extra_forbidden"]
    if unknown:
        plural = "s" if len(unknown) > 1 else ""
        return HTTPProblem(
            400,
            f"unknown field{plural} {', '.join(unknown)}: not supported by localllm "
            "(remove it; no parameter is silently ignored)",
            param=unknown[0],
            code="unknown_field",
        )
    # Anthropic's wording, which its clients show as they get it.
    return validation_problem(
        errors, missing="{field}: Field required", invalid="{field}: {message}"
    )


Renderer = Callable[[Request, HTTPProblem], Response]


def error_route(render: Renderer) -> type[APIRoute]:
    """A route class whose errors (bad bodies included) are answered by ``render`` in the
    API's own shape; the app-wide handlers would answer in OpenAI's shape under ``/v1``."""

    class _Route(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()

            async def route(request: Request) -> Response:
                try:
                    return await handler(request)
                except ClientGone:
                    raise  # no one to answer; the app logs a 499
                except RequestValidationError as exc:
                    return render(request, request_problem(exc))
                except HTTPProblem as exc:
                    return render(request, exc)
                except StarletteHTTPException as exc:  # FastAPI's own 4xx (a body not JSON)
                    detail = exc.detail if isinstance(exc.detail, str) else "bad request"
                    return render(request, HTTPProblem(exc.status_code, detail))
                except Exception as exc:
                    problem = problem_from(exc)
                    if problem.status >= 500 and problem.code == "internal":
                        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
                    return render(request, problem)

            return route

    return _Route


def check_generates(model: LocalModel) -> None:
    """400 unless ``model`` generates text (an embedding model does not)."""
    if "completion" not in model.capabilities():
        raise HTTPProblem(400, f"{model.name.short} cannot generate text", param="model")


def plan_renamed(
    model: LocalModel,
    tools: list[dict[str, Any]],
    renames: Sequence[tuple[str, str]],
    **kwargs: Any,
) -> ToolPlan | None:
    """:func:`plan_tools` for an API whose tools are flat (``{name, ...}``, not nested in
    ``function``): its 400s are rewritten to name the fields as that API spells them."""
    try:
        return plan_tools(model, tools, **kwargs)
    except HTTPProblem as exc:
        message, param = exc.message, exc.param
        for old, new in renames:
            message = message.replace(old, new)
            param = param.replace(old, new) if param else param
        raise HTTPProblem(exc.status, message, param=param, code=exc.code) from None


def _partial_stop(text: str, stops: Sequence[str]) -> int:
    """How many characters at the end of ``text`` may begin a stop sequence."""
    best = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:n]):
                best = n
                break
    return best


class ReplyParser:
    """A model's output as a client sees it: cut at the first stop sequence, then through an
    :class:`AnswerStream` (reasoning split out, tool calls parsed).

    Stop sequences are matched here rather than in the runner because the APIs report which
    one matched (Anthropic's ``stop_sequence``), which the runner does not say."""

    def __init__(self, answer: AnswerStream, stops: Sequence[str] = ()) -> None:
        self.answer = answer
        self.stops = [s for s in stops if s]
        self.stopped: str | None = None
        """The stop sequence that ended the output, once one has."""
        self.in_thinking = False
        """Whether the model is (still) reasoning, as far as the output shows."""
        self._held = ""

    def feed(self, text: str) -> Parsed:
        """The next piece of output."""
        if self.stopped is not None or not text:
            return Parsed()
        if not self.stops:
            return self._parse(text)
        buffer = self._held + text
        match: tuple[int, str] | None = None
        for stop in self.stops:
            at = buffer.find(stop)
            if at >= 0 and (match is None or at < match[0]):
                match = (at, stop)
        if match is not None:
            self.stopped = match[1]
            self._held = ""
            return self._parse(buffer[: match[0]])
        keep = _partial_stop(buffer, self.stops)
        self._held = buffer[len(buffer) - keep :]
        return self._parse(buffer[: len(buffer) - keep])

    def finish(self) -> Parsed:
        """The output ended (or was stopped): what was held back."""
        out = self._parse(self._held)
        self._held = ""
        return self._note(out.add(self.answer.finish()))

    def _parse(self, text: str) -> Parsed:
        return self._note(self.answer.feed(text)) if text else Parsed()

    def _note(self, parsed: Parsed) -> Parsed:
        if parsed.thinking:
            self.in_thinking = True
        if parsed.content.strip() or parsed.calls:
            self.in_thinking = False
        return parsed


def reply_parser(
    plan: ToolPlan | None,
    think: ThinkPlan | None,
    prompt_tail: str,
    stops: Sequence[str] = (),
) -> ReplyParser:
    """The parser for one answer; ``prompt_tail`` (the rendered prompt's end) tells whether
    the template already opened a reasoning block."""
    if plan is not None and plan.grammar is not None:
        prompt_tail = ""  # a grammar-forced call starts at once: no reasoning comes first
    return ReplyParser(AnswerStream(plan, think, prompt_tail), stops)


def check_strict(plan: ToolPlan | None, strict: bool, field: str = "tools") -> None:
    """Strict tools need every call checked against its schema: by the forced call's grammar
    or the lazy one that starts at the family's call opener. Without either, a 400."""
    if strict and plan is not None and plan.grammar is None and plan.lazy_grammar is None:
        raise HTTPProblem(
            400,
            "strict tools: calls cannot be checked against their schemas here (this model's "
            "call syntax has no opener to start checking at, or the output has a format); "
            "drop strict, or force a call with tool_choice",
            param=field,
        )


@dataclass
class ReplyEnd:
    """How an answer ended, with its token counts."""

    reason: Literal["stop", "length", "stop_sequence", "thinking_budget"]
    """``stop`` (the model ended), ``length`` (the token limit), ``stop_sequence`` (one of
    the request's), ``thinking_budget`` (reasoning ran past its budget)."""
    stop_sequence: str | None
    """The stop sequence that matched."""
    prompt_tokens: int
    """Tokens in the prompt."""
    cached_tokens: int
    """Prompt tokens reused from the cache."""
    output_tokens: int
    """Tokens generated."""
    reasoning_tokens: int
    """Of those, tokens generated while the model was reasoning (as the output shows)."""


async def collect_reply(
    request: Request,
    pieces: AsyncIterator[Parsed | ReplyEnd],
    add: Callable[[Parsed], None],
    model_name: str,
) -> ReplyEnd:
    """Run a reply that is answered whole to its end, handing each parsed piece to ``add``;
    gives up when the client leaves, and failures become :class:`HTTPProblem`."""

    async def collect() -> ReplyEnd:
        async for piece in pieces:
            if isinstance(piece, ReplyEnd):
                return piece
            add(piece)
        raise HTTPProblem(500, "the generation ended without a result")

    try:
        return await until_disconnect(request, collect())
    except (HTTPProblem, ClientGone):
        raise
    except Exception as exc:
        raise problem_from(exc, model_name) from exc
    finally:
        await pieces.aclose()  # type: ignore[attr-defined]


async def read_reply(
    generation: Generation, parser: ReplyParser, thinking_budget: int | None = None
) -> AsyncIterator[Parsed | ReplyEnd]:
    """Run ``generation`` through ``parser``: parsed pieces, then one :class:`ReplyEnd`.

    A stop sequence or a spent reasoning budget ends the runner request early; the tokens
    are then counted here (exactly when the request asked the runner for log probabilities,
    one entry per token)."""
    tokens = 0
    reasoning = 0
    events = generation.chunks()
    try:
        async for item in events:
            if isinstance(item, Outcome):
                result = item.result
                if result.done_reason == "error":
                    raise HTTPProblem(500, result.error or "generation failed")
                rest = parser.finish()
                if rest:
                    yield rest
                t = result.timings
                yield ReplyEnd(
                    "length" if result.done_reason == "length" else "stop",
                    None,
                    t.prompt_tokens,
                    t.cached_tokens,
                    t.completion_tokens,
                    min(reasoning, t.completion_tokens),
                )
                return
            count = len(item.logprobs) if item.logprobs else 1
            tokens += count
            was_thinking = parser.in_thinking
            parsed = parser.feed(item.text)
            if was_thinking or parser.in_thinking:
                reasoning += count
            if parsed:
                yield parsed
            over_budget = (
                thinking_budget is not None and parser.in_thinking and reasoning > thinking_budget
            )
            if parser.stopped is not None or over_budget:
                rest = parser.finish()
                if rest:
                    yield rest
                yield ReplyEnd(
                    "stop_sequence" if parser.stopped is not None else "thinking_budget",
                    parser.stopped,
                    generation.prompt_tokens,
                    0,  # the runner reports cache use at the end, which is not awaited here
                    tokens,
                    reasoning,
                )
                return
    finally:
        await events.aclose()
        generation.close()


# --- request ---------------------------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ToolChoice(_Body):
    """``tool_choice``: ``auto``, ``any`` (some call), ``tool`` (this one), ``none``."""

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = Field(
        None, description="true: at most one tool_use block per answer."
    )


class ThinkingConfig(_Body):
    """``thinking``: ``enabled`` (with ``budget_tokens``), ``disabled`` or ``adaptive``."""

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(
        None,
        ge=1,
        description="Caps the reasoning: a model still reasoning after this many tokens is "
        "stopped there (stop_reason max_tokens). Must be below max_tokens.",
    )
    display: Literal["summarized", "omitted"] | None = Field(
        None,
        description="omitted: thinking blocks come back empty. summarized (the default): "
        "they hold the model's reasoning, whole (a local model's reasoning is not summarised).",
    )


class OutputFormat(_Body):
    """``output_config.format``: a JSON schema the answer's text must follow."""

    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(..., alias="schema")


class OutputConfig(_Body):
    """``output_config``: ``effort`` is the reasoning level (with thinking enabled or
    adaptive; 400 for a template without levels); ``format`` constrains the text by grammar."""

    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: OutputFormat | None = None


class Metadata(_Body):
    """``metadata``: Anthropic uses ``user_id`` for abuse detection; a local daemon has no
    such thing, so it has no effect here (accepted so clients that always send it work)."""

    user_id: str | None = None


class InputMessage(_Body):
    """One turn: ``content`` is a string or a list of blocks."""

    role: Literal["user", "assistant", "system"]
    content: str | list[dict[str, Any]]


class _Conversation(_Body):
    model: str = Field(..., min_length=1)
    messages: list[InputMessage] = Field(..., min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = Field(
        None, description="Custom tools: {name, description, input_schema}."
    )
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = Field(
        None,
        description="Absent or disabled: the template's reasoning switch is turned off (and "
        "reasoning a model writes anyway is dropped). enabled: on (400 for a model without "
        "reasoning). adaptive: the template's default.",
    )
    output_config: OutputConfig | None = None
    cache_control: dict[str, Any] | None = Field(
        None,
        description="Accepted; needs nothing: the daemon reuses cached prompt prefixes on its own.",
    )


class MessagesRequest(_Conversation):
    """POST /v1/messages. ``metadata`` has no effect (see :class:`Metadata`); blocks may carry
    ``cache_control``, which needs nothing here: the daemon reuses every cached prompt prefix
    on its own. A thinking block's ``signature`` is not checked (local reasoning is not
    signed)."""

    max_tokens: int = Field(..., ge=1, le=1 << 24)
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0)
    stop_sequences: list[str] | None = Field(None, max_length=64)
    stream: bool | None = False
    metadata: Metadata | None = None


class CountTokensRequest(_Conversation):
    """POST /v1/messages/count_tokens: the prompt's length as the model's template renders
    and its tokenizer counts it."""


# Block keys that need nothing from a local model: cache_control (prefix caching is
# automatic), citations (only in the model's own earlier answers), signature (unsigned here).
# caller and toolset_name only say who called a tool, which the template has no place for.
_PASSIVE = {"type", "cache_control", "citations"}
_BLOCK_KEYS = {
    "text": {"text"},
    "tool_use": {"id", "name", "input", "caller", "toolset_name"},
    "tool_result": {"tool_use_id", "content", "is_error", "toolset_name"},
    "thinking": {"thinking", "signature"},
    "image": {"source"},
}


def _block(block: Any, where: str, allowed: set[str], model: LocalModel) -> str:
    if not isinstance(block, dict):
        raise HTTPProblem(400, f"{where} must be an object", param=where)
    kind = block.get("type")
    if kind == "image" and "vision" not in model.capabilities():
        raise HTTPProblem(400, no_vision(model), param=where)
    if kind not in allowed:
        kinds = ", ".join(sorted(allowed))
        raise HTTPProblem(
            400, f"{where}.type {kind!r} is not supported here (only {kinds})", param=where
        )
    extra = set(block) - _BLOCK_KEYS[kind] - _PASSIVE
    if extra:
        name = sorted(extra)[0]
        raise HTTPProblem(
            400, f"{where}.{name}: unknown field of a {kind} block", param=f"{where}.{name}"
        )
    return str(kind)


def _text(block: dict[str, Any], where: str, key: str = "text") -> str:
    value = block.get(key)
    if not isinstance(value, str):
        raise HTTPProblem(400, f"{where}.{key} must be a string", param=f"{where}.{key}")
    return value


def _system(
    model: LocalModel, system: str | list[dict[str, Any]] | None, field: str = "system"
) -> str | None:
    if system is None or isinstance(system, str):
        return system
    parts = []
    for index, block in enumerate(system):
        where = f"{field}[{index}]"
        _block(block, where, {"text"}, model)
        parts.append(_text(block, where))
    return "\n\n".join(parts)


def _image(block: dict[str, Any], where: str, images: Images) -> str:
    """An ``image`` block → its marker: only a ``base64`` source (the daemon fetches nothing;
    a ``file`` source needs the Files API)."""
    source = block.get("source")
    if not isinstance(source, dict):
        raise HTTPProblem(400, f"{where}.source must be an object", param=f"{where}.source")
    kind = source.get("type")
    if kind == "url":
        raise HTTPProblem(
            400,
            f"{where}.source: the daemon does not fetch images from the internet; send the "
            "image inline as a base64 source",
            param=f"{where}.source",
        )
    if kind != "base64":
        raise HTTPProblem(
            400,
            f"{where}.source.type {kind!r} is not supported (only base64)",
            param=f"{where}.source.type",
        )
    media_type = source.get("media_type")
    if media_type is not None and not (
        isinstance(media_type, str) and media_type.startswith("image/")
    ):
        raise HTTPProblem(
            400,
            f"{where}.source.media_type must be an image type, got {media_type!r}",
            param=f"{where}.source.media_type",
        )
    # As Anthropic's API does, a declared type must be the bytes' own.
    declared = (media_type, f"{where}.source.media_type") if media_type else None
    return images.add_base64(source.get("data"), f"{where}.source.data", declared)


def _tool_result(
    model: LocalModel, block: dict[str, Any], where: str, images: Images | None = None
) -> str:
    content = block.get("content", "")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        pieces = []
        for index, part in enumerate(content):
            at = f"{where}.content[{index}]"
            allowed = {"text", "image"} if images is not None else {"text"}
            if _block(part, at, allowed, model) == "image" and images is not None:
                pieces.append(_image(part, at, images))
            else:
                pieces.append(_text(part, at))
        text = "\n".join(pieces)
    else:
        raise HTTPProblem(
            400, f"{where}.content must be a string or text blocks", param=f"{where}.content"
        )
    # The templates have no field for a failed call: the model learns it from the text.
    return f"Error: {text}" if block.get("is_error") else text


def _conversation(
    model: LocalModel, body: _Conversation, plan: ToolPlan | None, images: Images
) -> list[dict[str, Any]]:
    """The runner's chat messages for an Anthropic conversation."""
    converted: list[ChatMessage] = []
    system = _system(model, body.system)
    if system:
        converted.append(ChatMessage(role="system", content=system))
    names: dict[str, str] = {}  # tool_use id → tool name, for the results' tool_name
    for index, message in enumerate(body.messages):
        where = f"messages[{index}].content"
        blocks = (
            [{"type": "text", "text": message.content}]
            if isinstance(message.content, str)
            else message.content
        )
        if message.role == "system":
            content = _system(model, blocks, where) or ""
            converted.append(ChatMessage(role="system", content=content))
            continue
        if message.role == "assistant":
            text, thinking, calls = [], [], []
            for number, block in enumerate(blocks):
                at = f"{where}[{number}]"
                kind = _block(block, at, {"text", "thinking", "tool_use"}, model)
                if kind == "text":
                    text.append(_text(block, at))
                elif kind == "thinking":
                    thinking.append(_text(block, at, "thinking"))
                else:
                    call_id, name = block.get("id"), block.get("name")
                    if not isinstance(call_id, str) or not isinstance(name, str):
                        raise HTTPProblem(
                            400, f"{at} needs a string id and name", param=f"{at}.name"
                        )
                    names[call_id] = name
                    arguments = block.get("input", {})
                    if not isinstance(arguments, dict):
                        raise HTTPProblem(400, f"{at}.input must be an object", param=f"{at}.input")
                    calls.append(
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": name, "arguments": arguments},
                        }
                    )
            converted.append(
                ChatMessage(
                    role="assistant",
                    content="".join(text),
                    thinking="".join(thinking) or None,
                    tool_calls=calls or None,
                )
            )
            continue
        pending: list[str] = []
        for number, block in enumerate(blocks):
            at = f"{where}[{number}]"
            kind = _block(block, at, {"text", "tool_result", "image"}, model)
            if kind == "text":
                pending.append(_text(block, at))
                continue
            if kind == "image":
                pending.append(_image(block, at, images))
                continue
            if pending:
                converted.append(ChatMessage(role="user", content="".join(pending)))
                pending = []
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str) or not call_id:
                raise HTTPProblem(400, f"{at}.tool_use_id is required", param=f"{at}.tool_use_id")
            converted.append(
                ChatMessage(
                    role="tool",
                    content=_tool_result(model, block, at, images),
                    tool_call_id=call_id,
                    tool_name=names.get(call_id),
                )
            )
        if pending or not blocks:
            converted.append(ChatMessage(role="user", content="".join(pending)))
    if body.messages[-1].role == "assistant":
        # The templates close every assistant turn, so its text cannot be continued.
        raise HTTPProblem(
            400,
            "a final assistant message (prefilling the answer) is not supported: "
            "end the conversation with a user turn",
            param=f"messages[{len(body.messages) - 1}]",
        )
    return chat_history(model, converted, plan)


def chat_history(
    model: LocalModel, converted: list[ChatMessage], plan: ToolPlan | None
) -> list[dict[str, Any]]:
    """The runner's messages for ``converted`` (the model's own SYSTEM and MESSAGEs first, as
    on ``/api/chat``); an assistant's earlier reasoning goes in ``reasoning_content``, the
    field templates that show past reasoning read (Qwen3, llama.cpp's convention)."""
    out = chat_messages(model, converted, plan=plan)
    offset = len(out) - len(converted)
    for index, message in enumerate(converted):
        if message.thinking:
            out[offset + index]["reasoning_content"] = message.thinking
    return out


# A tool's keys that need nothing here: cache_control (prefix caching is automatic) and
# eager_input_streaming (calls are parsed whole, so their input always streams in one piece).
_TOOL_KEYS = {
    "name",
    "description",
    "input_schema",
    "type",
    "cache_control",
    "eager_input_streaming",
    "strict",
    "input_examples",
    "defer_loading",
    "allowed_callers",
}


def _tools(body: _Conversation) -> tuple[list[dict[str, Any]], bool]:
    """Anthropic's custom tools as OpenAI-style function tools, and whether any is strict."""
    out = []
    strict = False
    for index, tool in enumerate(body.tools or []):
        where = f"tools[{index}]"
        if not isinstance(tool, dict):
            raise HTTPProblem(400, f"{where} must be an object", param=where)
        kind = tool.get("type", "custom")
        if kind not in (None, "custom"):
            raise HTTPProblem(
                400,
                f"{where}.type {kind!r}: Anthropic's server tools are not available here; "
                "only custom tools (name, description, input_schema)",
                param=f"{where}.type",
            )
        extra = sorted(set(tool) - _TOOL_KEYS)
        if extra:
            raise HTTPProblem(
                400, f"{where}.{extra[0]}: unknown field of a tool", param=f"{where}.{extra[0]}"
            )
        if tool.get("defer_loading"):
            raise HTTPProblem(
                400,
                f"{where}.defer_loading: tool search is not available here; offer the tool "
                "directly",
                param=f"{where}.defer_loading",
            )
        callers = tool.get("allowed_callers")
        if callers is not None and list(callers) != ["direct"]:
            raise HTTPProblem(
                400,
                f'{where}.allowed_callers: only "direct" calls exist here (no code execution)',
                param=f"{where}.allowed_callers",
            )
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise HTTPProblem(
                400,
                f"{where}.input_schema is required (a JSON schema object)",
                param=f"{where}.input_schema",
            )
        function: dict[str, Any] = {"name": tool.get("name"), "parameters": schema}
        description = tool.get("description")
        examples = tool.get("input_examples")
        if examples:
            # Templates render a tool's description, not examples: they go at its end.
            shown = "\n".join(json.dumps(example, ensure_ascii=False) for example in examples)
            description = f"{description or ''}\n\nExample inputs:\n{shown}".strip()
        if description is not None:
            function["description"] = description
        strict = strict or bool(tool.get("strict"))
        out.append({"type": "function", "function": function})
    return out, strict


_RENAMES = (
    ("tool_choice.function.name", "tool_choice.name"),
    (".function.parameters", ".input_schema"),
    (".function.", "."),
)


def _plan(model: LocalModel, body: _Conversation, formatted: bool) -> ToolPlan | None:
    tools, strict = _tools(body)
    choice: str | dict[str, Any] | None = None
    parallel = None
    if body.tool_choice is not None:
        kind = body.tool_choice.type
        if kind == "tool":
            if not body.tool_choice.name:
                raise HTTPProblem(
                    400, 'tool_choice.name is required for type "tool"', param="tool_choice.name"
                )
            choice = {"type": "function", "function": {"name": body.tool_choice.name}}
        elif tools or kind not in ("auto", "none"):
            choice = {"auto": "auto", "any": "required", "none": "none"}[kind]
        if body.tool_choice.disable_parallel_tool_use:
            parallel = False
    plan = plan_renamed(
        model,
        tools,
        _RENAMES,
        tool_choice=choice,
        parallel=parallel,
        constrained_output=formatted,
        field="tools",
    )
    check_strict(plan, strict)
    return plan


@dataclass
class _Prepared:
    model: LocalModel
    job: Job
    plan: ToolPlan | None
    think: ThinkPlan | None
    stops: list[str]
    budget: int | None
    omit_thinking: bool


# Anthropic's effort levels as reasoning levels (think values).
_EFFORT = {"low": "low", "medium": "medium", "high": "high", "xhigh": "max", "max": "max"}


def _thinking(
    model: LocalModel, body: _Conversation, forced: bool, max_tokens: int | None
) -> tuple[ThinkPlan | None, int | None]:
    """The reasoning plan for ``thinking`` and ``output_config.effort``, and the budget."""
    thinking = body.thinking
    effort = body.output_config.effort if body.output_config is not None else None
    budget = None
    if thinking is not None and thinking.type != "enabled" and thinking.budget_tokens is not None:
        raise HTTPProblem(
            400,
            f'thinking.budget_tokens only goes with type "enabled", not {thinking.type!r}',
            param="thinking.budget_tokens",
        )
    think: bool | str | None
    if thinking is None or thinking.type == "disabled":
        think = False  # Anthropic's default: no reasoning unless asked for
    elif thinking.type == "adaptive":
        think = None  # the template's own default: the model decides
    else:
        if forced:
            # Anthropic refuses this too: a forced call leaves no room for reasoning.
            raise HTTPProblem(
                400,
                "thinking may not be enabled when tool_choice forces tool use",
                param="thinking",
            )
        budget = thinking.budget_tokens
        if budget is None:
            raise HTTPProblem(
                400, "thinking.budget_tokens: Field required", param="thinking.budget_tokens"
            )
        if max_tokens is not None and budget >= max_tokens:
            raise HTTPProblem(
                400,
                "max_tokens must be greater than thinking.budget_tokens",
                param="thinking.budget_tokens",
            )
        think = True
    if effort is None:
        return plan_thinking(model, think, field="thinking"), budget
    if think is False:
        raise HTTPProblem(
            400,
            "output_config.effort: a local model's effort is how much it reasons, and thinking "
            "is off; enable thinking (or adaptive) or leave effort out",
            param="output_config.effort",
        )
    plan = plan_thinking(model, _EFFORT[effort], field="output_config.effort")
    if plan is None or not plan.style.takes_level:
        raise HTTPProblem(
            400,
            f"output_config.effort: {model.name.short}'s chat template has no reasoning "
            "levels; leave effort out",
            param="output_config.effort",
        )
    return plan, budget


def _prepare(
    state: DaemonState,
    body: _Conversation,
    overrides: dict[str, Any],
    stops: list[str],
    max_tokens: int | None,
) -> _Prepared:
    model = resolve_model(state, body.model)
    check_generates(model)
    output_format = body.output_config.format if body.output_config is not None else None
    plan = _plan(model, body, output_format is not None)
    forced = plan is not None and plan.grammar is not None
    think, budget = _thinking(model, body, forced, max_tokens)
    options = merge_options(model, overrides, prefix="")
    sampling = sampling_options(options)
    # The runner's log probabilities count tokens exactly when the answer may be cut here.
    sampling.logprobs = bool(stops) or budget is not None
    if output_format is not None:
        sampling.json_schema = output_format.schema_
    images = Images(state.settings, model)
    runner_request = GenerationRequest(
        id="",
        messages=_conversation(model, body, plan, images),
        template=model_template(model),
        options=sampling,
        images=images.encoded,
    )
    if plan is not None:
        plan.apply(runner_request)
    if think is not None:
        think.apply(runner_request)
    job = Job.for_model(state, model, options, runner_request, None, "anthropic")
    omit = body.thinking is not None and body.thinking.display == "omitted"
    return _Prepared(model, job, plan, think, stops, budget, omit)


# --- answer ----------------------------------------------------------------------------------


def _error_type(status: int) -> str:
    return {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        413: "request_too_large",
        429: "rate_limit_error",
        529: "overloaded_error",
    }.get(status, "invalid_request_error" if 400 <= status < 500 else "api_error")


_OVERFLOW = re.compile(r"(\d+) tokens, more than fit in this model's context of (\d+)")


def _anthropic_problem(problem: HTTPProblem) -> tuple[int, dict[str, Any]]:
    status = 529 if problem.status == 503 else problem.status  # Anthropic's "overloaded"
    message = problem.message
    if problem.code in ("context_length_exceeded", "context_overflow"):
        # Claude Code looks for Anthropic's wording to compact the conversation.
        found = _OVERFLOW.search(message)
        if found:
            message = f"prompt is too long: {found[1]} tokens > {found[2]} maximum ({message})"
    body = {"type": "error", "error": {"type": _error_type(status), "message": message}}
    return status, body


def render_error(request: Request, problem: HTTPProblem) -> Response:
    """``problem`` as Anthropic's error response."""
    status, body = _anthropic_problem(problem)
    return JSONResponse(body, status_code=status, headers=problem.headers)


router = APIRouter(route_class=error_route(render_error))
"""The routes; the app mounts them under ``/v1``."""


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + dumps(data) + b"\n\n"


class _Blocks:
    """Parsed output → content blocks, with the stream events that build them (the same
    for a streamed and a whole answer, so both give the same blocks)."""

    def __init__(self, plan: ToolPlan | None, omit_thinking: bool = False) -> None:
        self.plan = plan
        self.omit_thinking = omit_thinking
        self.blocks: list[dict[str, Any]] = []
        self._open: str | None = None
        self._space = ""  # whitespace not yet known to belong to text

    def _start(self, block: dict[str, Any]) -> list[bytes]:
        # a block starts empty (a tool_use block with empty input) and fills with deltas
        empty = {"text": "", "thinking": "", "input": {}}
        shown = {k: empty.get(k, v) for k, v in block.items()}
        events = self._close()
        self.blocks.append(block)
        self._open = block["type"]
        index = len(self.blocks) - 1
        events.append(
            _sse(
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": shown},
            )
        )
        return events

    def _close(self) -> list[bytes]:
        if self._open is None:
            return []
        self._open = None
        index = len(self.blocks) - 1
        return [_sse("content_block_stop", {"type": "content_block_stop", "index": index})]

    def _delta(self, delta: dict[str, Any]) -> bytes:
        index = len(self.blocks) - 1
        return _sse(
            "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        )

    def add(self, parsed: Parsed) -> list[bytes]:
        """Events for the next parsed piece."""
        events: list[bytes] = []
        if parsed.thinking:
            self._space = ""
            if self._open != "thinking":
                events += self._start({"type": "thinking", "thinking": "", "signature": ""})
            if not self.omit_thinking:  # thinking.display "omitted": the block stays empty
                self.blocks[-1]["thinking"] += parsed.thinking
                delta = {"type": "thinking_delta", "thinking": parsed.thinking}
                events.append(self._delta(delta))
        if parsed.content:
            text = self._space + parsed.content
            if self._open != "text" and not text.strip():
                # Whitespace between reasoning and a call is not an answer of its own.
                self._space = text
            else:
                self._space = ""
                if self._open != "text":
                    events += self._start({"type": "text", "text": ""})
                self.blocks[-1]["text"] += text
                events.append(self._delta({"type": "text_delta", "text": text}))
        for call in parsed.calls:
            self._space = ""
            events += self._tool_use(call)
        return events

    def _tool_use(self, call: ToolCall) -> list[bytes]:
        assert self.plan is not None
        ident = self.plan.call_id(call)
        block = {"type": "tool_use", "id": ident, "name": call.name, "input": call.arguments}
        events = self._start(block)
        # Calls are parsed whole, so the input comes in one piece (as Ollama sends it).
        partial = json.dumps(call.arguments, ensure_ascii=False)
        events.append(self._delta({"type": "input_json_delta", "partial_json": partial}))
        events += self._close()
        return events

    def finish(self) -> list[bytes]:
        """Events closing the last block (an answer has at least one)."""
        events = self._close()
        if not self.blocks:
            events += self._start({"type": "text", "text": ""})
            events += self._close()
        return events

    @property
    def has_calls(self) -> bool:
        """Whether the answer holds a tool_use block."""
        return any(block["type"] == "tool_use" for block in self.blocks)


def _stop_reason(end: ReplyEnd, blocks: _Blocks) -> str:
    if blocks.has_calls:
        return "tool_use"
    return {
        "stop": "end_turn",
        "length": "max_tokens",
        "stop_sequence": "stop_sequence",
        "thinking_budget": "max_tokens",
    }[end.reason]


def _usage(end: ReplyEnd) -> dict[str, Any]:
    # Anthropic counts cached prompt tokens apart from input_tokens.
    return {
        "input_tokens": max(end.prompt_tokens - end.cached_tokens, 0),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": end.cached_tokens,
        "output_tokens": end.output_tokens,
    }


@router.post("/messages", summary="Messages (Anthropic)")
async def messages(body: MessagesRequest, request: Request, state: StateDep) -> Response:
    """Anthropic's Messages API, streamed as server-sent events when ``stream`` is true."""
    overrides: dict[str, Any] = {"num_predict": body.max_tokens}
    for key in ("temperature", "top_p", "top_k"):
        value = getattr(body, key)
        if value is not None:
            overrides[key] = value
    stops = list(body.stop_sequences or [])
    if any(not stop for stop in stops):
        raise HTTPProblem(400, "stop_sequences must not hold empty strings", param="stop_sequences")
    prepared = _prepare(state, body, overrides, stops, body.max_tokens)
    generation = await start(state, request, prepared.job)
    parser = reply_parser(
        prepared.plan, prepared.think, generation.stream.prompt_tail, prepared.stops
    )
    blocks = _Blocks(prepared.plan, prepared.omit_thinking)
    name = prepared.model.name.short
    message: dict[str, Any] = {
        "id": f"msg_{secrets.token_hex(12)}",
        "type": "message",
        "role": "assistant",
        "model": name,
    }
    pieces = read_reply(generation, parser, prepared.budget)

    if not body.stream:
        end = await collect_reply(request, pieces, blocks.add, name)
        blocks.finish()
        return JSONResponse(
            {
                **message,
                "content": blocks.blocks,
                "stop_reason": _stop_reason(end, blocks),
                "stop_sequence": end.stop_sequence,
                "usage": _usage(end),
            }
        )

    async def stream() -> AsyncIterator[bytes]:
        started = {
            **message,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": generation.prompt_tokens, "output_tokens": 0},
        }
        yield _sse("message_start", {"type": "message_start", "message": started})
        yield _sse("ping", {"type": "ping"})
        try:
            async for piece in pieces:
                if isinstance(piece, ReplyEnd):
                    for event in blocks.finish():
                        yield event
                    delta = {
                        "stop_reason": _stop_reason(piece, blocks),
                        "stop_sequence": piece.stop_sequence,
                    }
                    yield _sse(
                        "message_delta",
                        {"type": "message_delta", "delta": delta, "usage": _usage(piece)},
                    )
                    yield _sse("message_stop", {"type": "message_stop"})
                    return
                for event in blocks.add(piece):
                    yield event
            raise HTTPProblem(500, "the generation ended without a result")
        except Exception as exc:
            _, error = _anthropic_problem(problem_from(exc, name))
            yield _sse("error", error)
        finally:
            await pieces.aclose()

    return ClosingStreamingResponse(
        stream(), media_type="text/event-stream", on_close=generation.close
    )


@router.post("/messages/count_tokens", summary="Count a prompt's tokens (Anthropic)")
async def count_tokens(body: CountTokensRequest, request: Request, state: StateDep) -> Response:
    """The prompt's length in tokens: the runner renders and tokenizes it as it would for
    ``/v1/messages`` (so the model loads), then the request is cancelled before generating."""
    prepared = _prepare(state, body, {"num_predict": 1}, [], None)
    generation = await start(state, request, prepared.job)
    count = generation.prompt_tokens
    generation.close()
    return JSONResponse({"input_tokens": count})
