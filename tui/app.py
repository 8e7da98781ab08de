"""The Textual app: three screens (chat, models, dashboard) as app modes, the connection to the
daemon (started when none answers, watched, reconnected), themes and the help screen.

``localllm tui`` calls :func:`main`. Tests build :class:`LocalLLMApp` with their own settings
(and optionally client) and drive it with ``App.run_test()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import ClassVar

from textual import work
from textual.app import App
from textual.binding import Binding, BindingType
from textual.reactive import reactive

from localllm._exceptions import DaemonUnavailableError
from localllm.autostart import ensure_daemon
from localllm.client import AsyncClient
from localllm.settings import Settings

from .chats import DB_NAME, ChatStore
from .screens.bench import BenchScreen
from .screens.chat import ChatScreen
from .screens.compare import CompareScreen
from .screens.dashboard import DashboardScreen
from .screens.find import SearchDialog
from .screens.help import HelpScreen
from .screens.library import PromptLibrary
from .screens.models import ModelsScreen
from .widgets.prompt import PromptArea

__all__ = ["LocalLLMApp", "main"]

_HEARTBEAT_SECONDS = 2.0
_RETRY_SECONDS = 1.0
# Failed checks after the daemon went away before starting a new one (when allowed to).
_RESTART_AFTER_FAILURES = 3
_THEME_KEY = "theme"
DARK_THEME = "textual-dark"
LIGHT_THEME = "textual-light"


class LocalLLMApp(App[None]):
    """localllm's terminal UI.

    ``settings`` says which daemon and data dir (default: from the environment); ``client``
    replaces the :class:`~localllm.client.AsyncClient` built from them; ``autostart`` starts a
    daemon when none answers; ``clock`` gives "now" for relative times and countdowns (tests
    freeze it); ``stats_interval`` is the dashboard's update period in seconds.
    """

    TITLE = "localllm"
    CSS_PATH = "app.tcss"
    MODES: ClassVar = {
        "chat": ChatScreen,
        "models": ModelsScreen,
        "dashboard": DashboardScreen,
        "bench": BenchScreen,
    }
    DEFAULT_MODE = "chat"
    HORIZONTAL_BREAKPOINTS: ClassVar = [(0, "-narrow"), (90, "-wide")]
    BINDINGS: ClassVar[list[BindingType]] = [
        # "?" too, where no text box takes it (models, dashboard).
        Binding("f1,question_mark", "help", "Help", id="app.help"),
        # The status bar shows these three; the footer leaves them out to save room at 80 columns.
        Binding("f2", "switch_mode('chat')", "Chat", show=False, id="app.chat"),
        Binding("f3", "switch_mode('models')", "Models", show=False, id="app.models"),
        Binding("f4", "switch_mode('dashboard')", "Dashboard", show=False, id="app.dashboard"),
        Binding("f9", "switch_mode('bench')", "Bench", show=False, id="app.bench"),
        Binding("ctrl+t", "toggle_theme", "Light/dark", show=False, id="app.theme"),
        Binding("ctrl+q", "quit", "Quit", priority=True, id="app.quit"),
    ]

    connection: reactive[str] = reactive("connecting", init=False)
    """``connecting``, ``starting``, ``connected``, ``lost`` (it went away) or ``offline``."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        client: AsyncClient | None = None,
        autostart: bool = True,
        clock: Callable[[], float] = time.time,
        stats_interval: float = 0.25,
    ) -> None:
        super().__init__()
        self.settings = settings if settings is not None else Settings.from_env()
        """Where the daemon and the data live."""
        self.client = client if client is not None else AsyncClient(self.settings)
        """The one way this app talks to the daemon."""
        self.autostart = autostart
        """Start a daemon when none answers."""
        self.clock = clock
        """Wall-clock time for "3 minutes ago" and keep-alive countdowns."""
        self.stats_interval = stats_interval
        """Seconds between the dashboard's stats updates."""
        self.chats = ChatStore(self.settings.data_dir / DB_NAME)
        """Saved chats."""
        self.daemon_version: str | None = None
        """The connected daemon's version."""
        self.connection_error = ""
        """Why the daemon could not be reached or started, when it could not."""
        self._lost = asyncio.Event()

    # -- lifecycle ------------------------------------------------------------------------

    async def on_mount(self) -> None:
        """Restore the theme and start connecting to the daemon."""
        saved = await asyncio.to_thread(self.chats.get_meta, _THEME_KEY)
        if saved in self.available_themes:
            self.theme = saved
        self.maintain_connection()

    async def on_unmount(self) -> None:
        """Release the client and the chat database."""
        with contextlib.suppress(Exception):
            await self.client.close()
        self.chats.close()

    # -- the daemon -----------------------------------------------------------------------

    def daemon_lost(self) -> None:
        """Something failed because the daemon is gone: check now instead of at the next beat."""
        self._lost.set()

    @work(exclusive=True, group="connection")
    async def maintain_connection(self) -> None:
        """Connect (starting a daemon if allowed), then watch; reconnect when it goes away."""
        started = False
        went_away = False
        failures = 0
        while True:
            if await self.client.is_running():
                with contextlib.suppress(Exception):
                    self.daemon_version = await self.client.version()
                failures, started, went_away = 0, False, False
                self.connection_error = ""
                self.connection = "connected"
                await self._watch_daemon()
                went_away = True
                self.connection = "lost"
                continue
            failures += 1
            # After a loss, give a restarting daemon a moment before starting one ourselves.
            ready = not went_away or failures >= _RESTART_AFTER_FAILURES
            if self.autostart and not started and ready:
                started = True
                self.connection = "starting"
                try:
                    # The CLI's helper: one start at a time per home, bounded wait, log tail.
                    await asyncio.to_thread(ensure_daemon, self.settings)
                    continue
                except DaemonUnavailableError as exc:
                    self.connection_error = str(exc)
                    self.notify(str(exc), title="Daemon", severity="error", timeout=10)
            self.connection = "lost" if went_away else "offline"
            await asyncio.sleep(_RETRY_SECONDS)

    async def _watch_daemon(self) -> None:
        """Return once the daemon stops answering."""
        while True:
            self._lost.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._lost.wait(), _HEARTBEAT_SECONDS)
            if not await self.client.is_running():
                return

    # -- actions --------------------------------------------------------------------------

    def action_help(self) -> None:
        """Show every key binding."""
        if isinstance(self.screen, HelpScreen):
            return
        # The Bench key is listed with the Bench screen's own, so that the chat's keys, which
        # people look for first, stay on the first page at 80x24.
        bench_key = [b for b in self.BINDINGS if getattr(b, "id", None) == "app.bench"]
        sections: list[tuple[str, list[BindingType]]] = [
            ("Everywhere", [b for b in self.BINDINGS if b not in bench_key]),
            ("Chat", [*ChatScreen.BINDINGS, *PromptArea.BINDINGS]),
            ("Prompt library (Ctrl+S)", list(PromptLibrary.BINDINGS)),
            ("Search (Ctrl+F)", list(SearchDialog.BINDINGS)),
            ("Compare (F12)", list(CompareScreen.BINDINGS)),
            ("Models", list(ModelsScreen.BINDINGS)),
            ("Dashboard", list(DashboardScreen.BINDINGS)),
            ("Bench", [*bench_key, *BenchScreen.BINDINGS]),
        ]
        self.push_screen(HelpScreen(sections))

    async def action_toggle_theme(self) -> None:
        """Switch between the light and the dark theme (remembered)."""
        self.theme = LIGHT_THEME if self.current_theme.dark else DARK_THEME
        await asyncio.to_thread(self.chats.set_meta, _THEME_KEY, self.theme)


def main() -> None:
    """Run the terminal UI with settings from the environment (``localllm tui``)."""
    LocalLLMApp(Settings.from_env()).run()
