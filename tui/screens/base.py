"""What the three main screens share: the status bar, the footer, reacting to the daemon
coming and going, and reporting errors."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, cast

from textual.screen import Screen

from localllm._exceptions import DaemonUnavailableError

if TYPE_CHECKING:
    from ..app import LocalLLMApp

__all__ = ["MainScreen"]


class MainScreen(Screen[None]):
    """Base of the chat, models and dashboard screens."""

    MODE: ClassVar[str] = ""
    """The app mode that shows this screen."""
    RELOAD_ON_RESUME: ClassVar[bool] = False
    """Reload the daemon's data each time the screen is shown again (other screens and other
    clients may have changed the store meanwhile)."""

    @property
    def llm(self) -> LocalLLMApp:
        """The app, typed (client, chat store, clock, connection state)."""
        return cast("LocalLLMApp", self.app)

    def on_mount(self) -> None:
        """Start watching the daemon connection."""
        self.watch(self.app, "connection", self._connection_changed, init=True)

    async def _connection_changed(self, state: str) -> None:
        if state == "connected":
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

    def report(self, exc: Exception, doing: str) -> None:
        """Tell the user what failed; a vanished daemon also starts the reconnection."""
        if isinstance(exc, DaemonUnavailableError):
            self.llm.daemon_lost()
        self.notify(f"{doing}: {exc}", severity="error", timeout=8)
