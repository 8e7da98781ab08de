"""Streaming responses: NDJSON (Ollama) and server-sent events (OpenAI).

Starlette's ``StreamingResponse`` already cancels the body iterator when the client
disconnects; these add a close hook that runs however the response ends (finished,
disconnected, failed, or never started), which is where a generation's slot is given back.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterable, Callable
from typing import Any

import orjson
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

__all__ = ["NDJSON", "ClosingStreamingResponse", "dumps", "ndjson_line", "sse_event"]

NDJSON = "application/x-ndjson"


def dumps(data: Any) -> bytes:
    """Compact UTF-8 JSON: orjson (every streamed chunk goes through here), or the standard
    library for what orjson refuses (a lone surrogate in text, integers over 64 bits,
    non-string keys); a lone surrogate comes out escaped, as JSON allows."""
    try:
        return orjson.dumps(data)
    except TypeError:  # orjson.JSONEncodeError is one
        return json.dumps(data, separators=(",", ":")).encode()


def ndjson_line(data: Any) -> bytes:
    """One NDJSON line."""
    return dumps(data) + b"\n"


def sse_event(data: Any) -> bytes:
    """One server-sent event carrying JSON (or the literal ``[DONE]``)."""
    if isinstance(data, str):
        return f"data: {data}\n\n".encode()
    return b"data: " + dumps(data) + b"\n\n"


class ClosingStreamingResponse(StreamingResponse):
    """A streaming response that calls ``on_close`` when it is over, whatever happened."""

    def __init__(
        self,
        content: AsyncIterable[bytes],
        *,
        media_type: str,
        on_close: Callable[[], None] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(content, media_type=media_type, headers=headers)
        self._content = content
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            # A disconnect can cancel the response while the generator sits at a yield;
            # close it now rather than whenever it is garbage-collected, so the runner
            # stops generating for nobody.
            aclose = getattr(self._content, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
            if self._on_close is not None:
                self._on_close()
