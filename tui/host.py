"""What the screens need of the app, as a protocol: the screens are typed against
:class:`Host`, not against :class:`~localllm.tui.app.LocalLLMApp`, so the app imports its
screens and no screen imports the app."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from localllm.client import AsyncClient
    from localllm.settings import Settings

    from .chats import ChatStore

__all__ = ["Host"]


class Host(Protocol):
    """The app as its screens see it (:class:`~localllm.tui.app.LocalLLMApp` is one)."""

    settings: Settings
    """Where the daemon and the data live."""
    client: AsyncClient
    """The one way the app talks to the daemon."""
    chats: ChatStore
    """Saved chats."""
    clock: Callable[[], float]
    """Wall-clock time for "3 minutes ago" and keep-alive countdowns."""
    stats_interval: float
    """Seconds between the dashboard's stats updates."""

    @property
    def connection(self) -> str:
        """``connecting``, ``starting``, ``connected``, ``lost`` or ``offline`` (a reactive
        the screens watch)."""
        ...

    def daemon_lost(self) -> None:
        """Something failed because the daemon is gone: check now."""
        ...
