"""The Discover view of the models screen: search the Hugging Face Hub, see a repository's
quantizations with their fit on this machine (a badge) and predicted speed, pull one.

Reached with ``s`` on the models screen; Escape goes back. Enter in the search box searches
(``n`` shows the next page); Enter on a result lists its quantizations (the daemon reads one
GGUF header and plans each, ``/api/hub/show``); ``p`` pulls the highlighted quantization, or
the best fit the daemon picks when none is highlighted: the models screen shows the pull's
progress, and the model joins its list when it is done.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, ClassVar, cast

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Label

from localllm._exceptions import DaemonError
from localllm._format import human_count, human_size

from ..format import modified

if TYPE_CHECKING:
    from ..host import Host

__all__ = ["FIT_BADGES", "DiscoverScreen", "fit_badge"]

FIT_BADGES = {
    "gpu": ("● GPU", "green"),
    "partial": ("◐ partial", "yellow"),
    "cpu": ("○ CPU", "cyan"),
    "none": ("✕ too large", "red"),
}
"""The fit badge of each verdict (``fit`` of ``/api/hub/show``) and its colour."""

_RESULTS = ("Repository", "Params", "Downloads", "Likes", "Updated")
_QUANTS = ("Quant", "Size", "Fit", "Context", "Decode", "Prefill")


def fit_badge(quant: dict[str, Any]) -> Text:
    """The coloured badge for a quantization's fit, ``≈`` when its shapes were scaled from
    another quantization's header."""
    label, colour = FIT_BADGES.get(str(quant.get("fit")), ("?", "white"))
    mark = "" if quant.get("shapes") == "header" else "≈"
    return Text(mark + label, style=f"bold {colour}")


def _speed(quant: dict[str, Any], key: str) -> str:
    value = (quant.get("predicted") or {}).get(key)
    return f"{value:,.0f} tok/s" if isinstance(value, int | float) and value > 0 else "-"


class DiscoverScreen(Screen[None]):
    """Search the Hub, look at a repository's quantizations, pull one."""

    CSS_PATH = "discover.tcss"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "Back", id="discover.back"),
        Binding("p", "pull", "Pull", id="discover.pull"),
        Binding("n", "next_page", "Next page", id="discover.next"),
        Binding("slash", "focus_search", "Search", id="discover.search"),
    ]

    def __init__(self, pull: Callable[[str], Awaitable[object]], query: str = "") -> None:
        super().__init__()
        self.pull = pull
        """Starts a pull where its progress shows (the models screen's)."""
        self.query_text = query
        """What was searched last."""
        self.results: list[dict[str, Any]] = []
        """The repositories found."""
        self.next_cursor: str | None = None
        """The Hub's cursor for the next page."""
        self.repository: dict[str, Any] | None = None
        """``/api/hub/show``'s answer for the chosen repository."""

    @property
    def llm(self) -> Host:
        """The app, typed as what the screens need of it."""
        return cast("Host", self.app)

    def compose(self) -> ComposeResult:
        """Build the widget tree."""
        with Vertical(id="discover-body"):
            yield Input(
                self.query_text,
                placeholder="search Hugging Face for GGUF models (Enter)",
                id="discover-query",
            )
            results: DataTable[str] = DataTable(
                id="discover-results", cursor_type="row", zebra_stripes=True
            )
            results.add_columns(*_RESULTS)
            yield results
            yield Label("", id="discover-repo")
            quants: DataTable[Any] = DataTable(
                id="discover-quants", cursor_type="row", zebra_stripes=True
            )
            quants.add_columns(*_QUANTS)
            yield quants
            yield Label("", id="discover-status")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        """Focus the search box; search at once when opened with words."""
        self.query_one("#discover-query", Input).focus()
        if self.query_text:
            self.search(self.query_text)

    def _status(self, text: str) -> None:
        self.query_one("#discover-status", Label).update(text)

    # -- search --------------------------------------------------------------------------

    @on(Input.Submitted, "#discover-query")
    def _submitted(self, event: Input.Submitted) -> None:
        self.search(event.value.strip())

    @work(exclusive=True, group="discover-search")
    async def search(self, query: str, cursor: str | None = None) -> None:
        """Ask the daemon's ``/api/search`` for a page of results."""
        self.query_text = query
        self._status("searching Hugging Face…")
        try:
            page = await self.llm.client.search(query, cursor=cursor)
        except DaemonError as exc:
            self._status(f"search failed: {exc}")
            return
        self.results = list(page.get("models") or [])
        self.next_cursor = page.get("next_cursor")
        table = self.query_one("#discover-results", DataTable)
        table.clear()
        now = self.llm.clock()
        for model in self.results:
            table.add_row(
                str(model["repo_id"]),
                human_count(model.get("parameters")),
                human_count(model.get("downloads")),
                human_count(model.get("likes")),
                modified(model.get("last_modified"), now),
                key=str(model["name"]),
            )
        more = " (n: next page)" if self.next_cursor else ""
        found = f"{len(self.results)} repositories{more}; Enter shows one's quantizations"
        self._status(found if self.results else f"nothing matches {query!r}")
        if self.results:
            table.focus()

    def action_next_page(self) -> None:
        """The next page of the same search."""
        if self.next_cursor:
            self.search(self.query_text, self.next_cursor)

    def action_focus_search(self) -> None:
        """Back to the search box."""
        self.query_one("#discover-query", Input).focus()

    # -- a repository ----------------------------------------------------------------------

    @on(DataTable.RowSelected, "#discover-results")
    def _chosen(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is not None:
            self.show_repository(str(event.row_key.value))

    @work(exclusive=True, group="discover-show")
    async def show_repository(self, name: str) -> None:
        """Ask the daemon how each quantization of ``name`` fits and runs here."""
        self._status(f"reading {name}'s quantizations and planning them…")
        try:
            data = await self.llm.client.hub_show(name)
        except DaemonError as exc:
            self._status(f"{name}: {exc}")
            return
        self.repository = data
        table = self.query_one("#discover-quants", DataTable)
        table.clear()
        for quant in data.get("quants") or []:
            slots, context = quant.get("slots"), quant.get("context_length")
            table.add_row(
                str(quant["label"]) + (" (split)" if quant.get("split") else ""),
                human_size(int(quant.get("size") or 0)),
                fit_badge(quant),
                f"{slots}×{context:,}" if isinstance(context, int) else "-",
                _speed(quant, "decode"),
                _speed(quant, "prefill"),
                key=str(quant["tag"]),
            )
        info = data.get("info") or {}
        vision = " · vision" if data.get("projectors") else ""
        gated = " · gated: needs HF_TOKEN" if info.get("gated") else ""
        self.query_one("#discover-repo", Label).update(
            f"{data['model']} · {info.get('architecture') or '?'}{vision}{gated}"
        )
        self._status("p pulls the highlighted quantization (≈: sizes scaled from another's header)")
        table.focus()

    # -- pulling -----------------------------------------------------------------------------

    def action_pull(self) -> None:
        """Pull the highlighted quantization (or let the daemon pick the best fit) and go
        back to the models screen, which shows the pull's progress."""
        if self.repository is None:
            self._status("choose a repository first (Enter on a result)")
            return
        table = self.query_one("#discover-quants", DataTable)
        name = str(self.repository["model"])
        if table.row_count and table.has_focus and 0 <= table.cursor_row < table.row_count:
            tag = table.coordinate_to_cell_key((table.cursor_row, 0)).row_key.value
            name = f"{name}:{tag}"
        self.dismiss(None)
        self.app.call_later(self.pull, name)

    def action_back(self) -> None:
        """Back to the models screen."""
        self.dismiss(None)
