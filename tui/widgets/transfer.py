"""Progress of one pull or quantization: a bar per layer with size, speed and time left.

Fed with the daemon's Ollama-shaped progress lines (``{"status", "digest", "total",
"completed"}``, plus ``bytes_per_second`` when the daemon measured it). Lines with a total get
a bar (keyed by digest, or by status for quantization); the others update the status text.
"""

from __future__ import annotations

import time
from typing import Any

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.reactive import reactive
from textual.widgets import Button, Label, ProgressBar

from ..format import transfer_line

__all__ = ["LayerProgress", "TransferPanel"]

# Weight of the newest sample in the smoothed speed, when the daemon sends none.
_SMOOTHING = 0.3


class LayerProgress(Horizontal):
    """One layer's (or one quantization's) bar and numbers."""

    def __init__(self, name: str, total: int) -> None:
        super().__init__(classes="layer")
        self.layer_name = name
        """Short digest or the step's name."""
        self.total = total
        """Bytes to transfer."""
        self.completed = 0
        """Bytes done."""
        self.bytes_per_second: float | None = None
        """Current speed (the daemon's, or smoothed here)."""
        self.bar = ProgressBar(total=total, show_eta=False, show_percentage=True)
        """The bar."""
        self._info = Label("", classes="layer-info")
        self._last: tuple[float, int] | None = None

    def compose(self) -> ComposeResult:
        """Build the widget tree."""
        yield Label(self.layer_name, classes="layer-name")
        yield self.bar
        yield self._info

    def advance_to(self, completed: int, total: int, bytes_per_second: float | None) -> None:
        """Move the bar to ``completed`` of ``total`` bytes."""
        now = time.monotonic()
        if bytes_per_second is None and self._last is not None and now > self._last[0]:
            sample = (completed - self._last[1]) / (now - self._last[0])
            previous = self.bytes_per_second
            bytes_per_second = (
                sample if previous is None else previous + _SMOOTHING * (sample - previous)
            )
        self._last = (now, completed)
        self.total, self.completed = total, completed
        self.bytes_per_second = bytes_per_second
        self.bar.update(total=total, progress=completed)
        self._info.update(transfer_line(completed, total, bytes_per_second))


class TransferPanel(Vertical):
    """A pull or quantization in progress, with a Cancel (then Dismiss) button."""

    state: reactive[str] = reactive("running")
    """``running``, ``done``, ``failed`` or ``cancelled``."""

    class CancelRequested(Message):
        """The user asked to stop this transfer (or to dismiss it once over)."""

        def __init__(self, panel: TransferPanel) -> None:
            super().__init__()
            self.panel = panel
            """The panel."""

    def __init__(self, heading: str, *, kind: str) -> None:
        super().__init__(classes=f"transfer {kind}")
        self.heading = heading
        """What is transferred: ``pull tiny:latest``."""
        self.kind = kind
        """``pull`` or ``quantize``."""
        self.status = ""
        """The latest status line."""
        self.bars: dict[str, LayerProgress] = {}
        """Bars by digest (or step)."""
        self._status = Label("starting…", classes="transfer-status")
        self._button = Button("Cancel", classes="transfer-button", compact=True)
        self._bars = Vertical(classes="transfer-layers")

    def compose(self) -> ComposeResult:
        """Build the widget tree."""
        with Horizontal(classes="transfer-head"):
            yield Label(self.heading, classes="transfer-title")
            yield self._status
            yield self._button
        yield self._bars

    async def show_progress(self, line: dict[str, Any]) -> None:
        """Apply one progress line."""
        status = str(line.get("status", ""))
        total = line.get("total")
        if isinstance(total, int) and total > 0:
            digest = line.get("digest")
            key = str(digest) if digest else status
            layer = self.bars.get(key)
            if layer is None:
                name = key.removeprefix("sha256:")[:12] if digest else self.kind
                layer = self.bars[key] = LayerProgress(name, total)
                await self._bars.mount(layer)
            rate = line.get("bytes_per_second")
            layer.advance_to(int(line.get("completed") or 0), total, rate)
        # Per-layer lines ("pulling <hex>") are told by their bars; the rest is the status.
        if line.get("digest"):
            status = "downloading"
        if status and status != self.status:
            self.status = status
            self._status.update(status)

    def finish(self, state: str, message: str = "") -> None:
        """Mark the transfer over (``done``, ``failed``, ``cancelled``)."""
        self.state = state
        if message:
            self.status = message
            self._status.update(message)

    def watch_state(self, state: str) -> None:
        """Restyle and turn Cancel into Dismiss once over."""
        for name in ("running", "done", "failed", "cancelled"):
            self.set_class(state == name, f"-{name}")
        if state != "running":
            self._button.label = "Dismiss"

    def on_button_pressed(self, event: Button.Pressed) -> None:
        """Ask the screen to cancel (or remove) this transfer."""
        event.stop()
        self.post_message(self.CancelRequested(self))
