"""Anthropic's Messages API: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

Claude Code and the ``anthropic`` Python client can use a local model through these routes, as
Ollama allows. The request is decoded into the core's neutral request (:mod:`.core`: the
model's chat template renders the system prompt, the turns, ``tool_use`` / ``tool_result``
blocks and the tools); the core's reply events are encoded as ``thinking``, ``text`` and
``tool_use`` blocks.

Every field of the request is honoured or refused with a 400 naming it. The ones without an
effect on a local model say why in :class:`MessagesRequest`. Headers: ``anthropic-version``
and ``anthropic-beta`` are accepted and need nothing (there is one version of this API here).
The daemon's API key (``LOCALLLM_API_KEY``) is checked by :mod:`..security`, which reads
``Authorization: Bearer`` only: Claude Code's ``ANTHROPIC_AUTH_TOKEN`` sends that, while an
``x-api-key`` header (``ANTHROPIC_API_KEY``, the Python client's ``api_key``) is not read there.

Errors take Anthropic's shape ``{"type": "error", "error": {"type", "message"}}`` with
Anthropic's status codes (an unknown model is 404 ``not_found_error``, a full queue is 529
``overloaded_error``); an error after a stream has started is an ``event: error``.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, Literal

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from localllm.store.models import LocalModel

from ..errors import HTTPProblem, problem_from
from ..generation import resolve_model
from ..options import merge_options
from ..prompt.chat import chat_template
from ..prompt.thinking import plan_thinking
from ..prompt.tools import ToolPlan
from ..state import DaemonState, StateDep
from ..toolcalls import ToolCall
from .core import Ask, Delta, Done, Reply, Turn, plan
from .errorshapes import anthropic_error, error_route
from .streaming import ClosingStreamingResponse, dumps
from .tooling import flat_tool
from .vision import Images, no_vision

__all__ = [
    "CountTokensRequest",
    "MessagesRequest",
    "get_model",
    "list_models",
    "render_error",
    "router",
]


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
        description="Caps the reasoning: after this many tokens of it the reasoning block is "
        "closed (its close tag inserted, as llama-server does) and the answer follows. Must be "
        "below max_tokens.",
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


def _conversation(model: LocalModel, body: _Conversation, images: Images) -> list[Turn]:
    """The turns of an Anthropic conversation."""
    converted: list[Turn] = []
    system = _system(model, body.system)
    if system:
        converted.append(Turn(role="system", content=system))
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
            converted.append(Turn(role="system", content=content))
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
                Turn(
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
                converted.append(Turn(role="user", content="".join(pending)))
                pending = []
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str) or not call_id:
                raise HTTPProblem(400, f"{at}.tool_use_id is required", param=f"{at}.tool_use_id")
            converted.append(
                Turn(
                    role="tool",
                    content=_tool_result(model, block, at, images),
                    tool_call_id=call_id,
                    tool_name=names.get(call_id),
                )
            )
        if pending or not blocks:
            converted.append(Turn(role="user", content="".join(pending)))
    if body.messages[-1].role == "assistant":
        # The templates close every assistant turn, so its text cannot be continued.
        raise HTTPProblem(
            400,
            "a final assistant message (prefilling the answer) is not supported: "
            "end the conversation with a user turn",
            param=f"messages[{len(body.messages) - 1}]",
        )
    return converted


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
        tool = flat_tool(
            tool,
            where,
            _TOOL_KEYS,
            ("custom", None),
            ": Anthropic's server tools are not available here; only custom tools (name, "
            "description, input_schema)",
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


def _tool_ask(ask: Ask, body: _Conversation) -> bool:
    """The tools and ``tool_choice`` into ``ask``; whether a call is forced."""
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
    ask.tools, ask.tool_choice, ask.parallel, ask.strict = tools, choice, parallel, strict
    ask.tool_renames = _RENAMES
    return bool(tools) and (choice == "required" or isinstance(choice, dict))


# Anthropic's effort levels as reasoning levels (think values).
_EFFORT = {"low": "low", "medium": "medium", "high": "high", "xhigh": "max", "max": "max"}


def _thinking(ask: Ask, body: _Conversation, forced: bool, max_tokens: int | None) -> None:
    """``thinking`` and ``output_config.effort`` into ``ask``: the switch, the budget."""
    model = ask.model
    thinking = body.thinking
    effort = body.output_config.effort if body.output_config is not None else None
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
        ask.thinking_budget = budget
        think = True
    ask.think, ask.think_field = think, "thinking"
    if effort is None:
        return
    if think is False:
        raise HTTPProblem(
            400,
            "output_config.effort: a local model's effort is how much it reasons, and thinking "
            "is off; enable thinking (or adaptive) or leave effort out",
            param="output_config.effort",
        )
    levels = plan_thinking(chat_template(model), _EFFORT[effort], field="output_config.effort")
    if levels is None or not levels.style.takes_level:
        raise HTTPProblem(
            400,
            f"output_config.effort: {model.name.short}'s chat template has no reasoning "
            "levels; leave effort out",
            param="output_config.effort",
        )
    ask.think, ask.think_field = _EFFORT[effort], "output_config.effort"


def _ask(
    state: DaemonState, body: _Conversation, overrides: dict[str, Any], max_tokens: int | None
) -> Ask:
    model = resolve_model(state, body.model)
    ask = Ask(model=model, api="anthropic", options=merge_options(model, overrides, prefix=""))
    output_format = body.output_config.format if body.output_config is not None else None
    if output_format is not None:
        ask.format = output_format.schema_
    forced = _tool_ask(ask, body)
    _thinking(ask, body, forced, max_tokens)
    ask.images = Images(state.settings, model)
    ask.turns = _conversation(model, body, ask.images)
    return ask


# --- answer ----------------------------------------------------------------------------------


def render_error(request: Request, problem: HTTPProblem) -> Response:
    """``problem`` as Anthropic's error response."""
    status, body = anthropic_error(problem)
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

    def add(self, parsed: Delta) -> list[bytes]:
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
                    events += self._start({"type": "text", "text": "", "citations": None})
                self.blocks[-1]["text"] += text
                events.append(self._delta({"type": "text_delta", "text": text}))
        for call in parsed.calls:
            self._space = ""
            events += self._tool_use(call)
        return events

    def _tool_use(self, call: ToolCall) -> list[bytes]:
        assert self.plan is not None
        ident = self.plan.call_id(call)
        block = {
            "type": "tool_use",
            "id": ident,
            "name": call.name,
            "input": call.arguments,
            "caller": {"type": "direct"},  # the model called it (no code execution here)
        }
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
            events += self._start({"type": "text", "text": "", "citations": None})
            events += self._close()
        return events

    @property
    def has_calls(self) -> bool:
        """Whether the answer holds a tool_use block."""
        return any(block["type"] == "tool_use" for block in self.blocks)


