"""One client connection of the runner: events written in order, from the loop or the engine.

The engine thread emits one event per generated token per stream (a step's events together,
:meth:`Emitter.many`). Handed to the event loop, each step costs a wake-up of the loop's
thread (a self-pipe write, the GIL passed over, the loop's turn) before the line is written:
on a busy machine, a thread woken waits for a core, and the first token waited for it
(``relay`` in the first token's phases). So the engine thread writes token lines to the
socket itself, as llama-server's engine hands its results on, whenever nothing is waiting to
be written before them: the loop's writes and the engine's take one lock, and a line goes
straight out only while no event waits for the loop and the transport holds no unsent
bytes. Anything else (a request's last event, which the loop must see to forget the
request; a socket that is full) goes through the loop as before, and later lines queue
behind it: the order on the wire is the order of the events.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
from collections.abc import Callable

from .protocol import DoneEvent, EmbeddingEvent, ErrorEvent, Event, TokenEvent, encode

__all__ = ["Connection", "Emitter"]


class Connection:
    """One client connection: events written in order, from the loop's thread or the
    engine's (see the module's docstring)."""

    def __init__(self, writer: asyncio.StreamWriter, loop: asyncio.AbstractEventLoop) -> None:
        self.writer = writer
        self.loop = loop
        self.active: set[str] = set()
        """Requests of this connection that have not ended (cancelled if it closes)."""
        self.preparing: set[str] = set()
        """Generations whose prompt is being prepared in a worker thread."""
        self.cancelled: set[str] = set()
        """Generations cancelled while being prepared: they end as soon as preparation does."""
        self.closed = False
        """Whether the connection is gone (nothing more is written)."""
        self.direct_writes = 0
        """Writes the engine's thread made itself (for tests and curiosity)."""
        self._pending: list[Event | bytes] = []
        self._lock = threading.Lock()
        self._emitter = Emitter(self)
        self._socket = _own_socket(writer)

    def send(self, event: Event) -> None:
        """Write one event (on the loop's thread)."""
        with self._lock:
            self._write([event])

    def send_after(self, event: Event, work: Callable[[], None]) -> None:
        """Run ``work``, then write ``event``, ahead of whatever the engine emits meanwhile
        (on the loop's thread). ``work`` hands the engine a request whose events must follow
        ``event`` on the wire: the engine starts on it before this write wakes the reader
        (on a busy machine the woken reader can take the core this thread needs to hand it
        over)."""
        with self._lock:
            self._pending.append(event)  # the engine's events queue behind it
        try:
            work()
        finally:
            self._flush()

    def close(self) -> None:
        """The connection is gone: nothing more is written (on the loop's thread)."""
        with self._lock:
            self.closed = True
            if self._socket is not None:
                self._socket.close()
                self._socket = None
        self.writer.close()

    def emitter(self) -> Emitter:
        """A thread-safe callback for the engine (the same one for every job here, so the
        engine can batch a step's events per connection)."""
        return self._emitter

    def _write(self, items: list[Event | bytes]) -> None:
        """Write ``items`` through the transport (the loop's thread, the lock held)."""
        for item in items:
            if isinstance(item, DoneEvent | ErrorEvent | EmbeddingEvent):
                self.active.discard(str(item.id))
        if self.closed:
            return
        try:
            self.writer.write(b"".join([i if isinstance(i, bytes) else encode(i) for i in items]))
        except (ConnectionError, RuntimeError):
            self.closed = True

    def _flush(self) -> None:
        with self._lock:
            items, self._pending = self._pending, []
            self._write(items)

    def _emit(self, events: list[Event]) -> None:
        """Write ``events`` now on this (the engine's) thread when they may go first, else
        queue them for the loop, waking it when the queue was empty."""
        with self._lock:
            wake = not self._pending
            if wake and self._may_write_here(events):
                rest = self._write_here(events)
                if rest is None:
                    return
                self._pending.append(rest)
            else:
                self._pending += events
        if wake:
            with contextlib.suppress(RuntimeError):  # the loop is gone: the runner is exiting
                self.loop.call_soon_threadsafe(self._flush)

    def _may_write_here(self, events: list[Event]) -> bool:
        """Whether the engine's thread may write ``events`` itself (the lock held, nothing
        pending): token lines only, on an open socket whose transport has sent all it was
        given."""
        if self.closed or self._socket is None:
            return False
        transport = self.writer.transport
        if transport.is_closing() or transport.get_write_buffer_size():
            return False
        return all(event.__class__ is TokenEvent for event in events)

    def _write_here(self, events: list[Event]) -> bytes | None:
        """Send ``events`` without blocking; what the socket did not take (for the loop to
        write next), or None when it took everything."""
        data = b"".join([encode(event) for event in events])
        assert self._socket is not None
        try:
            sent = self._socket.send(data, socket.MSG_DONTWAIT)
        except BlockingIOError:
            sent = 0
        except OSError:
            return data  # the loop's write meets the same error and closes the connection
        self.direct_writes += 1
        return data[sent:] if sent < len(data) else None


class Emitter:
    """The engine's handle on a connection: ``emitter(event)`` or ``emitter.many(events)``."""

    __slots__ = ("_connection",)

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    def __call__(self, event: Event) -> None:
        """Write or queue one event (any thread)."""
        self._connection._emit([event])

    def many(self, events: list[Event]) -> None:
        """Write or queue several events, in order, with at most one wake-up of the loop (any
        thread)."""
        self._connection._emit(events)


def _own_socket(writer: asyncio.StreamWriter) -> socket.socket | None:
    """A socket object of the engine's own on the connection's socket (a duplicate of its
    file descriptor: closing the transport never leaves the engine writing to a descriptor
    that another file took over), or None where the transport has no socket."""
    raw = writer.get_extra_info("socket")
    if raw is None:
        return None
    try:
        return socket.socket(fileno=os.dup(raw.fileno()))
    except OSError:
        return None
