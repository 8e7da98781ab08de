"""The asynchronous transport of :class:`~localllm.client.AsyncClient` (httpx), and
:func:`async_transport`, the httpx transport it and the bench drivers use.

:class:`AsyncTransport` is the twin of :class:`~._sync_transport.SyncTransport`: it sends a
:class:`~._core.Request` and raises the :class:`~._core.TransportError` kinds for httpx's
failures; everything else about a request is in :mod:`._core`.

httpx's default async transport opens TCP connections with ``anyio.connect_tcp``, which races
its connection attempts (happy eyeballs) in a task group and, once one succeeds, cancels that
group's scope. On Python 3.11 that cancellation can reach the *calling* task after the connect
has returned (a retried cancel leaves ``_must_cancel`` set, which ``Task.uncancel`` does not
clear; agronholm/anyio#1094 is the same leak), and the caller dies of a ``CancelledError`` at
its next ``await``: a TUI worker stops for no reason, a test ends mid-way (our CI failed this
way about once in 40 runs of the TUI tests). This transport is httpx's own with one change:
TCP connections are made by the event loop directly, one address after the other, with no
task group. Unix-socket connections were never affected and stay as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import anyio
import anyio.abc
import httpcore
import httpx

# httpcore's stream over an anyio socket stream: what its own backend returns for a connect.
from httpcore._backends.anyio import AnyIOStream

from . import _core
from ._core import Endpoint, Request, Response, Timeout

__all__ = ["AsyncStreamResponse", "AsyncTransport", "async_transport", "in_thread", "sleep"]

_T = TypeVar("_T")

sleep = asyncio.sleep
"""Wait this many seconds (the sync transport's twin blocks)."""


async def in_thread(function: Callable[..., _T], *args: Any) -> _T:
    """Run blocking work (hashing a file) in a thread, so the event loop goes on."""
    return await asyncio.to_thread(function, *args)


_SocketOption = tuple[int, int, int | bytes] | tuple[int, int, None, int]


class _DirectConnectBackend(httpcore.AnyIOBackend):
    """httpcore's anyio backend, except that TCP connects run in the calling task alone."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[_SocketOption] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        """Connect to ``host:port``: each resolved address in turn until one answers."""
        try:
            with anyio.fail_after(timeout):
                sock = await _connect(host, port, local_address)
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(f"connecting to {host}:{port} timed out") from exc
        except OSError as exc:
            raise httpcore.ConnectError(str(exc)) from exc
        for option in socket_options or ():
            sock.setsockopt(*option)
        return AnyIOStream(await anyio.abc.SocketStream.from_socket(sock))


async def _connect(host: str, port: int, local_address: str | None) -> socket.socket:
    loop = asyncio.get_running_loop()
    addresses = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    failure: OSError = OSError(f"{host} resolves to no address")
    for family, kind, protocol, _, address in addresses:
        sock = socket.socket(family, kind, protocol)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if local_address is not None:
                sock.bind((local_address, 0))
            await loop.sock_connect(sock, address)
        except OSError as exc:
            sock.close()
            failure = exc
        except BaseException:
            sock.close()
            raise
        else:
            return sock
    raise failure


def async_transport(
    *, uds: str | None = None, limits: httpx.Limits | None = None
) -> httpx.AsyncHTTPTransport:
    """httpx's async transport (to ``uds`` when given), connecting over TCP without anyio's
    task group; no proxy from the environment (the daemon is reached directly)."""
    limits = limits or httpx.Limits(max_connections=100, max_keepalive_connections=20)
    transport = httpx.AsyncHTTPTransport(uds=uds, limits=limits, trust_env=False)
    if uds is None:
        # httpx builds its pool without a way to name the network backend: build it again,
        # with the same settings, around ours.
        transport._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=_DirectConnectBackend(),
        )
    return transport


@contextlib.contextmanager
def _wire_errors() -> Iterator[None]:
    """httpx's errors as :class:`~._core.TransportError` kinds."""
    try:
        yield
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        raise _core.ConnectFailed(exc.__class__.__name__) from exc
    except httpx.TimeoutException as exc:  # read, write, pool
        raise _core.TimedOut(exc.__class__.__name__) from exc
    except httpx.TransportError as exc:  # read/write errors, protocol errors, ...
        raise _core.ConnectionLost(str(exc) or exc.__class__.__name__) from exc
    except httpx.HTTPError as exc:  # undecodable content, redirects
        raise _core.BadAnswer(str(exc)) from exc


def _timeout(timeout: Timeout) -> httpx.Timeout:
    return httpx.Timeout(timeout.read, connect=timeout.connect)


async def _chunks(content: Iterable[bytes]) -> AsyncIterator[bytes]:
    for chunk in content:
        yield chunk


class AsyncStreamResponse:
    """An answer whose body is read as it arrives."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self.status_code = response.status_code

    async def read(self) -> bytes:
        """The rest of the body."""
        with _wire_errors():
            return await self._response.aread()

    async def lines(self) -> AsyncIterator[str]:
        """The body's lines as they arrive, without their line ends."""
        with _wire_errors():
            async for line in self._response.aiter_lines():
                yield line


class AsyncTransport:
    """Sends :class:`~._core.Request` objects to endpoints, with ``headers`` on each; one
    httpx connection pool per endpoint."""

    def __init__(self, headers: Mapping[str, str]) -> None:
        self._headers = dict(headers)
        self._pools: dict[Endpoint, httpx.AsyncClient] = {}

    def _http(self, endpoint: Endpoint) -> httpx.AsyncClient:
        pool = self._pools.get(endpoint)
        if pool is None:
            pool = self._pools[endpoint] = httpx.AsyncClient(
                base_url=endpoint.base_url,
                transport=async_transport(uds=endpoint.uds),
                headers=self._headers,
            )
        return pool

    def _build(self, endpoint: Endpoint, request: Request) -> httpx.Request:
        content = request.content
        if content is not None and not isinstance(content, bytes):
            content = _chunks(content)
        return self._http(endpoint).build_request(
            request.method,
            request.path,
            content=content,
            headers=request.headers,
            timeout=_timeout(request.timeout),
        )

    async def request(self, endpoint: Endpoint, request: Request) -> Response:
        """Send ``request`` and read its whole answer."""
        with _wire_errors():
            response = await self._http(endpoint).send(self._build(endpoint, request))
        return Response(response.status_code, response.content)

    @contextlib.asynccontextmanager
    async def stream(
        self, endpoint: Endpoint, request: Request
    ) -> AsyncIterator[AsyncStreamResponse]:
        """Send ``request``; the answer's body is read as it arrives. Leaving before its end
        closes the connection (which cancels the request)."""
        with _wire_errors():
            response = await self._http(endpoint).send(self._build(endpoint, request), stream=True)
        try:
            yield AsyncStreamResponse(response)
        finally:
            with _wire_errors():
                await response.aclose()

    async def close(self) -> None:
        """Close the connection pools."""
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            await pool.aclose()
