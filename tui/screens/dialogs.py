"""Small modal dialogs: confirm, ask for a name, a chat's options, a quantization target."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Grid, Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, TextArea

if TYPE_CHECKING:
    from localllm.client import Think

__all__ = ["THINK_CHOICES", "ChatOptionsDialog", "ConfirmDialog", "NameDialog", "QuantizeDialog"]


class _Dialog(ModalScreen[Any]):
    """Escape cancels (dismisses with ``None``)."""

    CSS_PATH = "dialogs.tcss"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", id="dialog.cancel")
    ]

    def action_cancel(self) -> None:
        """Close without an answer."""
        self.dismiss(None)

    @on(Button.Pressed, ".cancel")
    def _cancel_pressed(self) -> None:
        self.dismiss(None)


class ConfirmDialog(_Dialog):
    """A yes/no question; dismisses with True when confirmed."""

    def __init__(self, question: str, confirm: str = "OK") -> None:
        super().__init__()
        self.question = question
        """What is asked."""
        self.confirm = confirm
        """The confirming button's label."""

    def compose(self) -> ComposeResult:
        """Build the widget tree."""
        with Vertical(classes="dialog"):
            yield Label(self.question, classes="question")
            with Horizontal(classes="buttons"):
                yield Button(self.confirm, variant="error", id="confirm", compact=True)
                yield Button("Cancel", classes="cancel", compact=True)

    def on_mount(self) -> None:
        """Focus the confirming button."""
        self.query_one("#confirm").focus()

    @on(Button.Pressed, "#confirm")
    def _confirmed(self) -> None:
        self.dismiss(True)


class NameDialog(_Dialog):
    """Ask for a model name; dismisses with the text (stripped, never empty)."""

    def __init__(self, title: str, value: str = "", placeholder: str = "") -> None:
        super().__init__()
        self.title_text = title
        """The question."""
        self.value = value
        """Pre-filled text."""
        self.placeholder = placeholder
        """Hint shown while empty."""

    def compose(self) -> ComposeResult:
        """Build the widget tree."""
        with Vertical(classes="dialog"):
            yield Label(self.title_text, classes="question")
            yield Input(self.value, placeholder=self.placeholder, id="name", compact=True)
            with Horizontal(classes="buttons"):
                yield Button("OK", variant="primary", id="ok", compact=True)
                yield Button("Cancel", classes="cancel", compact=True)

    @on(Input.Submitted)
    @on(Button.Pressed, "#ok")
    def _submit(self) -> None:
        text = self.query_one("#name", Input).value.strip()
        if text:
            self.dismiss(text)


def _number(text: str, kind: type[int] | type[float]) -> int | float | None:
    text = text.strip()
    if not text:
        return None
    return kind(text)


# (option, label, type, placeholder) of the numeric chat options the dialog edits.
_OPTION_FIELDS: tuple[tuple[str, str, type[int] | type[float], str], ...] = (
    ("temperature", "Temperature", float, "model default"),
    ("num_ctx", "Context (tokens)", int, "daemon default"),
    ("num_predict", "Max answer tokens", int, "no limit"),
)


THINK_CHOICES: tuple[tuple[str, str, Think | None], ...] = (
    ("default", "Model default", None),
    ("off", "Off", False),
    ("on", "On", True),
    ("low", "Low", "low"),
    ("medium", "Medium", "medium"),
    ("high", "High", "high"),
)
"""The think settings a chat offers: (key, label, the ``think`` value sent)."""


def _think_key(think: Think | None) -> str:
    """The choice showing ``think`` (the model default for a value not offered)."""
    return next((key for key, _, value in THINK_CHOICES if value == think), "default")


