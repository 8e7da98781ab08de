"""Changes to the widget tree that must finish even when the task awaiting them is cancelled."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["settle"]

T = TypeVar("T")


async def settle(change: Awaitable[T]) -> T:
    """Await ``change`` (a widget's removal, a ``Markdown.update``) shielded from cancellation.

    Textual waits for removed widgets by gathering their message-pump tasks, so a worker
    cancelled while it awaits a removal (an exclusive worker replaced, a screen closing, Esc)
    would cancel those pumps too: the widgets stay half-removed, never answer again, and the
    app hangs on them when it exits. Shielded, the change completes on its own; the caller
    still sees its cancellation at once.
    """
    return await asyncio.shield(asyncio.ensure_future(change))