def _stop_reason(done: Done, blocks: _Blocks) -> str:
    if blocks.has_calls and not done.cut:
        return "tool_use"
    if done.limited:
        return "max_tokens"  # the token limit, the thinking budget, or a call it cut off
    return "stop_sequence" if done.reason == "stop_sequence" else "end_turn"


def _usage(prompt: int, cached: int, output: int, thinking: int) -> dict[str, Any]:
    """Anthropic's ``usage``: cached prompt tokens apart from ``input_tokens``; nothing is
    written to a cache on request (the daemon caches every prefix on its own) and no server
    tool runs here. ``output_tokens_details.thinking_tokens``: the output tokens that were
    reasoning (a part of ``output_tokens``), as Anthropic's current API reports them."""
    return {
        "input_tokens": max(prompt - cached, 0),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "cache_creation": {"ephemeral_1h_input_tokens": 0, "ephemeral_5m_input_tokens": 0},
        "output_tokens": output,
        "output_tokens_details": {"thinking_tokens": thinking},
        "server_tool_use": {"web_fetch_requests": 0, "web_search_requests": 0},
        "service_tier": None,
        "inference_geo": None,
    }


def _done_usage(done: Done) -> dict[str, Any]:
    return _usage(done.prompt_tokens, done.cached_tokens, done.output_tokens, done.reasoning_tokens)


_DELTA_USAGE = (
    "input_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
    "output_tokens",
    "output_tokens_details",
    "server_tool_use",
)


def _overrides(body: MessagesRequest) -> dict[str, Any]:
    overrides: dict[str, Any] = {"num_predict": body.max_tokens}
    for key in ("temperature", "top_p", "top_k"):
        value = getattr(body, key)
        if value is not None:
            overrides[key] = value
    stops = list(body.stop_sequences or [])
    if any(not stop for stop in stops):
        raise HTTPProblem(400, "stop_sequences must not hold empty strings", param="stop_sequences")
    if stops:
        overrides["stop"] = stops
    return overrides


