"""The Bench screen: pick a model and a sweep, watch the points appear on the curve as each
level finishes, with the same results table as ``localllm bench`` below.

The measuring is :mod:`localllm.bench` (the CLI's own load generator, through the app's
client); the chart and the table come from the same functions as the CLI's, so both read the
same way. A concurrency sweep draws aggregate tok/s against TTFT p50 (one point per level);
a prompt-length sweep draws TTFT against prompt length, cold and cached.
"""

from __future__ import annotations

from typing import Any, ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.reactive import reactive
from textual.widgets import Button, DataTable, Footer, Input, Label, Select
from textual_plotext import PlotextPlot

from localllm.bench import (
    BenchError,
    BenchResult,
    LocalllmDriver,
    Point,
    Target,
    Workload,
    run_bench,
)
from localllm.bench.report import chart_series, marker, point_rows

from ..widgets.status import StatusBar
from .base import MainScreen

__all__ = ["BenchScreen"]

_SWEEPS = {
    "concurrency": ("Concurrency", "1,2,4,8"),
    "prompt": ("Prompt length", "128,512,1024,2048"),
}
# The chart of each sweep: (index in the report's charts, title, x label, y label).
_CHARTS = {
    "concurrency": (0, "throughput vs latency", "TTFT p50 (ms)", "aggregate tok/s"),
    "prompt": (2, "TTFT vs prompt length", "prompt tokens", "TTFT p50 (ms)"),
}


