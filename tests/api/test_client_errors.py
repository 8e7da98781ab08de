"""``localllm.client``'s contract without a daemon: both clients offer the same methods, and
every transport failure surfaces as a documented error, sync and async, also mid-stream.

The misbehaving peers are real loopback sockets: one that takes connections and never
answers, one that cuts a stream after its first line, one that answers something that is not
localllm. Each test is bounded by a short client timeout, not by sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from localllm import APIError, DaemonUnavailableError
from localllm._exceptions import DaemonTimeoutError
from localllm.client import AsyncClient, Client

# -- the same methods on both clients ----------------------------------------------------------


def _public(cls: type) -> dict[str, Any]:
    return {
        name: member
        for name, member in vars(cls).items()
        if not name.startswith("_") and (callable(member) or isinstance(member, property))
    }


def test_client_and_async_client_have_the_same_methods_and_signatures() -> None:
    sync, asynchronous = _public(Client), _public(AsyncClient)
    assert sorted(sync) == sorted(asynchronous)
    assert len(sync) > 30  # every route, not an accidentally empty comparison
    for name, method in sync.items():
        twin = asynchronous[name]
        if isinstance(method, property):
            assert isinstance(twin, property), name
            continue
        one, other = inspect.signature(method), inspect.signature(twin)
        assert list(one.parameters.values()) == list(other.parameters.values()), name
        streams = inspect.isgeneratorfunction(method)
        if streams:
            assert inspect.isasyncgenfunction(twin), f"{name} should be an async iterator"
            expected = str(one.return_annotation).replace("Iterator[", "AsyncIterator[")
        else:
            assert inspect.iscoroutinefunction(twin), f"{name} should be a coroutine"
            expected = one.return_annotation
        assert other.return_annotation == expected, name
    assert inspect.signature(Client.__init__) == inspect.signature(AsyncClient.__init__)


# -- loopback peers ----------------------------------------------------------------------------


def _read_request(conn: socket.socket) -> bytes:
    """One HTTP request's head and body (by Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head


