"""The daemon's HTTP servers parse requests and frame chunks with httptools.

Every streamed token leaves the daemon as one HTTP chunk; uvicorn's httptools protocol does
that work in C where h11 does it in Python (the daemon's CPU per streamed token measured 172
against 211 us). httptools is a declared dependency, and uvicorn only picks it when it
imports, so a broken install would silently fall back: this checks the pick.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from localllm.daemon.server import _config
from localllm.settings import Settings


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An ASGI app that is never called: only the configuration is loaded."""


def test_the_daemon_serves_http_with_httptools(settings: Settings) -> None:
    config = _config(_app, settings)
    config.load()
    assert config.http_protocol_class is HttpToolsProtocol
