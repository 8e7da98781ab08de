"""Running llama.cpp work off the engine thread without slowing the engine down.

llama.cpp's CPU backend (built with OpenMP, as the wheels are) computes a graph with a team of
worker threads that libgomp keeps for the thread that started it, for as long as that thread
lives. Once more threads are managed than there are cores, libgomp throttles spinning and its
barriers sleep almost at once, and ggml's graphs pass through many barriers per decode: with
an idle team left behind by a pooled thread (an image encoded by ``asyncio.to_thread``), the
engine decoded 11-15 % slower from then on (SmolLM2, 2 threads on 2 cores, measured with a
plain decode loop: 112 tok/s against 125 with the other team gone). A thread that ends takes
its team with it, so work that may compute a graph runs in a thread of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import TypeVar

__all__ = ["in_own_thread"]

T = TypeVar("T")


async def in_own_thread(function: Callable[[], T], name: str = "localllm-work") -> T:
    """``function()`` in a new thread that ends when it returns (with any OpenMP team it
    made); its result or exception, awaited without blocking the loop."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():  # the awaiting task was cancelled meanwhile
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        try:
            result = function()
        except BaseException as exc:  # handed to the awaiting task, like to_thread does
            outcome: tuple[T | None, BaseException | None] = (None, exc)
        else:
            outcome = (result, None)
        # The loop closed: the runner is exiting and nobody awaits this any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=run, name=name, daemon=True).start()
    return await future
