"""What the three main screens share: the status bar, the footer, reacting to the daemon
coming and going, and reporting errors."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, ClassVar, cast

from textual.messages import Prune
from textual.screen import Screen
from textual.widgets import Select

from localllm._exceptions import DaemonError, DaemonUnavailableError
from localllm.client import ModelSummary

if TYPE_CHECKING:
    from ..host import Host

__all__ = ["MainScreen"]


class MainScreen(Screen[None]):
    """Base of the chat, models and dashboard screens."""

    MODE: ClassVar[str] = ""
    """The app mode that shows this screen."""
    RELOAD_ON_RESUME: ClassVar[bool] = False
    """Reload the daemon's data each time the screen is shown again (other screens and other
    clients may have changed the store meanwhile)."""

    def __init__(self) -> None:
        super().__init__()
        # Reloads overlap (screen shown again, a model deleted, a pull done): tickets make sure
        # an older answer never replaces a newer one.
        self._issued = 0
        self._shown = 0
        self._connected: bool | None = None

    @property
    def llm(self) -> Host:
        """The app, typed as what the screens need of it (client, chat store, clock,
        connection state)."""
        return cast("Host", self.app)

    def on_mount(self) -> None:
        """Start watching the daemon connection."""
        # Not ``init=True``: Textual queues that first call on the watched object (the app)
        # and later changes on this screen, so an app busy switching to this screen could run
        # a stale "connecting" after "connected" and stop what the connection started (the
        # dashboard's stats stream). Both go through this screen's queue instead.
        self.watch(self.app, "connection", self._connection_changed, init=False)
        self.call_next(self._connection_changed)

    def on_prune(self, event: Prune) -> None:
        """Cancel the screen's workers as it starts to close (the app quits, a mode goes).

        Textual removes a closing screen's widgets first and cancels its workers only after,
        so a worker resuming in between (a stats snapshot, a ``/api/show`` answer) would find
        its widgets gone and fail the app on exit.
        """
        self.workers.cancel_node(self)

    async def _connection_changed(self) -> None:
        # The state when this runs, not when it was queued; and one call per transition, as
        # "starting", "lost" and "offline" all mean the daemon does not answer.
        connected = self.llm.connection == "connected"
        if connected == self._connected:
            return
        self._connected = connected
        if connected:
            await self.on_daemon_connected()
        else:
            await self.on_daemon_lost()

    async def on_screen_resume(self) -> None:
        """Reload when shown again, if the screen asks for it."""
        if self.RELOAD_ON_RESUME and self.llm.connection == "connected":
            await self.on_daemon_connected()

    async def on_daemon_connected(self) -> None:
        """The daemon answers (at start or again after it went away): load data."""

    async def on_daemon_lost(self) -> None:
        """The daemon stopped answering: stop live work."""

    async def list_models(self) -> list[ModelSummary] | None:
        """The store's models; ``None`` when the daemon failed (reported) or when a reload that
        started later has already been shown (this answer is older)."""
        self._issued += 1
        ticket = self._issued
        try:
            models = await self.llm.client.list_models()
        except DaemonError as exc:
            self.report(exc, "Could not list the models")
            return None
        if ticket < self._shown:
            return None
        self._shown = ticket
        return models

    async def offer_models(self, select: Select[str]) -> list[str] | None:
        """Put the store's model names in ``select`` (without a ``Changed`` message) and
        return them; ``None`` as :meth:`list_models` says."""
        models = await self.list_models()
        if models is None:
            return None
        names = [m["name"] for m in models]
        with select.prevent(Select.Changed):
            select.set_options((name, name) for name in names)
        return names

    async def daemon_does(self, call: Awaitable[Any], failure: str, success: str) -> bool:
        """Await a daemon ``call``: True, with ``success`` shown, when it went through; False
        when the daemon refused or failed (reported, led by ``failure``)."""
        try:
            await call
        except DaemonError as exc:
            self.report(exc, failure)
            return False
        self.notify(success)
        return True

    def report(self, exc: Exception, doing: str) -> None:
        """Tell the user what failed; a vanished daemon also starts the reconnection."""
        if isinstance(exc, DaemonUnavailableError):
            self.llm.daemon_lost()
        self.notify(f"{doing}: {exc}", severity="error", timeout=8)
