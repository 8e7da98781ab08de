"""Compare models (F12 or ``/compare`` on the chat screen): one question sent to two or three
models at once, their answers streaming side by side, each column with its own TTFT, prefill
and decode speed and the CPU threads its runner had while it answered (the daemon shares the
cores between models working at once). Before sending, the daemon's memory plan
(``/api/plan``) says whether the models fit together. Picking an answer (1, 2, 3) continues
the chat with it; every answer is saved as a branch of the chat (``n/N``), so none is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Footer, Input, Label, SelectionList
from textual.widgets.selection_list import Selection

from localllm._exceptions import LocalLLMError

from ..chats import StoredMessage
from ..widgets.loaded_model import threads_text
from ..widgets.message import MessageView

if TYPE_CHECKING:
    from localllm.client import AsyncClient

    from ..chats import Chat

__all__ = ["MAX_MODELS", "CompareScreen", "Compared", "fit_sentence"]

MAX_MODELS = 3
"""Models one question goes to at most."""
_NOT_STATS = ("message", "model", "created_at", "done")
_STATS_SECONDS = 0.5
"""How often the runners' threads are read while the answers stream."""


@dataclass
class Compared:
    """What the comparison leaves for the chat: the question and every answer, the picked
    one's index."""

    question: str
    """The question asked."""
    answers: list[StoredMessage]
    """One answer per model (``model`` set), in column order."""
    picked: int
    """The index of the answer the chat goes on with."""


def fit_sentence(plans: dict[str, dict[str, Any]]) -> tuple[bool, str]:
    """Whether the models of ``plans`` (``/api/plan`` answers by name) fit in memory together,
    and a sentence that says so: a refusal of one is named; the RAM the models not loaded
    yet need together is compared with the RAM budget their plans give."""
    refused = [f"{name}: {p['refusal']}" for name, p in plans.items() if "refusal" in p]
    if refused:
        return False, "Does not fit: " + "; ".join(refused)
    needs = {
        name: int(p["plan"].get("size", 0)) for name, p in plans.items() if not p.get("loaded")
    }
    budgets = [
        min((int(v) for v in p["plan"].get("budgets", {}).values()), default=0)
        for p in plans.values()
    ]
    budget = min((b for b in budgets if b > 0), default=0)
    total = sum(needs.values())
    mib = 1 << 20
    if budget and total > budget:
        return False, (
            f"These models do not fit together: loading {', '.join(needs)} needs "
            f"{total / mib:,.0f} MiB, {budget / mib:,.0f} MiB is free; the daemon will unload "
            "one to load another and the answers will come one after the other"
        )
    loaded = [name for name, p in plans.items() if p.get("loaded")]
    said = f" ({', '.join(loaded)} loaded)" if loaded else ""
    return True, f"They fit together: {total / mib:,.0f} MiB more needed{said}"


class _Column(Vertical):
    """One model's answer: the streaming text, its stats, its runner's threads."""

    def __init__(self, index: int, model: str) -> None:
        super().__init__(classes="column")
        self.index = index
        self.model = model
        """The model answering here."""
        self.view = MessageView("assistant", author=f"{index + 1} · {model}")
        """The answer."""
        self.threads = Label("", classes="threads")
        """The CPU threads its runner had while it answered."""
        self.answer: StoredMessage | None = None
        """The answer once complete (or stopped)."""
        self.threads_seen = False
        """Whether the threads line shows what the runner had."""

    def compose(self) -> ComposeResult:
        """Build the widget tree."""
        with VerticalScroll():
            yield self.view
            yield self.threads


