"""The one client for the localllm daemon, synchronous (:class:`Client`) and asynchronous
(:class:`AsyncClient`), used by the CLI and the terminal UI alike.

It finds the daemon by itself: its Unix socket, then its TCP address (where the socket's place
depends on ``XDG_RUNTIME_DIR``, i.e. without ``LOCALLLM_HOME``), taking the first that answers
as localllm; TCP first when ``LOCALLLM_HOST`` is set. ``base_url=``, ``socket_path=`` or
``use_tcp=`` fix one transport instead. Every daemon route has a method;
streaming methods yield parsed chunks as they arrive, and leaving such an iteration early
closes the connection, which cancels the request in the daemon::

    from localllm.client import Client

    with Client() as client:
        for chunk in client.chat_stream("smollm2:135m", [{"role": "user", "content": "Hi"}]):
            print(chunk["message"]["content"], end="", flush=True)
        print(chunk["ttft_duration"] / 1e6, "ms to the first token")

Errors, and no others from the transport (one mapping, :meth:`._core.Config.errors`, serves
every path): :class:`~localllm.DaemonUnavailableError` when no daemon answers or the connection
drops (also in the middle of a stream), its subclass :class:`~localllm.DaemonTimeoutError` when
the daemon does not answer in time, :class:`~localllm.APIError` with ``status_code`` and the
daemon's message otherwise (also for an error reported in the middle of a stream).

How it is built: :mod:`._core` holds everything but I/O (endpoints and discovery, request
bodies, reading NDJSON and SSE, the error mapping); :mod:`._async_client` is the client's one
source, and :mod:`._sync_client` is written from it by :mod:`._unasync`. Only the transports
differ: httpx for :class:`AsyncClient` (:mod:`._async_transport`), the standard library's
``http.client`` for :class:`Client` (:mod:`._sync_transport`), so that importing this package
for a short CLI command costs a few milliseconds; :class:`AsyncClient` and httpx are imported
on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from ._core import is_loopback
from ._gateway import GatewayClient
from ._sync_client import Client

if TYPE_CHECKING:
    from ._async_client import AsyncClient
    from ._types import (
        ChatChunk,
        ChatMessage,
        EmbedResponse,
        GenerateChunk,
        LoadedModelInfo,
        ModelDetails,
        ModelSummary,
        ProgressLine,
        ShowResponse,
        StatsSnapshot,
        Think,
    )

__all__ = [
    "AsyncClient",
    "ChatChunk",
    "ChatMessage",
    "Client",
    "EmbedResponse",
    "GatewayClient",
    "GenerateChunk",
    "LoadedModelInfo",
    "ModelDetails",
    "ModelSummary",
    "ProgressLine",
    "ShowResponse",
    "StatsSnapshot",
    "Think",
    "is_loopback",
]


def __getattr__(name: str) -> Any:
    # Imported when first asked for: the async client needs httpx and asyncio, and the typed
    # dicts only serve annotations; a CLI command needs neither. (The names this module
    # defines itself never get here.)
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = "._async_client" if name == "AsyncClient" else "._types"
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value  # the next lookup finds it at once
    return value
