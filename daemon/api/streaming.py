"""Streaming responses: NDJSON (Ollama) and server-sent events (OpenAI).

Starlette's ``StreamingResponse`` already cancels the body iterator when the client
disconnects; these add a close hook that runs however the response ends (finished,
disconnected, failed, or never started), which is where a generation's slot is given back,
and a ``Server-Timing`` header sent with the first byte of the answer's first token.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterable, Callable
from typing import Any, Protocol

import orjson
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

__all__ = [
    "NDJSON",
    "ClosingStreamingResponse",
    "ServerTiming",
    "dumps",
    "ndjson_line",
    "sse_event",
]

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


class ServerTiming(Protocol):
    """What a streamed reply's ``Server-Timing`` header comes from (the request core's
    :class:`~localllm.daemon.api.core.Reply`)."""

    def first_known(self) -> bool:
        """Whether the first token has arrived (the phases before it are known)."""
        ...

    def server_timing(self) -> str:
        """The header's value, read as the first byte goes out."""
        ...


class ClosingStreamingResponse(StreamingResponse):
    """A streaming response that calls ``on_close`` when it is over, whatever happened.

    With ``timing``, the headers wait for the first chunk written after the first token
    arrived (chunks before it, such as a role-only delta, are held until then: they are
    written in the same moment) and carry ``Server-Timing``, so the phases of the first
    token are known when its first byte goes out."""

    def __init__(
        self,
        content: AsyncIterable[bytes],
        *,
        media_type: str,
        on_close: Callable[[], None] | None = None,
        headers: dict[str, str] | None = None,
        timing: ServerTiming | None = None,
    ) -> None:
        super().__init__(content, media_type=media_type, headers=headers)
        self._content = content
        self._on_close = on_close
        self._timing = timing

    async def stream_response(self, send: Send) -> None:
        """Starlette's, with the start held until the first token's chunk (see the class)."""
        timing = self._timing
        if timing is None:
            await super().stream_response(send)
            return
        held: list[bytes] = []
        started = False
        async for chunk in self.body_iterator:
            data = chunk if isinstance(chunk, bytes) else bytes(chunk)  # type: ignore[arg-type]
            if not started:
                held.append(data)
                if not timing.first_known():
                    continue
                await self._start(send, timing)
                started = True
                data, held = b"".join(held), []
            await send({"type": "http.response.body", "body": data, "more_body": True})
        if not started:  # ended before any token (nothing generated, or an error event)
            await self._start(send, timing)
            if held:
                await send(
                    {"type": "http.response.body", "body": b"".join(held), "more_body": True}
                )
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _start(self, send: Send, timing: ServerTiming) -> None:
        headers = [*self.raw_headers, (b"server-timing", timing.server_timing().encode("latin-1"))]
        await send({"type": "http.response.start", "status": self.status_code, "headers": headers})

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