class CompareScreen(ModalScreen[Compared | None]):
    """Ask two or three models the same question; dismisses with what to keep, or None."""

    DEFAULT_CSS = """
    CompareScreen {
        background: $background;
    }
    CompareScreen #compare-top {
        height: auto;
        padding: 0 1;
    }
    CompareScreen #compare-models {
        height: 5;
        width: 1fr;
    }
    CompareScreen #fit {
        height: auto;
        padding: 0 1;
        color: $text-muted;
    }
    CompareScreen #fit.-nofit {
        color: $error;
    }
    CompareScreen #question {
        margin: 0 1;
        background: $boost;
    }
    CompareScreen #columns {
        height: 1fr;
    }
    CompareScreen .column {
        width: 1fr;
        height: 1fr;
        border-left: vkey $border-blurred;
        padding: 0 1;
    }
    CompareScreen .column.-picked {
        border-left: vkey $success;
    }
    CompareScreen .threads {
        color: $text-muted;
        width: 1fr;
        height: auto;
    }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "Close", id="compare.close"),
        Binding("ctrl+enter,ctrl+s", "send", "Send to all", id="compare.send"),
        Binding("1", "pick(0)", "Keep 1", id="compare.pick1"),
        Binding("2", "pick(1)", "Keep 2", id="compare.pick2"),
        Binding("3", "pick(2)", "Keep 3", id="compare.pick3"),
    ]

    def __init__(
        self, client: AsyncClient, chat: Chat, models: list[str], question: str = ""
    ) -> None:
        super().__init__()
        self.client = client
        """The one way to the daemon."""
        self.chat = chat
        """The chat the question continues."""
        self.models = models
        """Every model offered."""
        self.question = question
        """The question, as typed in the chat."""
        self.columns: list[_Column] = []
        """The answers, once sent."""
        self.fits: bool | None = None
        """Whether the picked models fit together (None until the plans are read)."""
        self._streams: list[asyncio.Task[None]] = []

    def compose(self) -> ComposeResult:
        """Build the widget tree."""
        first = self.chat.model
        others = [m for m in self.models if m != first]
        chosen = {first, *(others[:1])}
        with Vertical(id="compare-top"):
            yield Label(
                "Compare: pick 2 or 3 models, then Ctrl+S sends the question to all at once",
                classes="question",
            )
            yield SelectionList[str](
                *(Selection(m, m, m in chosen) for m in self.models), id="compare-models"
            )
            yield Label("", id="fit")
            yield Input(self.question, placeholder="The question", id="question", compact=True)
        yield Horizontal(id="columns")
        yield Footer(compact=True, show_command_palette=False)

    async def on_mount(self) -> None:
        """Say whether the models picked fit together."""
        self.query_one("#question", Input).focus()
        await self.check_fit()

    @property
    def picked_models(self) -> list[str]:
        """The models ticked, in the list's order."""
        ticked = set(self.query_one("#compare-models", SelectionList).selected)
        return [m for m in self.models if m in ticked]

    @on(SelectionList.SelectedChanged, "#compare-models")
    async def _models_changed(self) -> None:
        await self.check_fit()

    async def check_fit(self) -> None:
        """Ask the daemon's memory plan for each model picked; say whether they fit
        together."""
        fit = self.query_one("#fit", Label)
        models = self.picked_models
        if not 2 <= len(models) <= MAX_MODELS:
            self.fits = None
            fit.update(f"Pick 2 or {MAX_MODELS} models ({len(models)} picked)")
            return
        options = self.chat.options or None
        try:
            answers = await asyncio.gather(*(self.client.plan(m, options) for m in models))
        except LocalLLMError as exc:
            self.fits = None
            fit.update(f"Cannot read the memory plan: {exc}")
            return
        if models != self.picked_models:
            return  # changed while the plans were read
        self.fits, sentence = fit_sentence(dict(zip(models, answers, strict=True)))
        fit.update(sentence)
        fit.set_class(not self.fits, "-nofit")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Send before the answers came, pick among them after."""
        if action == "send":
            return not self.columns
        if action == "pick":
            index = int(str(parameters[0])) if parameters else 0
            if index >= len(self.columns):
                return False
            return not self._streaming()
        return True

    def _streaming(self) -> bool:
        return any(not task.done() for task in self._streams)

    async def action_send(self) -> None:
        """Send the question to every model picked at once."""
        models = self.picked_models
        question = self.query_one("#question", Input).value.strip()
        if self.columns:
            return
        if not 2 <= len(models) <= MAX_MODELS:
            self.notify(f"Pick 2 or {MAX_MODELS} models", severity="warning")
            return
        if not question:
            self.notify("Write the question first", severity="warning")
            return
        self.question = question
        self.columns = [_Column(i, model) for i, model in enumerate(models)]
        await self.query_one("#columns", Horizontal).mount_all(self.columns)
        self.query_one("#compare-models").disabled = True
        self.query_one("#question", Input).disabled = True
        messages = [*self.chat.request_messages(), {"role": "user", "content": question}]
        self._streams = [
            asyncio.create_task(self._answer(column, messages)) for column in self.columns
        ]
        watcher = asyncio.create_task(self._watch_threads())
        self.refresh_bindings()
        self.run_worker(self._wait(watcher), group="compare")

    async def _wait(self, watcher: asyncio.Task[None]) -> None:
        await asyncio.gather(*self._streams, return_exceptions=True)
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        if self.is_attached:  # not closed meanwhile
            self.refresh_bindings()
            self.notify("Press 1, 2 or 3 to go on with that answer (every answer is kept)")

    async def _answer(self, column: _Column, messages: list[dict[str, Any]]) -> None:
        view = column.view
        stream = view.stream()
        parts: list[str] = []
        thinking: list[str] = []
        stats: dict[str, Any] = {"done_reason": "stopped"}
        try:
            async for chunk in self.client.chat_stream(
                column.model, messages, options=self.chat.options or None, think=self.chat.think
            ):
                message = chunk.get("message", {})
                thinking.append(message.get("thinking", ""))
                if piece := message.get("content", ""):
                    parts.append(piece)
                    view.streamed_chunks += 1
                    await stream.write(piece)
                if chunk.get("done"):
                    stats = {k: v for k, v in chunk.items() if k not in _NOT_STATS}
        except LocalLLMError as exc:
            stats = {"error": str(exc)}
        except Exception as exc:  # a broken connection must not take the UI down
            stats = {"error": f"{exc.__class__.__name__}: {exc}"}
        finally:
            await stream.stop()
            view.stats = stats
            if not column.threads_seen:  # too quick for the watcher: what it has now
                await self._read_threads([column])
            # last: a column with its answer is done
            column.answer = StoredMessage(
                "assistant", "".join(parts), stats, thinking="".join(thinking), model=column.model
            )

    async def _watch_threads(self) -> None:
        """Show each runner's CPU threads while its answer streams."""
        while True:
            await self._read_threads([c for c in self.columns if c.answer is None])
            await asyncio.sleep(_STATS_SECONDS)

    async def _read_threads(self, columns: list[_Column]) -> None:
        """Show the threads the runners of ``columns`` have now (and how many requests they
        answer: the cores are shared between the models at work)."""
        try:
            snapshot = await self.client.stats()
        except LocalLLMError:
            return
        by_name = {str(e.get("name", "")): e for e in snapshot.get("models", [])}
        for column in columns:
            if column.answer is not None:
                continue  # done: the line keeps what it had while it answered
            entry = by_name.get(column.model) or by_name.get(f"{column.model}:latest")
            if entry is not None:
                text = threads_text(entry.get("threads"))
                text.append(f" · {entry.get('active_requests', 0)} answering")
                column.threads.update(text)
                column.threads_seen = True

    def action_pick(self, index: int) -> None:
        """Go on with the answer of column ``index`` (the others are kept as branches)."""
        if self._streaming() or index >= len(self.columns):
            return
        answers = [c.answer or StoredMessage("assistant", "", model=c.model) for c in self.columns]
        self.dismiss(Compared(self.question, answers, index))

    def action_close(self) -> None:
        """Close without keeping anything; answers still streaming stop."""
        for task in self._streams:
            task.cancel()
        self.dismiss(None)

    @on(Input.Submitted, "#question")
    async def _submitted(self) -> None:
        await self.action_send()
