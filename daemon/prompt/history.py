"""The conversation as chat templates read it (Hugging Face's ``apply_chat_template``
convention): the system prompt and the model's ``MESSAGE`` examples first, then the request's
turns with an assistant's calls (arguments as objects), a tool result's call id and tool name,
and an assistant's earlier reasoning; call ids in the shape the template insists on. A prompt
that continues an earlier exchange (``context``) is rendered here (:func:`continuation`).
"""

from __future__ import annotations

import hashlib
import json
import string
from collections.abc import Sequence
from typing import Any, Protocol

from ..errors import HTTPProblem
from .chat import ChatTemplate
from .template import TemplateRenderError, render_chat
from .tools import ToolPlan

__all__ = ["PromptTurn", "continuation", "conversation", "history_tool_calls", "map_call_id"]

_ALNUM = string.ascii_letters + string.digits


def _problem(message: str, param: str, code: str = "invalid_field") -> HTTPProblem:
    return HTTPProblem(400, message, param=param, code=code)


class PromptTurn(Protocol):
    """One message of a conversation, as the prompt reads it (the core's ``Turn``)."""

    @property
    def role(self) -> str: ...
    @property
    def content(self) -> str: ...
    @property
    def thinking(self) -> str | None: ...
    @property
    def tool_calls(self) -> list[dict[str, Any]] | None: ...
    @property
    def tool_name(self) -> str | None: ...
    @property
    def tool_call_id(self) -> str | None: ...


def conversation(
    chat: ChatTemplate,
    turns: Sequence[PromptTurn] | None,
    system: str | None,
    tools: ToolPlan | None,
    *,
    prompt: str = "",
) -> list[dict[str, Any]]:
    """The conversation the runner renders: the system prompt (the request's, else the
    model's SYSTEM unless the turns hold one), the model's MESSAGEs, then the turns (None:
    ``prompt`` as one user turn).

    Calls and tool results keep the fields chat templates read: an assistant's
    ``tool_calls`` with arguments as objects, a tool result's ``tool_call_id`` and its tool's
    ``name`` (and Ollama's ``tool_name``), an assistant's reasoning as ``reasoning_content``
    (what Qwen3's and DeepSeek's templates read) and ``thinking`` (Ollama's name)."""
    if turns is None:
        items: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
        has_system = False
    else:
        items = [_turn(index, turn, tools) for index, turn in enumerate(turns)]
        has_system = any(turn.role == "system" for turn in turns)
    out: list[dict[str, Any]] = []
    system_text = system if system is not None else chat.system
    if system_text and not has_system:
        out.append({"role": "system", "content": system_text})
    for example in chat.examples:
        out.append(
            {"role": str(example.get("role", "user")), "content": example.get("content", "")}
        )
    return out + items


# The runner's template for a model that has none (its prepare() falls back to the same).
_PLAIN_TEMPLATE = "{% for message in messages %}{{ message['content'] }}\n\n{% endfor %}"


def continuation(
    chat: ChatTemplate, system: str | None, prompt: str, switches: dict[str, Any]
) -> str:
    """The templated prompt of a request that continues ``context``, with the template
    variables ``switches`` (the reasoning's).

    Ollama renders the new prompt and puts it after the context's tokens; the runner takes
    ``context`` only before a prompt it does not template, so the template is rendered here
    (in the same sandbox the runner uses). The model's default system prompt was part of
    the earlier exchange and is not repeated; a ``system`` in the request is. The prompt
    continues a sequence, so the template's BOS text is left out (``bos_token`` is empty).
    """
    messages: list[dict[str, Any]] = []
    if system:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": prompt})
    try:
        return render_chat(
            chat.rendered or chat.effective or _PLAIN_TEMPLATE,
            messages,
            add_generation_prompt=True,
            extra=switches,
        )
    except TemplateRenderError as exc:
        raise HTTPProblem(400, str(exc), param="template") from None


def _turn(index: int, turn: PromptTurn, tools: ToolPlan | None) -> dict[str, Any]:
    item: dict[str, Any] = {"role": turn.role.lower(), "content": turn.content}
    if turn.thinking:
        item["reasoning_content"] = turn.thinking
        item["thinking"] = turn.thinking
    if turn.tool_calls:
        item["tool_calls"] = history_tool_calls(
            turn.tool_calls, f"messages[{index}].tool_calls", tools
        )
    if turn.tool_name:
        item["tool_name"] = turn.tool_name
        item["name"] = turn.tool_name
    if turn.tool_call_id:
        item["tool_call_id"] = map_call_id(turn.tool_call_id, tools)
    return item


def _arguments(value: Any, where: str) -> dict[str, Any]:
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise _problem(f"{where} is not valid JSON", where) from None
    if not isinstance(value, dict):
        raise _problem(f"{where} must be a JSON object", where)
    return value


def _mistral_id(value: str) -> str:
    """Any call id as the 9 letters and digits Mistral templates require (stable per id)."""
    if len(value) == 9 and value.isalnum():
        return value
    digest = int.from_bytes(hashlib.sha256(value.encode()).digest()[:8], "big")
    out = []
    for _ in range(9):
        digest, rest = divmod(digest, len(_ALNUM))
        out.append(_ALNUM[rest])
    return "".join(out)


def history_tool_calls(
    calls: Sequence[Any], where: str, plan: ToolPlan | None
) -> list[dict[str, Any]]:
    """An assistant message's calls as templates read them: ``{"id", "type": "function",
    "function": {"name", "arguments": {...}}}`` (Ollama sends arguments as an object, OpenAI
    as a JSON string; templates write them with ``tojson``, so they get the object)."""
    out = []
    for index, call in enumerate(calls):
        at = f"{where}[{index}]"
        if not isinstance(call, dict):
            raise _problem(f"{at} must be an object", at)
        function = call.get("function")
        if not isinstance(function, dict):
            raise _problem(f"{at}.function must be an object", f"{at}.function")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise _problem(f"{at}.function.name is required", f"{at}.function.name")
        item: dict[str, Any] = {
            "type": "function",
            "function": {
                "name": name,
                "arguments": _arguments(function.get("arguments"), f"{at}.function.arguments"),
            },
        }
        call_id = call.get("id")
        if isinstance(call_id, str) and call_id:
            item["id"] = map_call_id(call_id, plan)
        out.append(item)
    return out


def map_call_id(call_id: str, plan: ToolPlan | None) -> str:
    """A call id from the history as the template needs it."""
    return _mistral_id(call_id) if plan is not None and plan.mistral_ids else call_id
