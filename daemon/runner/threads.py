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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

__all__ = ["in_own_thread"]

T = TypeVar("T")


async def in_own_thread(function: Callable[[], T], name: str = "localllm-work") -> T:
    """``function()`` in a new thread that ends when it returns (with any OpenMP team it
    made); its result or exception, awaited without blocking the loop."""
    # An executor of one thread, shut down at once: its thread exits after this one call,
    # where the loop's default executor keeps its threads for the next.
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
    try:
        return await asyncio.get_running_loop().run_in_executor(executor, function)
    finally:
        executor.shutdown(wait=False)
