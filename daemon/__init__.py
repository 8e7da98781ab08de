"""localllm's daemon: the HTTP service (Ollama and OpenAI APIs), the scheduler and the runners.

Installed as ``localllm.daemon``. It never calls llama.cpp for generation itself: each loaded
model is served by a runner child process (``localllm.daemon.runner``).

:func:`serve` runs it in the foreground (``localllm serve`` and ``python -m localllm.daemon``);
:func:`create_app` builds the ASGI app alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastapi import FastAPI

    from localllm.settings import Settings

__all__ = ["create_app", "serve"]


def serve(settings: Settings, *, announce: bool = True) -> int:
    """Run the daemon until SIGTERM/SIGINT (see :func:`localllm.daemon.server.serve`)."""
    from .server import serve as _serve

    return _serve(settings, announce=announce)


def create_app(settings: Settings, *args: Any) -> FastAPI:
    """The daemon's FastAPI app (see :func:`localllm.daemon.app.create_app`)."""
    from .app import create_app as _create_app

    return _create_app(settings, *args)
