"""The synchronous transport of :class:`~localllm.client.Client`: the standard library's
``http.client``, over the daemon's Unix socket or TCP.

Why not httpx here: the CLI's commands are short (``localllm list`` is one request), and
importing httpx costs several times the whole command (with rich installed it also pulls in its
own command line). ``http.client`` is already loaded by the standard library's ``urllib`` users
and speaks all the HTTP/1.1 the daemon does: keep-alive, chunked answers, chunked uploads.

Connections are kept per endpoint and reused one request at a time (the client may be shared
by threads). A kept connection that the daemon has closed meanwhile (its keep-alive ran out)
is noticed before it is reused. Leaving a stream before its end closes its connection, which
is how the daemon learns that the request was cancelled.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar
from urllib.parse import urlsplit

from . import _core
from ._core import Endpoint, Request, Response, Timeout

__all__ = ["StreamResponse", "SyncTransport", "in_thread", "sleep"]

_T = TypeVar("_T")

sleep = time.sleep
"""Wait this many seconds (the async transport's twin awaits)."""


def in_thread(function: Callable[..., _T], *args: Any) -> _T:
    """Run blocking work (hashing a file): here, simply call it."""
    return function(*args)


class _UnixConnection(http.client.HTTPConnection):
    """``http.client``'s connection to a Unix socket instead of a TCP port."""

    def __init__(self, path: str, timeout: float | None) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        """Connect to the socket."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self._path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def _new_connection(endpoint: Endpoint, timeout: float | None) -> http.client.HTTPConnection:
    if endpoint.uds is not None:
        return _UnixConnection(endpoint.uds, timeout)
    url = urlsplit(endpoint.base_url)
    kind = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
    return kind(url.hostname or "localhost", url.port, timeout=timeout)


def _is_stale(connection: http.client.HTTPConnection) -> bool:
    """True for a kept connection that must not be reused: an idle HTTP/1.1 connection has
    nothing to read, so anything readable is its end (the peer closed it) or garbage."""
    sock = connection.sock
    if sock is None:
        return True
    # Non-blocking for the look: with a timeout set, recv would first wait for data.
    sock.settimeout(0.0)
    try:
        sock.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return False
    except OSError:
        pass
    return True


class _Pool:
    """The idle connections to one endpoint."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.prefix = urlsplit(endpoint.base_url).path.rstrip("/")
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def take(self, timeout: Timeout) -> http.client.HTTPConnection:
        """An open connection: a kept one that is still good, else a new one."""
        while True:
            with self._lock:
                connection = self._idle.pop() if self._idle else None
            if connection is None:
                break
            if not _is_stale(connection):
                assert connection.sock is not None
                connection.sock.settimeout(timeout.read)
                return connection
            connection.close()
        connection = _new_connection(self.endpoint, timeout.connect)
        try:
            connection.connect()
        except OSError as exc:
            connection.close()
            raise _core.ConnectFailed(exc.__class__.__name__) from exc
        assert connection.sock is not None
        connection.sock.settimeout(timeout.read)
        return connection

    def give_back(self, connection: http.client.HTTPConnection) -> None:
        """Keep a connection whose last answer was read to its end."""
        with self._lock:
            self._idle.append(connection)

    def close(self) -> None:
        """Close the idle connections."""
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()


@contextlib.contextmanager
def _wire_errors() -> Iterator[None]:
    """``http.client``'s and the socket's errors after connecting, as
    :class:`~._core.TransportError` kinds."""
    try:
        yield
    except _core.TransportError:
        raise
    except TimeoutError as exc:
        raise _core.TimedOut(exc.__class__.__name__) from exc
    except (OSError, http.client.HTTPException) as exc:
        raise _core.ConnectionLost(str(exc) or exc.__class__.__name__) from exc


_READ_SIZE = 1 << 16


def _text(line: bytes) -> str:
    return line.decode("utf-8", errors="replace").removesuffix("\r")


class StreamResponse:
    """An answer whose body is read as it arrives."""

    def __init__(self, response: http.client.HTTPResponse) -> None:
        self._response = response
        self.status_code = response.status

    def read(self) -> bytes:
        """The rest of the body."""
        with _wire_errors():
            return self._response.read()

    def lines(self) -> Iterator[str]:
        """The body's lines as they arrive, without their line ends."""
        # read1, not readline: readline takes a chunked body cut off mid-way for its end.
        response = self._response
        pending = b""
        with _wire_errors():
            while data := response.read1(_READ_SIZE):
                *lines, pending = (pending + data).split(b"\n")
                for line in lines:
                    yield _text(line)
            if response.length:  # a Content-Length body that ended early
                raise http.client.IncompleteRead(b"", response.length)
        if pending:
            yield _text(pending)

    @property
    def complete(self) -> bool:
        """True once the body has been read to its end."""
        return self._response.isclosed()


class SyncTransport:
    """Sends :class:`~._core.Request` objects to endpoints, with ``headers`` on each."""

    def __init__(self, headers: Mapping[str, str]) -> None:
        self._headers = dict(headers)
        self._pools: dict[Endpoint, _Pool] = {}
        self._lock = threading.Lock()

    def _pool(self, endpoint: Endpoint) -> _Pool:
        with self._lock:
            pool = self._pools.get(endpoint)
            if pool is None:
                pool = self._pools[endpoint] = _Pool(endpoint)
            return pool

    @contextlib.contextmanager
    def _exchange(
        self, endpoint: Endpoint, request: Request
    ) -> Iterator[tuple[_Pool, http.client.HTTPConnection, http.client.HTTPResponse]]:
        pool = self._pool(endpoint)
        connection = pool.take(request.timeout)
        try:
            with _wire_errors():
                connection.request(
                    request.method,
                    pool.prefix + request.path,
                    body=request.content,  # type: ignore[arg-type]
                    headers={**self._headers, **request.headers},
                )
                response = connection.getresponse()
            yield pool, connection, response
        except BaseException:
            connection.close()
            raise

    def request(self, endpoint: Endpoint, request: Request) -> Response:
        """Send ``request`` and read its whole answer."""
        with self._exchange(endpoint, request) as (pool, connection, response):
            with _wire_errors():
                content = response.read()
            if response.will_close:
                connection.close()
            else:
                pool.give_back(connection)
            return Response(response.status, content)

    @contextlib.contextmanager
    def stream(self, endpoint: Endpoint, request: Request) -> Iterator[StreamResponse]:
        """Send ``request``; the answer's body is read as it arrives. The connection is kept
        only when the body was read to its end, else closed (which cancels the request)."""
        with self._exchange(endpoint, request) as (pool, connection, response):
            answer = StreamResponse(response)
            yield answer
            if answer.complete and not response.will_close:
                pool.give_back(connection)
            else:
                connection.close()

    def close(self) -> None:
        """Close every kept connection."""
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()
