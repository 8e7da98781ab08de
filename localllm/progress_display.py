"""Progress of pulls and quantizations in the terminal: a ``rich`` bar per layer.

Fed with :class:`~localllm.sources.progress.PullProgress` events, from the library directly or
parsed back from the daemon's ``/api/pull`` stream, so both look the same. Events with a total
get a bar (size, speed, time left); the others are printed once as status lines. When the
output is not a terminal, only the status lines and one line per finished bar are printed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._format import human_size

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, Task, TaskID

    from .sources.progress import PullProgress

__all__ = ["ProgressView"]


def _rate_text(rate: float | None) -> str:
    return f"{human_size(rate)}/s" if rate else ""


def _eta_text(seconds: float | None) -> str:
    if seconds is None:
        return ""
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class ProgressView:
    """Renders progress events; use as a context manager around the operation."""

    def __init__(self, console: Console | None = None) -> None:
        from rich.console import Console

        self.console = console or Console(stderr=True, highlight=False)
        self._progress: Progress | None = None
        self._tasks: dict[str, TaskID] = {}
        self._finished: set[str] = set()
        self._last_status: str | None = None

    def __enter__(self) -> ProgressView:
        if self.console.is_terminal:
            self._progress = self._make_progress()
            self._progress.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def _make_progress(self) -> Progress:
        from rich.progress import BarColumn, DownloadColumn, Progress, ProgressColumn, TextColumn
        from rich.text import Text

        class RateColumn(ProgressColumn):
            def render(self, task: Task) -> Text:
                return Text(_rate_text(task.fields.get("rate")), style="progress.data.speed")

        class EtaColumn(ProgressColumn):
            def render(self, task: Task) -> Text:
                if task.finished:
                    return Text("")
                return Text(_eta_text(task.fields.get("eta")), style="progress.remaining")

        return Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(binary_units=False),
            RateColumn(),
            EtaColumn(),
            console=self.console,
            transient=False,
        )

    def update(self, event: PullProgress) -> None:
        """Show one event."""
        if event.total is None:
            self._status(event.status)
            return
        key = event.digest or event.status
        completed = event.completed or 0
        if self._progress is None:
            if completed >= event.total and key not in self._finished:
                self._finished.add(key)
                self._print(f"{event.status}: {human_size(event.total)}")
            return
        fields: dict[str, Any] = {"rate": event.bytes_per_second, "eta": event.eta_seconds}
        task = self._tasks.get(key)
        if task is None:
            self._tasks[key] = self._progress.add_task(
                event.status, total=event.total, completed=completed, **fields
            )
        else:
            self._progress.update(task, total=event.total, completed=completed, **fields)

    def _status(self, status: str) -> None:
        if status == self._last_status:
            return
        self._last_status = status
        self._print(status)

    def _print(self, text: str) -> None:
        # Status lines are plain text (no markup, no wrapping: digests stay on one line).
        console = self._progress.console if self._progress is not None else self.console
        console.print(text, markup=False, highlight=False, soft_wrap=True)
