"""The daemon's side of a runner's socket: its lines handled as their bytes arrive.

A runner writes NDJSON lines (a step's events, one per stream, together). The daemon read
them in a task of its own (``await reader.read()``): every token event waited for that task's
turn of the event loop after the bytes had arrived, before it could be routed to its
request, which then waited for another turn (its generation's reader), and another (the
HTTP answer): on the first token's way back, each turn took 40-50 us after an idle gap.
:class:`LineProtocol` hands the bytes to a sink in the event loop's own callback instead;
:class:`LineSplitter` cuts them into whole lines, keeping a partial one for the next bytes.
The end of the connection (and any error) still reaches the stream reader, which the
client's task waits on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

__all__ = ["LineProtocol", "LineSplitter", "open_lines"]


class LineSplitter:
    """Bytes in (:meth:`feed`), whole lines out to ``route`` (without their newline); a line
    still incomplete is kept for the next bytes, and one longer than ``limit`` bytes raises
    ``ValueError``."""

    def __init__(self, route: Callable[[bytes], None], limit: int) -> None:
        self._route = route
        self._limit = limit
        self._partial: list[bytes] = []
        self._partial_size = 0

    def feed(self, data: bytes) -> None:
        """Route every line ``data`` completes."""
        end = data.rfind(b"\n")
        if end < 0:
            self._partial.append(data)
            self._partial_size += len(data)
            if self._partial_size > self._limit:
                raise ValueError(f"a message longer than {self._limit} bytes")
            return
        if self._partial:
            data = b"".join([*self._partial, data])
            end += self._partial_size
            self._partial, self._partial_size = [], 0
        if end + 1 < len(data):
            self._partial, self._partial_size = [data[end + 1 :]], len(data) - end - 1
        for line in data[:end].split(b"\n"):
            self._route(line)

    def end(self) -> None:
        """The bytes are over: route what is left of a last line without its newline."""
        if self._partial:
            rest, self._partial, self._partial_size = b"".join(self._partial), [], 0
            self._route(rest)


class LineProtocol(asyncio.StreamReaderProtocol):
    """A stream's protocol whose received bytes go to a sink (:meth:`attach`) as they arrive,
    rather than into the stream reader; the end of the connection and its errors reach the
    reader as before. Bytes that arrive before the sink is attached are kept and handed to it
    first, so the order of the lines never depends on when it was attached. A sink that
    raises ends the connection: the error is kept in :attr:`error` and the reader sees the
    end."""

    error: Exception | None = None
    """What the sink raised, if it did (the connection was aborted)."""
    _sink: Callable[[bytes], None] | None = None
    _early: list[bytes] | None = None
    _connection: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Keep the transport (to abort it when the sink fails)."""
        self._connection = transport
        super().connection_made(transport)

    def attach(self, sink: Callable[[bytes], None]) -> None:
        """Hand every received byte to ``sink`` from now on, what arrived before first."""
        self._sink = sink
        early, self._early = self._early or [], None
        for data in early:
            self.data_received(data)

    def data_received(self, data: bytes) -> None:
        """Hand ``data`` to the sink (or keep it until one is attached)."""
        if self.error is not None:
            return
        sink = self._sink
        if sink is None:
            self._early = self._early or []
            self._early.append(data)
            return
        try:
            sink(data)
        except Exception as exc:
            self.error = exc
            if isinstance(self._connection, asyncio.Transport):
                self._connection.abort()


async def open_lines(
    path: str | Path, limit: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, LineProtocol]:
    """A Unix-socket connection, as ``asyncio.open_unix_connection`` makes it, with a
    :class:`LineProtocol`."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=limit, loop=loop)
    protocol = LineProtocol(reader, loop=loop)
    transport, _ = await loop.create_unix_connection(lambda: protocol, str(path))
    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    return reader, writer, protocol
