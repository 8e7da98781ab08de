"""The daemon's HTTP servers: httptools, and no Nagle's algorithm on TCP connections.

Every streamed token leaves the daemon as one HTTP chunk; uvicorn's httptools protocol does
that work in C where h11 does it in Python (the daemon's CPU per streamed token measured 172
against 211 us). httptools is a declared dependency, and uvicorn only picks it when it
imports, so a broken install would silently fall back: this checks the pick.

A response leaves in several writes (headers with the first body bytes, each later chunk).
With Nagle's algorithm on, a write waits for the ACK of the one before, which the client
delays: every request after a kept-alive connection's first took 40 ms more
(``GET /api/version``: 44 ms, 1.3 ms without). The head waits for the body bytes written in
the same turn of the event loop, no longer (``daemon/httphead.py``).
"""

from __future__ import annotations

import asyncio
import inspect
import socket
import time
from typing import Any

from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from localllm.daemon.app import create_app
from localllm.daemon.server import _config, _Server, _tcp_socket
from localllm.daemon.state import DaemonState
from localllm.settings import Settings


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An ASGI app that is never called: only the configuration is loaded."""


def test_the_daemon_serves_http_with_httptools(settings: Settings) -> None:
    config = _config(_app, settings)
    config.load()
    assert issubclass(config.http_protocol_class, HttpToolsProtocol)


async def _hello(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An ASGI app answering every request with a two-part body."""
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"hel", "more_body": True})
    await send({"type": "http.response.body", "body": b"lo"})


def test_the_daemons_tcp_connections_send_without_waiting_for_acks(settings: Settings) -> None:
    async def main() -> list[int]:
        sock = _tcp_socket("127.0.0.1", 0)
        config = _config(_hello, settings)
        config.load()
        server = _Server(config)
        server.lifespan = config.lifespan_class(config)
        await server.startup(sockets=[sock])  # what serve() does, without its main loop
        try:
            reader, writer = await asyncio.open_connection(*sock.getsockname())
            writer.write(b"GET / HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
            assert (await reader.readuntil(b"\r\n0\r\n\r\n")).startswith(b"HTTP/1.1 200")
            # The server's side of this connection, as uvicorn's protocol holds it.
            options = [
                connection.transport.get_extra_info("socket").getsockopt(
                    socket.IPPROTO_TCP, socket.TCP_NODELAY
                )
                for connection in server.server_state.connections
            ]
            writer.close()
            return options
        finally:
            await server.shutdown(sockets=[sock])
            sock.close()

    options = asyncio.run(main())
    assert options, "the server held no connection"
    assert all(options), f"Nagle's algorithm is on for the daemon's TCP connections: {options}"


def _routes(routes: list[Any]) -> list[APIRoute]:
    """Every API route, those of included routers too."""
    found: list[APIRoute] = []
    for route in routes:
        if isinstance(route, APIRoute):
            found.append(route)
        included = getattr(route, "original_router", None)
        if included is not None:
            found += _routes(included.routes)
    return found


def _calls(dependant: Dependant) -> list[Any]:
    return [call for sub in dependant.dependencies for call in (sub.call, *_calls(sub))]


def test_no_route_hops_to_a_thread_before_it_starts(settings: Settings) -> None:
    # FastAPI runs a plain function (a route or a dependency) in its thread pool: a thread
    # wake-up and its GIL hand-offs on every request's way in, before any work starts.
    app = create_app(settings, DaemonState.create(settings))
    routes = _routes(app.routes)
    assert len(routes) > 40
    threaded = {
        f"{route.path}: {getattr(call, '__qualname__', call)}"
        for route in routes
        for call in (route.endpoint, *_calls(route.dependant))
        if not inspect.iscoroutinefunction(call)
    }
    assert not threaded


def _serve(app: Any, settings: Settings, client: Any) -> Any:
    """Run ``client(host, port, server)`` against ``app`` served as the daemon serves it."""

    async def main() -> Any:
        sock = _tcp_socket("127.0.0.1", 0)
        config = _config(app, settings)
        config.load()
        server = _Server(config)
        server.lifespan = config.lifespan_class(config)
        await server.startup(sockets=[sock])
        try:
            return await client(*sock.getsockname(), server)
        finally:
            await server.shutdown(sockets=[sock])
            sock.close()

    return asyncio.run(main())


async def _writes_of_the_next_connection(
    host: str, port: int, server: _Server
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, list[bytes]]:
    """A connection to ``server`` and the list of what the server writes to its socket."""
    reader, writer = await asyncio.open_connection(host, port)
    while not server.server_state.connections:
        await asyncio.sleep(0.01)
    (connection,) = server.server_state.connections
    socket_transport = connection.transport._transport  # under the held head's wrapper
    writes: list[bytes] = []
    write = socket_transport.write

    def recorded(data: bytes) -> None:
        writes.append(bytes(data))
        write(data)

    socket_transport.write = recorded
    return reader, writer, writes


def test_a_response_head_leaves_with_its_first_body_bytes(settings: Settings) -> None:
    # A streamed answer starts with its first token: head and token in one write, so the
    # client is woken once for both instead of once for the head alone.
    async def client(host: str, port: int, server: _Server) -> list[bytes]:
        reader, writer, writes = await _writes_of_the_next_connection(host, port, server)
        writer.write(b"GET / HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        await reader.readuntil(b"\r\n0\r\n\r\n")
        writer.close()
        return writes

    writes = _serve(_hello, settings, client)
    assert writes[0].startswith(b"HTTP/1.1 200") and writes[0].endswith(b"\r\n\r\n3\r\nhel\r\n")
    assert b"".join(writes[1:]) == b"2\r\nlo\r\n0\r\n\r\n"


def test_a_head_whose_body_is_not_ready_leaves_alone(settings: Settings) -> None:
    # The head waits for body bytes of the same turn only: an answer whose body comes later
    # has its head at the client before then.
    head_read = asyncio.Event()

    async def later(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await head_read.wait()  # the client has the head, with no body sent yet
        await send({"type": "http.response.body", "body": b"late"})

    async def client(host: str, port: int, server: _Server) -> tuple[bytes, bytes]:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET / HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        async with asyncio.timeout(10):
            head = await reader.readuntil(b"\r\n\r\n")
            head_read.set()
            body = await reader.readuntil(b"0\r\n\r\n")
        writer.close()
        return head, body

    head, body = _serve(later, settings, client)
    assert head.startswith(b"HTTP/1.1 200") and b"late" in body


def test_a_requests_arrival_is_stamped_as_its_first_bytes_are_parsed(settings: Settings) -> None:
    # The first token's clock (Server-Timing's parse) starts before uvicorn builds the request
    # and the app's layers run, not where the app is first called.
    from localllm.daemon.firsttoken import ARRIVAL

    seen: list[tuple[int | None, int]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append((scope.get(ARRIVAL), time.perf_counter_ns()))
        await _hello(scope, receive, send)

    async def client(host: str, port: int, server: _Server) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        for _ in range(2):  # a kept-alive connection's second request is stamped anew
            sent = time.perf_counter_ns()
            writer.write(b"GET / HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
            async with asyncio.timeout(10):
                await reader.readuntil(b"\r\n0\r\n\r\n")
            seen.append((sent, 0))
        writer.close()

    _serve(app, settings, client)
    (first, called_first), (sent_first, _), (second, called_second), (sent_second, _) = seen
    assert first is not None and second is not None
    assert sent_first < first < called_first < sent_second < second < called_second