def parse_levels(text: str) -> list[int]:
    """``"1, 2,4"`` → ``[1, 2, 4]``; raises :class:`~localllm.bench.BenchError` on anything
    that is not a list of whole numbers of at least 1."""
    try:
        values = [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise BenchError(
            f"levels must be whole numbers separated by commas, not {text!r}"
        ) from None
    if not values or any(v < 1 for v in values):
        raise BenchError("levels must be whole numbers of at least 1")
    return values


class BenchScreen(MainScreen):
    """Measure the throughput-vs-latency curve of a model, live."""

    MODE = "bench"
    CSS_PATH = "bench.tcss"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("ctrl+r", "run", "Run", id="bench.run"),
        Binding("escape", "stop", "Stop", id="bench.stop"),
    ]

    running: reactive[bool] = reactive(False)
    """True while a sweep runs."""

    def __init__(self) -> None:
        super().__init__()
        self.models: list[str] = []
        """Model names offered in the picker."""
        self.points: list[Point] = []
        """Points of the sweep shown, in the order they finished."""
        self.sweep = "concurrency"
        """The sweep shown: ``concurrency`` or ``prompt``."""
        self.result: BenchResult | None = None
        """The last complete run."""
        self.status = ""
        """The line above the chart (what runs, or how it ended)."""

    def compose(self) -> ComposeResult:
        """Build the widget tree."""
        yield StatusBar(self.MODE)
        with Horizontal(id="bench-controls"):
            yield Select[str]([], prompt="Model", id="bench-model", compact=True)
            yield Select[str](
                [(title, sweep) for sweep, (title, _) in _SWEEPS.items()],
                value="concurrency",
                allow_blank=False,
                id="bench-sweep",
                compact=True,
            )
            yield Input(
                _SWEEPS["concurrency"][1], placeholder="levels", id="bench-levels", compact=True
            )
            yield Input("32", placeholder="tokens", type="integer", id="bench-tokens", compact=True)
            yield Button("Run", id="bench-run", compact=True, variant="primary")
        yield Label("Pick a model and a sweep, then Run (Ctrl+R).", id="bench-status")
        yield PlotextPlot(id="bench-plot")
        yield DataTable(id="bench-table", show_cursor=False, zebra_stripes=True)
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        """Draw the empty chart (Textual then runs :class:`MainScreen`'s own ``on_mount``,
        which watches the daemon)."""
        self.show_points([], self.sweep)

    # -- the daemon -----------------------------------------------------------------------

    async def on_daemon_connected(self) -> None:
        """Offer the store's models (the ones that can generate)."""
        select = self.query_one("#bench-model", Select)
        current = select.value
        names = await self.offer_models(select)
        if names is None:
            return
        self.models = names
        with select.prevent(Select.Changed):
            if isinstance(current, str) and current in self.models:
                select.value = current
            elif self.models:
                select.value = self.models[0]

    async def on_daemon_lost(self) -> None:
        """Stop a running sweep: its requests are failing now."""
        self.action_stop()

    # -- controls -------------------------------------------------------------------------

    @on(Select.Changed, "#bench-sweep")
    def _sweep_picked(self, event: Select.Changed) -> None:
        if isinstance(event.value, str) and event.value != self.sweep and not self.running:
            self.query_one("#bench-levels", Input).value = _SWEEPS[event.value][1]
            self.show_points([], event.value)

    @on(Button.Pressed, "#bench-run")
    def _run_pressed(self) -> None:
        if self.running:
            self.action_stop()
        else:
            self.action_run()

    def watch_running(self, running: bool) -> None:
        """Run becomes Stop while a sweep runs; the inputs are locked."""
        self.query_one("#bench-run", Button).label = "Stop" if running else "Run"
        for selector in ("#bench-model", "#bench-sweep", "#bench-levels", "#bench-tokens"):
            self.query_one(selector).disabled = running
        self.refresh_bindings()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Show Stop only while a sweep runs, Run only when none does."""
        if action == "stop":
            return self.running
        if action == "run":
            return not self.running
        return True

    def action_run(self) -> None:
        """Start the sweep the controls describe."""
        if self.running:
            return
        model = self.query_one("#bench-model", Select).value
        if not isinstance(model, str):
            self.notify("Pick a model first", severity="warning")
            return
        sweep = str(self.query_one("#bench-sweep", Select).value)
        try:
            levels = parse_levels(self.query_one("#bench-levels", Input).value)
            tokens = int(self.query_one("#bench-tokens", Input).value or "0")
            if tokens < 1:
                raise BenchError("tokens must be at least 1")
        except (BenchError, ValueError) as exc:
            self.notify(str(exc), severity="error")
            return
        if sweep == "concurrency":
            workload = Workload(levels=levels, answer_tokens=tokens, prompt_lengths=[])
        else:
            workload = Workload(levels=[], prompt_lengths=levels, prefill_answer_tokens=tokens)
        self.show_points([], sweep)
        self.running = True
        self.run_sweep(model, workload)

    def action_stop(self) -> None:
        """Stop the running sweep (the points measured so far stay)."""
        self.workers.cancel_group(self, "bench")

    # -- running --------------------------------------------------------------------------

    @work(exclusive=True, group="bench")
    async def run_sweep(self, model: str, workload: Workload) -> None:
        """Measure ``workload`` on ``model`` through the app's client, drawing as it goes."""
        target = Target(label=model, driver=LocalllmDriver(self.llm.client), model=model)
        try:
            self.result = await run_bench(
                [target],
                workload,
                on_progress=self._progress,
                on_point=self._point,
                cap_levels=False,
            )
            self._set_status(self._summary(self.result))
        except BenchError as exc:
            self._set_status(f"Could not run: {exc}")
        except Exception as exc:  # the screen must survive whatever the run hits
            self._set_status(f"The run stopped: {type(exc).__name__}: {exc}")
        except BaseException:  # cancelled (Stop, or the daemon went away)
            self._set_status(f"Stopped after {len(self.points)} levels")
            raise
        finally:
            self.running = False

    def _summary(self, result: BenchResult) -> str:
        failed = result.failed
        problems = [t.error for t in result.targets if t.error]
        text = f"Done: {len(result.samples)} requests"
        if failed:
            first = next((p.errors[0] for p in result.points if p.errors), "")
            text += f", {failed} failed ({first})"
        elif problems:
            text += f" ({problems[0]})"
        return text

    def _progress(self, done: int, total: int, what: str) -> None:
        if total:
            self._set_status(f"{done}/{total} · {what}")
        else:
            self._set_status(what)

    def _point(self, point: Point) -> None:
        if point not in self.points:
            self.points.append(point)
        self.show_points(self.points, self.sweep)

    def _set_status(self, text: str) -> None:
        self.status = text
        self.query_one("#bench-status", Label).update(text)

    # -- drawing --------------------------------------------------------------------------

    def show_points(self, points: list[Point], sweep: str) -> None:
        """Draw ``points`` of a ``sweep`` on the chart and in the table (tests and the run
        both come through here)."""
        self.points = points
        self.sweep = sweep
        index, title, xlabel, ylabel = _CHARTS[sweep]
        plot = self.query_one("#bench-plot", PlotextPlot)
        plt = plot.plt
        plt.clear_data()
        plt.clear_figure()
        for number, (label, xs, ys, _) in enumerate(chart_series(points)[index]):
            plt.plot(xs, ys, label=label, marker=marker(number))
        plt.title(title)
        plt.xlabel(xlabel)
        plt.ylabel(ylabel)
        plot.refresh()
        table = self.query_one("#bench-table", DataTable)
        headers, rows = point_rows(points, [], sweep)
        table.clear(columns=True)
        # Widths fixed from the content: the table then never re-measures itself later
        # (and reads the same in every frame).
        for index, header in enumerate(headers):
            width = max([len(header), *(len(row[index]) for row in rows)])
            table.add_column(header, width=width)
        table.add_rows(rows)

    def summary_rows(self) -> list[list[Any]]:
        """The table as shown (for tests)."""
        table = self.query_one("#bench-table", DataTable)
        return [list(table.get_row_at(i)) for i in range(table.row_count)]