class ChatOptionsDialog(_Dialog):
    """A chat's system prompt, options and ``think``; dismisses with
    ``(system, options, think)``."""

    def __init__(self, system: str, options: dict[str, Any], think: Think | None = None) -> None:
        super().__init__()
        self.system = system
        """The current system prompt."""
        self.options = dict(options)
        """The current options."""
        self.think = think
        """The current ``think`` (None: the model's default)."""

    def compose(self) -> ComposeResult:
        """Build the widget tree."""
        with Vertical(classes="dialog wide"):
            yield Label("Chat options", classes="question")
            yield Label("System prompt")
            yield TextArea(self.system, id="system", compact=True)
            with Grid(classes="fields"):
                for key, label, kind, placeholder in _OPTION_FIELDS:
                    value = self.options.get(key)
                    yield Label(label)
                    yield Input(
                        "" if value is None else str(value),
                        type="number" if kind is float else "integer",
                        placeholder=placeholder,
                        id=key,
                        compact=True,
                    )
                yield Label("Thinking")
                yield Select(
                    [(label, key) for key, label, _ in THINK_CHOICES],
                    value=_think_key(self.think),
                    allow_blank=False,
                    id="think",
                    compact=True,
                )
            yield Label("", id="error")
            with Horizontal(classes="buttons"):
                yield Button("Save", variant="primary", id="save", compact=True)
                yield Button("Cancel", classes="cancel", compact=True)

    @on(Button.Pressed, "#save")
    def _save(self) -> None:
        keys = [key for key, *_ in _OPTION_FIELDS]
        options: dict[str, Any] = {k: v for k, v in self.options.items() if k not in keys}
        try:
            for key, _, kind, _ in _OPTION_FIELDS:
                value = _number(self.query_one(f"#{key}", Input).value, kind)
                if value is not None:
                    options[key] = value
        except ValueError as exc:
            self.query_one("#error", Label).update(f"Not a number: {exc}")
            return
        if options.get("temperature", 0) < 0 or options.get("num_ctx", 1) < 1:
            self.query_one("#error", Label).update("Temperature must be ≥ 0 and context ≥ 1")
            return
        choice = self.query_one("#think", Select).value
        think = next((value for key, _, value in THINK_CHOICES if key == choice), None)
        self.dismiss((self.query_one("#system", TextArea).text, options, think))

    def on_mount(self) -> None:
        """Fit the think picker to the one-line rows of the options grid (the dialogs' CSS
        gives a Select a margin below, which a grid row of one line would cut)."""
        self.query_one("#think", Select).styles.margin = 0


class QuantizeDialog(_Dialog):
    """Pick a quantization type and the new model's name; dismisses with ``(type, name)``."""

    def __init__(self, source: str, types: list[str], default: str = "Q4_K_M") -> None:
        super().__init__()
        self.source = source
        """The model to quantize."""
        self.types = types
        """Targets offered."""
        self.default = default if default in types else types[0]
        """The preselected target."""

    def target_name(self, quant: str) -> str:
        """``name:tag-q8_0``: the suggested name for a quantized copy."""
        base, _, tag = self.source.rpartition(":")
        if not base:
            base, tag = self.source, "latest"
        return f"{base}:{tag}-{quant.lower()}"

    def compose(self) -> ComposeResult:
        """Build the widget tree."""
        with Vertical(classes="dialog"):
            yield Label(f"Quantize {self.source}", classes="question")
            yield Label("Type")
            yield Select(
                [(t, t) for t in self.types],
                value=self.default,
                allow_blank=False,
                id="type",
                compact=True,
            )
            yield Label("New model")
            yield Input(self.target_name(self.default), id="target", compact=True)
            with Horizontal(classes="buttons"):
                yield Button("Quantize", variant="primary", id="ok", compact=True)
                yield Button("Cancel", classes="cancel", compact=True)

    @on(Select.Changed, "#type")
    def _type_changed(self, event: Select.Changed) -> None:
        self.query_one("#target", Input).value = self.target_name(str(event.value))

    @on(Input.Submitted)
    @on(Button.Pressed, "#ok")
    def _submit(self) -> None:
        target = self.query_one("#target", Input).value.strip()
        quant = self.query_one("#type", Select).value
        if target and isinstance(quant, str):
            self.dismiss((quant, target))
