"""A request's queue of runner events whose token events can skip the queue.

The daemon routes a runner's lines as their bytes arrive (:mod:`.lines`). A token event then
went on its request's queue, whose reader (the generation's pump, which must keep reading
even when the client does not, to give the slot back as soon as the runner is done) woke a
loop turn later only to move it onto the HTTP answer's own queue, whose task woke another
turn later: on the first token's way, a turn is 40-60 us after an idle gap. A *tap* takes a
token event in the routing callback itself and hands it on at once, leaving the pump asleep
until the request's last event.

Order is kept: a token event goes to the tap only while nothing waits in the queue before it
(what the queue holds is read first, in order, by its reader); every other event (the
result, an error, the end of the connection) always goes on the queue.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from .protocol import TokenEvent

__all__ = ["EventQueue", "TokenTap"]

T = TypeVar("T")

TokenTap = Callable[[TokenEvent], bool]
"""Takes a token event as it is routed; returns False to leave it on the queue instead."""


class EventQueue(asyncio.Queue[T]):
    """An :class:`asyncio.Queue` of one request's events with an optional :attr:`tap`."""

    tap: TokenTap | None = None
    """Where token events go while the queue is empty (None: on the queue, as any event)."""

    def put_nowait(self, item: T) -> None:
        """Hand a token event to the tap when nothing waits before it; queue anything else."""
        tap = self.tap
        if tap is not None and isinstance(item, TokenEvent) and self.empty() and tap(item):
            return
        super().put_nowait(item)
