"""The daemon's event loop: uvloop where it imports, else asyncio's.

uvloop (libuv) takes less CPU per wake-up, socket read and write than asyncio's selector loop:
on the first token's path the daemon's loop wakes for the request, the runner's acceptance and
the first token line. Windows has no uvloop (the dependency is declared for other platforms
only), and an install without it still runs on asyncio. The runners stay on asyncio's loop
(see :mod:`localllm.daemon.runner.__main__`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["loop_factory", "loop_name", "run"]

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop constructor where it imports, else None (asyncio's default loop)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def loop_name() -> str:
    """Which loop :func:`run` uses, for logs and ``doctor``: ``uvloop X.Y`` or ``asyncio``."""
    try:
        import uvloop
    except ImportError:
        return "asyncio"
    return f"uvloop {uvloop.__version__}"


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to completion on a new loop of :func:`loop_factory`'s kind (as
    :func:`asyncio.run`, which it is where uvloop is missing)."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
