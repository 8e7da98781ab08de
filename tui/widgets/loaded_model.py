"""The dashboard's card for one loaded model: slots, queue, CPU threads (and why fewer, when
the CPU governor holds some back), KV cache, keep-alive countdown, sparklines of decode and
prefill tokens/s over the last minute, TTFT of recent requests, and TTFT and decode rate of the
requests since the daemon started (the daemon keeps that history: ``models[i].history`` of the
stats stream, see ``daemon/history.py``; a daemon that does not send it simply shows no such
row)."""

from __future__ import annotations

from collections import deque
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Button, Label, ProgressBar, Sparkline

from ..format import countdown, duration_ms, rate

__all__ = ["LoadedModelCard", "adapters_text", "slot_text", "threads_text"]

_SLOT_STYLE = {"decode": "bold green", "prefill": "bold yellow", "idle": "dim"}
_SLOT_GLYPH = {"decode": "●", "prefill": "◐", "idle": "○"}
_RECENT_TTFTS = 6


def slot_text(slots: list[dict[str, Any]]) -> Text:
    """``● decode 12 ◐ prefill 40% ○ idle``: each slot's state, colored."""
    text = Text()
    for slot in slots:
        state = str(slot.get("state", "idle"))
        style = _SLOT_STYLE.get(state, "")
        text.append(f"{_SLOT_GLYPH.get(state, '?')} ", style=style)
        if state == "decode":
            text.append(f"decoding {slot.get('generated_tokens', 0)}", style=style)
        elif state == "prefill":
            total = int(slot.get("prompt_tokens") or 0)
            done = int(slot.get("prefilled_tokens") or 0)
            share = f" {100 * done // total}%" if total else ""
            text.append(f"prefilling{share}", style=style)
        else:
            text.append("idle", style=style)
        text.append("  ")
    return text


def threads_text(threads: Any) -> Text:
    """``CPU threads 2 of 2``, or ``CPU threads 1 of 2 · CPU busy: ...`` (in the warning
    color) while the runner's CPU governor holds threads back: why its rates are lower."""
    if not isinstance(threads, dict):
        return Text("")
    decode, most = threads.get("decode"), threads.get("max")
    text = Text(f"CPU threads {decode} of {most}")
    if isinstance(decode, int) and isinstance(most, int) and decode < most:
        text.append(f" · {threads.get('reason', '')}", style="bold yellow")
    elif threads.get("mode") == "fixed":
        text.append(" (fixed)", style="dim")
    return text


def adapters_text(entry: dict[str, Any]) -> Text:
    """``LoRA 3f2a9c8d0e1f ×0.5 · 3.7 MB · on the runner of BASE with A, B``: a model's
    adapters and the runner it shares (the base loaded once); empty for a plain model."""
    runner = entry.get("runner")
    if not isinstance(runner, dict):
        return Text("")
    from localllm._format import human_size

    name = str(entry.get("name", ""))
    adapters = [
        f"{str(a.get('digest', '')).removeprefix('sha256:')[:12]} ×{a.get('scale', 1.0):g} · "
        f"{human_size(int(a.get('size', 0) or 0))}"
        for a in entry.get("adapters") or []
    ]
    text = Text("LoRA " + ", ".join(adapters) if adapters else "no LoRA", style="bold")
    owner = str(runner.get("loaded_by", name))
    others = [str(m) for m in runner.get("models") or [] if m not in (name, owner)]
    where = " · own runner" if owner == name else f" · on the runner of {owner}"
    text.append(where + (f" with {', '.join(others)}" if others else ""), style="dim")
    return text


