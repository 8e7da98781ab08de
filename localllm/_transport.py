"""The async HTTP transport of :class:`~localllm.client.AsyncClient` and the bench drivers.

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
import socket
from collections.abc import Iterable

import anyio
import anyio.abc
import httpcore
import httpx

# httpcore's stream over an anyio socket stream: what its own backend returns for a connect.
from httpcore._backends.anyio import AnyIOStream

__all__ = ["async_transport"]

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