@contextlib.contextmanager
def _peer(handle: Callable[[socket.socket], None] | None) -> Iterator[str]:
    """A loopback TCP server; yields its URL. Each connection goes to ``handle`` in a thread;
    with ``handle=None`` connections are completed by the kernel and never accepted, so a
    request is sent and never answered."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    workers: list[threading.Thread] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # shut down
            assert handle is not None
            worker = threading.Thread(target=_handle_one, args=(handle, conn), daemon=True)
            worker.start()
            workers.append(worker)

    acceptor = threading.Thread(target=serve, daemon=True) if handle is not None else None
    if acceptor is not None:
        acceptor.start()
    try:
        yield url
    finally:
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        listener.close()
        if acceptor is not None:
            acceptor.join(10)
        for worker in workers:
            worker.join(10)


def _handle_one(handle: Callable[[socket.socket], None], conn: socket.socket) -> None:
    with conn, contextlib.suppress(OSError):
        handle(conn)


def _cut_after_one_line(conn: socket.socket) -> None:
    """Start an NDJSON stream, send one chunk, then close without ending the body."""
    _read_request(conn)
    # ``Connection: close`` because this peer serves one request per connection: without it
    # the client may reuse the connection for its next request just as it is closed here
    # (a reset that has nothing to do with what the test asserts).
    conn.sendall(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n"
        b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    line = b'{"model":"m","message":{"role":"assistant","content":"a"},"done":false}\n'
    conn.sendall(b"%x\r\n%s\r\n" % (len(line), line))


def _ended_before_done(conn: socket.socket) -> None:
    """An NDJSON stream that ends properly, but before the chunk marked ``done``."""
    _cut_after_one_line(conn)
    conn.sendall(b"0\r\n\r\n")


def _answer(status: str, body: bytes) -> Callable[[socket.socket], None]:
    def handle(conn: socket.socket) -> None:
        while _read_request(conn):
            conn.sendall(
                f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\n"
                f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )

    return handle


# -- sync ------------------------------------------------------------------------------------


def test_a_read_timeout_is_a_daemon_timeout_error() -> None:
    with _peer(None) as url, Client(base_url=url, timeout=0.5) as client:
        started = time.monotonic()
        with pytest.raises(DaemonTimeoutError) as info:
            client.list_models()
        assert time.monotonic() - started < 10
    assert isinstance(info.value, DaemonUnavailableError)  # callers catching that still do
    assert url in str(info.value) and "did not answer in time" in str(info.value)


def test_a_stream_cut_midway_is_a_lost_connection() -> None:
    with _peer(_cut_after_one_line) as url, Client(base_url=url, timeout=5) as client:
        received = []
        with pytest.raises(DaemonUnavailableError) as info:
            for chunk in client.chat_stream("m", [{"role": "user", "content": "hi"}]):
                received.append(chunk)
    assert [c["message"]["content"] for c in received] == ["a"]  # it failed mid-iteration
    assert "lost the connection" in str(info.value)


def test_an_answer_stream_that_ends_before_its_final_chunk_is_an_error() -> None:
    """Not a short answer: a client would take a cut answer for the whole one."""
    with _peer(_ended_before_done) as url, Client(base_url=url, timeout=5) as client:
        received = []
        with pytest.raises(DaemonUnavailableError, match="before its final chunk"):
            for chunk in client.chat_stream("m", [{"role": "user", "content": "hi"}]):
                received.append(chunk)
        assert len(received) == 1
        with pytest.raises(DaemonUnavailableError, match="before its final chunk"):
            list(client.generate_stream("m", "hi"))

    async def asynchronous() -> None:
        async with AsyncClient(base_url=url, timeout=5) as client:
            with pytest.raises(DaemonUnavailableError, match="before its final chunk"):
                async for _ in client.chat_stream("m", [{"role": "user", "content": "hi"}]):
                    pass
            with pytest.raises(DaemonUnavailableError, match="before its final chunk"):
                async for _ in client.generate_stream("m", "hi"):
                    pass

    with _peer(_ended_before_done) as url:
        asyncio.run(asyncio.wait_for(asynchronous(), 30))


def test_nobody_listening_is_unavailable() -> None:
    with _peer(None) as url:
        pass  # closed: connections are now refused
    with Client(base_url=url) as client:
        assert not client.is_running()
        with pytest.raises(DaemonUnavailableError) as info:
            client.version()
    assert "localllm serve" in str(info.value)


def test_another_server_is_not_taken_for_the_daemon() -> None:
    with _peer(_answer("200 OK", b"Ollama is running")) as url, Client(base_url=url) as client:
        assert not client.is_running()
        with pytest.raises(APIError) as info:
            client.list_models()  # plain text where JSON was expected
    assert info.value.status_code == 502 and "invalid JSON" in info.value.message


# -- async -----------------------------------------------------------------------------------


def test_async_read_timeout_is_a_daemon_timeout_error() -> None:
    async def scenario(url: str) -> None:
        async with AsyncClient(base_url=url, timeout=0.5) as client:
            with pytest.raises(DaemonTimeoutError):
                await client.ps()

    with _peer(None) as url:
        started = time.monotonic()
        asyncio.run(asyncio.wait_for(scenario(url), 30))
        assert time.monotonic() - started < 10


def test_async_stream_cut_midway_is_a_lost_connection() -> None:
    async def scenario(url: str) -> list[str]:
        received: list[str] = []
        async with AsyncClient(base_url=url, timeout=5) as client:
            with pytest.raises(DaemonUnavailableError):
                async for chunk in client.generate_stream("m", "hi"):
                    received.append(chunk.get("message", {}).get("content", ""))
        return received

    with _peer(_cut_after_one_line) as url:
        assert asyncio.run(asyncio.wait_for(scenario(url), 30)) == ["a"]


def test_async_nobody_listening_and_another_server() -> None:
    async def scenario(closed: str, other: str) -> None:
        async with AsyncClient(base_url=closed) as client:
            assert not await client.is_running()
            with pytest.raises(DaemonUnavailableError):
                await client.list_models()
        async with AsyncClient(base_url=other) as client:
            assert not await client.is_running()

    with _peer(None) as closed:
        pass
    with _peer(_answer("200 OK", b"Ollama is running")) as other:
        asyncio.run(asyncio.wait_for(scenario(closed, other), 30))