class LoadedModelCard(Vertical, can_focus=True):
    """Live view of one loaded model; focus it and press ``u`` (or its button) to unload."""

    # The history row's own rules (the rest of the card's are in the dashboard's stylesheet).
    DEFAULT_CSS = """
    LoadedModelCard .history {
        display: none;
    }
    LoadedModelCard .history.-shown {
        display: block;
    }
    LoadedModelCard Sparkline.ttft-history > .sparkline--max-color {
        color: $warning;
    }
    LoadedModelCard Sparkline.ttft-history > .sparkline--min-color {
        color: $warning 30%;
    }
    LoadedModelCard .history-text {
        width: 20;
        margin-left: 1;
        text-align: right;
        color: $text-muted;
    }
    """

    class UnloadRequested(Message):
        """The user asked to unload this card's model."""

        def __init__(self, model: str) -> None:
            super().__init__()
            self.model = model
            """The model's name."""

    def __init__(self, model: str, *, history: int) -> None:
        super().__init__(classes="loaded-model")
        self.model = model
        """The model's name."""
        self.border_title = model
        self.decode_history: deque[float] = deque([0.0] * history, maxlen=history)
        """Decode tokens/s, one sample per stats update, the last minute."""
        self.prefill_history: deque[float] = deque([0.0] * history, maxlen=history)
        """Prefill tokens/s over the same window."""
        self.slot_states: list[str] = []
        """Each slot's state in the latest update."""
        self.decode_rate = 0.0
        """Decode tokens/s in the latest update."""
        self.prefill_rate = 0.0
        """Prefill tokens/s in the latest update."""
        self._slots = Label("", classes="slots")
        self._requests = Label("", classes="requests")
        self._threads = Label("", classes="threads")
        self._adapters = Label("", classes="adapters")
        self._adapters.display = False
        self._kv = ProgressBar(total=1, show_eta=False, classes="kv")
        self._kv_cells = Label("", classes="kv-cells")
        self._decode = Sparkline(list(self.decode_history), classes="decode")
        self._decode_rate = Label(rate(0), classes="decode-rate")
        self._prefill = Sparkline(list(self.prefill_history), classes="prefill")
        self._prefill_rate = Label(rate(0), classes="prefill-rate")
        self._ttfts = Label("", classes="ttfts")
        self._history_row = Horizontal(classes="card-row history")
        self._ttft_history = Sparkline([], classes="ttft-history")
        self._decode_history = Sparkline([], classes="decode decode-history")
        self._history_text = Label("", classes="history-text")
        self.history_requests = 0
        """Requests in the daemon's history of this model (0: none, or not sent)."""

    def compose(self) -> ComposeResult:
        """Build the widget tree."""
        with Horizontal(classes="card-row"):
            yield self._slots
            yield Button("Unload", classes="unload", compact=True)
        yield self._requests
        yield self._threads
        yield self._adapters
        gauges = (
            ("KV cache", self._kv, self._kv_cells),
            ("decode", self._decode, self._decode_rate),
            ("prefill", self._prefill, self._prefill_rate),
        )
        for name, graph, figure in gauges:
            with Horizontal(classes="card-row"):
                yield Label(name, classes="row-name")
                yield graph
                yield figure
        yield self._ttfts
        with self._history_row:
            yield Label("since start", classes="row-name")
            yield self._ttft_history
            yield self._decode_history
            yield self._history_text

    def show(self, entry: dict[str, Any], now: float) -> None:
        """Apply one stats-stream entry for this model (``now`` for the countdown)."""
        slots = list(entry.get("slots") or [])
        self.slot_states = [str(s.get("state", "idle")) for s in slots]
        self.decode_rate = float(entry.get("decode_tokens_per_s") or 0.0)
        self.prefill_rate = float(entry.get("prefill_tokens_per_s") or 0.0)
        self.decode_history.append(self.decode_rate)
        self.prefill_history.append(self.prefill_rate)
        self.border_subtitle = countdown(entry.get("expires_at"), now)

        total_slots = entry.get("slots_total", len(slots))
        self._slots.update(slot_text(slots) if slots else Text(f"{total_slots} slots", style="dim"))
        self._requests.update(
            f"{entry.get('active_requests', 0)} running · "
            f"{entry.get('queued_requests', 0)} waiting · "
            f"{entry.get('requests_total', 0)} done · "
            f"context {entry.get('context_length', 0):,} per slot"
        )
        self._threads.update(threads_text(entry.get("threads")))
        lora = adapters_text(entry)
        self._adapters.update(lora)
        self._adapters.display = bool(lora.plain)
        used = int(entry.get("kv_cells_used") or 0)
        total = int(entry.get("kv_cells_total") or 0)
        self._kv.update(total=max(total, 1), progress=used)
        self._kv_cells.update(f"{used:,} / {total:,} cells")
        self._decode.data = list(self.decode_history)
        self._prefill.data = list(self.prefill_history)
        self._decode_rate.update(rate(self.decode_rate))
        self._prefill_rate.update(rate(self.prefill_rate))
        recent = [r for r in entry.get("recent") or [] if r.get("completion_tokens")]
        ttfts = [duration_ms(float(r.get("ttft_ms", 0))) for r in recent[-_RECENT_TTFTS:]]
        line = "TTFT of recent requests: " + (" · ".join(reversed(ttfts)) if ttfts else "none yet")
        drafted = sum(int(r.get("draft_tokens") or 0) for r in recent)
        if drafted:
            accepted = sum(int(r.get("draft_accepted") or 0) for r in recent)
            line += f"  ·  speculative drafts accepted {accepted / drafted:.0%} of {drafted:,}"
        self._ttfts.update(line)
        self._show_history(entry.get("history"))

    def _show_history(self, history: Any) -> None:
        """TTFT (left) and decode rate (right) of every request since the daemon started."""
        requests = history.get("requests", 0) if isinstance(history, dict) else 0
        ttfts = history.get("ttft_ms") if requests else None
        rates = history.get("decode_tps") if requests else None
        shown = bool(isinstance(ttfts, list) and ttfts and isinstance(rates, list) and rates)
        self.history_requests = int(requests) if shown else 0
        self._history_row.set_class(shown, "-shown")
        if not shown:
            return
        assert isinstance(ttfts, list) and isinstance(rates, list)
        self._ttft_history.data = [float(v) for v in ttfts]
        self._decode_history.data = [float(v) for v in rates]
        latest = f"{duration_ms(float(ttfts[-1]))} · {rate(float(rates[-1]))}"
        self._history_text.update(latest)
        self._history_row.tooltip = (
            f"{requests:,} requests since the daemon started: TTFT (left), decode rate (right)"
        )

    def on_button_pressed(self, event: Button.Pressed) -> None:
        """The Unload button."""
        event.stop()
        self.post_message(self.UnloadRequested(self.model))
