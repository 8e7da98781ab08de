"""uvicorn's HTTP protocol, with a response's head written together with its first body bytes.

uvicorn writes an answer's status line and headers as soon as the app starts the response,
and each body part as it comes: two writes (two packets, two wake-ups of the client) where
one would do. For a streamed generation the head goes out with the first token (see
:class:`~.api.streaming.ClosingStreamingResponse`), so the first token's bytes followed its
head by a second write; the client, woken for the head alone, had gone back to wait for them.
Here the head is held until the next write on the connection, which takes it along, or until
the event loop's next turn, whichever comes first: the order of the bytes is unchanged, and
a head whose body is not ready in the same turn leaves as it did.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from .firsttoken import ARRIVAL

__all__ = ["HeldHeadTransport", "protocol_class"]


def _is_head(data: bytes) -> bool:
    """Whether ``data`` is a response's status line and headers, as uvicorn writes them (in
    one write: both its protocols do)."""
    return data.startswith(b"HTTP/1.1 ") and data.endswith(b"\r\n\r\n")


class HeldHeadTransport:
    """A connection's transport whose response heads wait for the next write (or the loop's
    next turn); everything else is the transport's own."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Write ``data`` after a held head, or hold it when it is a head."""
        if self._held is not None:
            held, self._held = self._held, None
            self._transport.write(held + bytes(data))
        elif isinstance(data, bytes) and _is_head(data):
            self._held = data
            self._loop.call_soon(self._flush)
        else:
            self._transport.write(data)

    def writelines(self, list_of_data: Any) -> None:
        """Write each of ``list_of_data`` in order."""
        self.write(b"".join(list_of_data))

    def _flush(self) -> None:
        """Write a head still held (no body followed it in the same turn)."""
        if self._held is not None:
            held, self._held = self._held, None
            if not self._transport.is_closing():
                self._transport.write(held)

    def close(self) -> None:
        """Write what is held, then close."""
        self._flush()
        self._transport.close()

    def write_eof(self) -> None:
        """Write what is held, then the end of the stream."""
        self._flush()
        self._transport.write_eof()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def protocol_class() -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (httptools, a dependency, where it imports; else h11, as
    ``http="auto"`` picks) writing through :class:`HeldHeadTransport`."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    except ImportError:  # pragma: no cover - httptools is a dependency
        from uvicorn.protocols.http.h11_impl import H11Protocol as base  # type: ignore[assignment]

    class HeldHeadProtocol(base):  # type: ignore[misc,valid-type]
        """uvicorn's protocol, its writes through :class:`HeldHeadTransport`."""

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(HeldHeadTransport(transport, self.loop))

        if hasattr(base, "on_message_begin"):  # httptools: a request's first bytes parsed

            def on_message_begin(self) -> None:
                super().on_message_begin()
                # The first token's clock starts here, not where the app is called: uvicorn's
                # parsing, its task for the request and the framework's outer layers come
                # between (~0.25 ms after an idle gap), and they are part of ``parse``.
                self.scope[ARRIVAL] = time.perf_counter_ns()

    return HeldHeadProtocol
