"""The dashboard: every loaded model live (slots, queue, KV cache, keep-alive, decode and
prefill tokens/s over the last minute, recent TTFTs), fed by the daemon's stats stream."""

from __future__ import annotations

from typing import Any, ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.widgets import Footer, Label

from localllm._exceptions import DaemonError

from ..dom import settle
from ..widgets.loaded_model import LoadedModelCard
from ..widgets.status import StatusBar
from .base import MainScreen

__all__ = ["DashboardScreen"]

_HISTORY_SECONDS = 60.0


class DashboardScreen(MainScreen):
    """Live view of the loaded models."""

    MODE = "dashboard"
    CSS_PATH = "dashboard.tcss"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("u", "unload", "Unload model", id="dashboard.unload")
    ]

    def __init__(self) -> None:
        super().__init__()
        self.cards: dict[str, LoadedModelCard] = {}
        """One card per loaded model, by name."""
        self.snapshot: dict[str, Any] | None = None
        """The latest stats snapshot shown."""
        self.updates = 0
        """Snapshots received so far (tests wait on it)."""
        # Held rather than queried: when the screen closes, Textual removes its children before
        # it cancels the stats worker, so a snapshot arriving in between must not look them up.
        self._queue = Label("", id="queue")
        self._cards_box = VerticalScroll(id="cards")
        self._empty = Label(
            "No model is loaded. Models load on first use: ask one in the chat (F2).", id="empty"
        )

    def compose(self) -> ComposeResult:
        """Build the widget tree."""
        yield StatusBar(self.MODE)
        yield self._queue
        with self._cards_box:
            yield self._empty
        yield Footer(compact=True, show_command_palette=False)

    async def on_daemon_connected(self) -> None:
        """Follow the stats stream."""
        self.follow_stats()

    async def on_daemon_lost(self) -> None:
        """Stop following; the stream restarts on reconnection."""
        self.workers.cancel_group(self, "stats")

    @work(exclusive=True, group="stats")
    async def follow_stats(self) -> None:
        """Read the daemon's live stats (a few per second) into the cards."""
        interval = self.llm.stats_interval
        try:
            async for snapshot in self.llm.client.stats_stream(interval=interval):
                await self.show_snapshot(snapshot)
        except DaemonError as exc:
            self.report(exc, "The stats stream stopped")

    async def show_snapshot(self, snapshot: dict[str, Any]) -> None:
        """Apply one stats snapshot: add, update and remove cards."""
        self.snapshot = snapshot
        self.updates += 1
        models = {m["name"]: m for m in snapshot.get("models", [])}
        queue = snapshot.get("queue_depth", 0)
        limit = snapshot.get("max_queue", 0)
        loaded = f"{len(models)} model{'s' if len(models) != 1 else ''} loaded"
        self._queue.update(f"{loaded} · queue {queue} / {limit} waiting")
        for name in [n for n in self.cards if n not in models]:
            await settle(self.cards.pop(name).remove())
        history = max(2, round(_HISTORY_SECONDS / self.llm.stats_interval))
        for name, entry in sorted(models.items()):
            card = self.cards.get(name)
            if card is None:
                card = self.cards[name] = LoadedModelCard(name, history=history)
                await self._cards_box.mount(card)
            card.show(entry, self.llm.clock())
        self._empty.display = not models

    def _target(self) -> str | None:
        focused = self.focused
        if isinstance(focused, LoadedModelCard):
            return focused.model
        return next(iter(sorted(self.cards)), None)

    def action_unload(self) -> None:
        """Unload the focused model (or the only one)."""
        if (model := self._target()) is not None:
            self.unload(model)

    @on(LoadedModelCard.UnloadRequested)
    def _unload_requested(self, event: LoadedModelCard.UnloadRequested) -> None:
        self.unload(event.model)

    @work(group="unload")
    async def unload(self, model: str) -> None:
        """Ask the daemon to unload ``model`` (once its running requests end)."""
        unloading = self.llm.client.unload(model)
        await self.daemon_does(unloading, f"Could not unload {model}", f"Unloaded {model}")
