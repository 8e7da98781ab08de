"""A chat's branch on screen written out: Markdown to read, or JSON in the OpenAI messages
shape (``{"model", "messages": [...]}``, what ``/v1/chat/completions`` takes) to send again."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from .model import Attachment, Chat

__all__ = ["EXPORT_FORMATS", "export_chat", "to_markdown", "to_openai"]

EXPORT_FORMATS = ("md", "json")
"""What :func:`export_chat` writes: Markdown or OpenAI's messages as JSON."""

# The first bytes of the image formats the daemon takes (localllm.images), for data URLs.
_MAGIC = (
    (b"\x89PNG", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF8", "image/gif"),
    (b"BM", "image/bmp"),
)


def _mime(image: Attachment) -> str:
    try:
        head = base64.b64decode(image.data[:16], validate=False)
    except (binascii.Error, ValueError):
        head = b""
    return next((mime for magic, mime in _MAGIC if head.startswith(magic)), "image/png")


def to_openai(chat: Chat) -> dict[str, Any]:
    """The branch on screen as OpenAI chat messages: the system prompt, questions (with
    their images as data URLs), answers (with their tool calls) and tool results."""
    messages: list[dict[str, Any]] = (
        [{"role": "system", "content": chat.system}] if chat.system.strip() else []
    )
    for message in chat.messages:
        if message.role == "user":
            content: Any = message.content
            if message.images:
                content = [{"type": "text", "text": message.content}] + [
                    {
                        "type": "image_url",
                        "image_url": {"url": f"data:{_mime(image)};base64,{image.data}"},
                    }
                    for image in message.images
                ]
            messages.append({"role": "user", "content": content})
        elif message.role == "assistant":
            item: dict[str, Any] = {"role": "assistant", "content": message.content}
            calls = (message.tool or {}).get("calls") or []
            if calls:
                item["tool_calls"] = [_openai_call(call, i) for i, call in enumerate(calls)]
            messages.append(item)
        elif message.role == "tool":
            tool = message.tool or {}
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": str(tool.get("call_id", "")),
                    "content": message.content,
                }
            )
    return {"model": chat.model, "messages": messages}


def _openai_call(call: dict[str, Any], index: int) -> dict[str, Any]:
    """An Ollama tool call (arguments as an object) as OpenAI's (arguments as a string)."""
    function = call.get("function", {})
    arguments = function.get("arguments", {})
    return {
        "id": str(call.get("id") or f"call_{index}"),
        "type": "function",
        "function": {
            "name": function.get("name", ""),
            "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
        },
    }


def to_markdown(chat: Chat) -> str:
    """The branch on screen as Markdown: the title, model and system prompt, then each
    message under its author's heading."""
    lines = [f"# {chat.title}", "", f"Model: `{chat.model or '-'}`", ""]
    if chat.system.strip():
        lines += ["## System prompt", "", chat.system.strip(), ""]
    for message in chat.messages:
        if message.role == "user":
            lines += ["## You", ""]
            lines += [f"*Image: {image.name}*" for image in message.images]
            lines += [message.content, ""]
        elif message.role == "assistant":
            calls = (message.tool or {}).get("calls") or []
            if not message.content and not calls:
                continue
            lines += [f"## {message.model or chat.model or 'Assistant'}", ""]
            if message.content:
                lines += [message.content, ""]
            for call in calls:
                function = call.get("function", {})
                arguments = json.dumps(function.get("arguments", {}), ensure_ascii=False)
                lines += [f"*Calls `{function.get('name', '?')}` with `{arguments}`*", ""]
        elif message.role == "tool":
            name = (message.tool or {}).get("name", "tool")
            lines += [f"### Result of `{name}`", "", "```", message.content, "```", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def export_chat(chat: Chat, form: str) -> str:
    """The chat's branch on screen as ``md`` (Markdown) or ``json`` (OpenAI messages)."""
    if form == "json":
        return json.dumps(to_openai(chat), indent=2, ensure_ascii=False) + "\n"
    if form == "md":
        return to_markdown(chat)
    raise ValueError(f"export format must be one of {', '.join(EXPORT_FORMATS)}, not {form!r}")