@router.post("/messages", summary="Messages (Anthropic)")
async def messages(body: MessagesRequest, request: Request, state: StateDep) -> Response:
    """Anthropic's Messages API, streamed as server-sent events when ``stream`` is true."""
    ask = _ask(state, body, _overrides(body), body.max_tokens)
    planned = plan(state, ask)
    reply = await Reply.open(state, request, planned)
    omit = body.thinking is not None and body.thinking.display == "omitted"
    blocks = _Blocks(planned.tools, omit)
    name = ask.model.name.short
    message: dict[str, Any] = {
        "id": f"msg_{secrets.token_hex(12)}",
        "type": "message",
        "role": "assistant",
        "model": name,
    }

    if not body.stream:
        (whole,) = await reply.whole(request)
        blocks.add(Delta(whole.content, whole.thinking, whole.calls))
        blocks.finish()
        return JSONResponse(
            {
                **message,
                "content": blocks.blocks,
                "stop_reason": _stop_reason(whole.done, blocks),
                "stop_sequence": whole.done.stop_sequence,
                "stop_details": None,
                "container": None,
                "usage": _done_usage(whole.done),
            },
            headers=reply.timing_headers(whole.done),
        )

    async def stream() -> AsyncIterator[bytes]:
        started = {
            **message,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "stop_details": None,
            "container": None,
            "usage": _usage(reply.prompt_tokens, 0, 0, 0),
        }
        yield _sse("message_start", {"type": "message_start", "message": started})
        yield _sse("ping", {"type": "ping"})
        try:
            async for _, event in reply.events():
                if isinstance(event, Done):
                    for out in blocks.finish():
                        yield out
                    delta = {
                        "stop_reason": _stop_reason(event, blocks),
                        "stop_sequence": event.stop_sequence,
                        "stop_details": None,
                        "container": None,
                    }
                    # the final counts, cumulative as Anthropic sends them
                    usage = {k: v for k, v in _done_usage(event).items() if k in _DELTA_USAGE}
                    yield _sse(
                        "message_delta",
                        {"type": "message_delta", "delta": delta, "usage": usage},
                    )
                    yield _sse("message_stop", {"type": "message_stop"})
                    return
                for out in blocks.add(event):
                    yield out
        except Exception as exc:
            _, error = anthropic_error(problem_from(exc, name))
            yield _sse("error", error)

    return ClosingStreamingResponse(
        stream(), media_type="text/event-stream", on_close=reply.close, timing=reply
    )


@router.post("/messages/count_tokens", summary="Count a prompt's tokens (Anthropic)")
async def count_tokens(body: CountTokensRequest, request: Request, state: StateDep) -> Response:
    """The prompt's length in tokens: the runner renders and tokenizes it as it would for
    ``/v1/messages`` (so the model loads), then the request is cancelled before generating."""
    ask = _ask(state, body, {"num_predict": 1}, None)
    reply = await Reply.open(state, request, plan(state, ask))
    count = reply.prompt_tokens
    reply.close()
    return JSONResponse({"input_tokens": count})


# --- models --------------------------------------------------------------------------------


def _model_info(model: LocalModel) -> dict[str, Any]:
    """A local model as Anthropic's ``ModelInfo``: its name as id and display name, its
    training context as ``max_input_tokens`` (the daemon's own context may be smaller)."""
    try:
        context = model.info.context_length
    except Exception:  # a model whose GGUF cannot be read still lists
        context = None
    created = datetime.fromtimestamp(model.entry.modified, UTC)
    return {
        "type": "model",
        "id": model.name.short,
        "display_name": model.name.short,
        "created_at": created.isoformat().replace("+00:00", "Z"),
        "capabilities": None,  # Anthropic's capability names (batch, pdf_input...) are not ours
        "max_input_tokens": context,
        "max_tokens": None,
    }


def _page_size(value: str | None) -> int:
    if value is None:
        return 20
    if not value.isdigit() or not 1 <= int(value) <= 1000:
        raise HTTPProblem(400, "limit: must be an integer from 1 to 1000", param="limit")
    return int(value)


async def list_models(request: Request, state: DaemonState) -> Response:
    """``GET /v1/models`` for a client that sends ``anthropic-version`` (Anthropic's SDK):
    Anthropic's list shape, newest first, paged by ``limit``, ``after_id`` and
    ``before_id`` as Anthropic pages it."""
    try:
        params = request.query_params
        unknown = sorted(set(params) - {"limit", "after_id", "before_id"})
        if unknown:
            raise HTTPProblem(400, f"{unknown[0]}: unknown query parameter", param=unknown[0])
        limit = _page_size(params.get("limit"))
        entries = await run_in_threadpool(state.store.list)
        infos = [_model_info(LocalModel(entry=e, store=state.store)) for e in entries]
        ids = [info["id"] for info in infos]
        after, before = params.get("after_id"), params.get("before_id")
        for key, value in (("after_id", after), ("before_id", before)):
            if value is not None and value not in ids:
                raise HTTPProblem(404, f"{key}: no model {value!r}", param=key)
        if before is not None:
            infos = infos[: ids.index(before)]
            page, more = infos[-limit:], len(infos) > limit
        else:
            infos = infos[ids.index(after) + 1 :] if after is not None else infos
            page, more = infos[:limit], len(infos) > limit
        return JSONResponse(
            {
                "data": page,
                "has_more": more,
                "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None,
            }
        )
    except HTTPProblem as exc:
        return render_error(request, exc)


async def get_model(request: Request, state: DaemonState, model_id: str) -> Response:
    """``GET /v1/models/{id}`` for Anthropic's SDK: one ``ModelInfo``, or its 404."""
    try:
        return JSONResponse(_model_info(resolve_model(state, model_id)))
    except Exception as exc:
        return render_error(request, problem_from(exc))
