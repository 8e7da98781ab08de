"""A tool's result as the model gets it: the text of its content blocks (embedded text
resources included, structured content when there is no text), images as images for a model
that sees (named in the text otherwise), everything past ``LOCALLLM_MCP_MAX_RESULT``
characters cut with a note that says how much was left out. The same note reaches the
person, so neither is told a cut result was whole."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ToolOutcome", "format_size", "outcome_from_blocks", "outcome_from_result"]


@dataclass
class ToolOutcome:
    """What one call gave back."""

    text: str
    """The text the model gets (a cut note included)."""
    images: list[str] = field(default_factory=list)
    """Images (base64) the model gets with it (only for a model that sees)."""
    is_error: bool = False
    """The tool reported a failure (or the call could not be made)."""
    cut: int = 0
    """Characters left out of :attr:`text`."""
    total: int = 0
    """Characters the tool sent."""
    notes: list[str] = field(default_factory=list)
    """What the host changed (cut text, images a model cannot see), for the person."""


def format_size(count: int) -> str:
    """``2,048`` / ``3.1 M``: a number of characters, short."""
    if count >= 1 << 20:
        return f"{count / (1 << 20):.1f} M"
    return f"{count:,}"


def _image_note(mime: str, data: str) -> str:
    size = len(data) * 3 // 4
    return f"[an image ({mime}, {format_size(size)} bytes) that this model cannot see]"


def outcome_from_blocks(
    blocks: list[Any], *, limit: int, vision: bool, is_error: bool = False, structured: Any = None
) -> ToolOutcome:
    """The outcome of MCP content ``blocks`` (text, image, audio, resource, resource link)."""
    texts: list[str] = []
    images: list[str] = []
    notes: list[str] = []
    for block in blocks:
        kind = getattr(block, "type", None)
        if kind == "text":
            texts.append(block.text)
        elif kind == "image":
            if vision:
                images.append(block.data)
            else:
                texts.append(_image_note(block.mime_type, block.data))
                notes.append("an image was left out: this model cannot see images")
        elif kind == "resource":
            resource = block.resource
            text = getattr(resource, "text", None)
            if text is not None:
                texts.append(f"[{resource.uri}]\n{text}")
            else:
                texts.append(f"[{resource.uri}: {resource.mime_type or 'binary'} data]")
        elif kind == "resource_link":
            texts.append(f"[resource: {block.uri}{f' ({block.name})' if block.name else ''}]")
        elif kind == "audio":
            texts.append(f"[audio ({block.mime_type}) that this model cannot hear]")
        else:
            texts.append(f"[a {kind} block]")
    if not texts and not images and structured is not None:
        texts.append(json.dumps(structured, ensure_ascii=False))
    text = "\n".join(texts)
    total = len(text)
    cut = 0
    if total > limit:
        cut = total - limit
        note = (
            f"[cut: the tool returned {format_size(total)} characters; the first "
            f"{format_size(limit)} are kept, {format_size(cut)} left out]"
        )
        text = text[:limit] + "\n" + note
        notes.append(note.strip("[]"))
    return ToolOutcome(text, images, is_error, cut, total, notes)


def outcome_from_result(result: Any, *, limit: int, vision: bool) -> ToolOutcome:
    """The outcome of an MCP ``CallToolResult``."""
    return outcome_from_blocks(
        list(result.content or []),
        limit=limit,
        vision=vision,
        is_error=bool(result.is_error),
        structured=getattr(result, "structured_content", None),
    )
