"""The models screen: the store's models, details of one, delete, copy, pull with live progress
(several at once, each cancellable), quantization to a chosen type, the import of an Ollama
store found on this machine with models localllm does not have, and the Discover view of the
Hugging Face Hub (:mod:`.discover`)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any, ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.widgets import DataTable, Footer, Markdown
from textual.worker import Worker

from localllm._exceptions import APIError, DaemonError, LocalLLMError
from localllm._format import human_size, speed_figures, tokens_per_second
from localllm.client import ModelSummary, ShowResponse
from localllm.store.ollama_import import ImportReport, OllamaModel
from localllm.store.quantize import QUANT_TYPES

from ..dom import settle
from ..format import modified
from ..widgets.status import StatusBar
from ..widgets.transfer import TransferPanel
from .base import MainScreen
from .dialogs import ConfirmDialog, NameDialog, QuantizeDialog

__all__ = ["SPEED_RETRY_S", "ModelsScreen", "details_markdown", "speed_markdown"]

SPEED_RETRY_S = 3.0
"""While the daemon measures this machine's speed, the details ask for it again this often."""

_COLUMNS = ("Name", "Size", "Quantization", "Parameters", "Modified")
_TEMPLATE_LINES = 8


class ImportPanel(TransferPanel):
    """A transfer panel for an Ollama import: its bars verify blobs already on this machine, so
    the status keeps naming the model being imported instead of saying "downloading"."""

    async def show_progress(self, line: dict[str, Any]) -> None:
        """Apply one progress line of the importer."""
        status = self.status
        await super().show_progress(line)
        if line.get("digest") and status:
            self.status = status
            self._status.update(status)


def details_markdown(name: str, show: ShowResponse) -> str:
    """What ``/api/show`` says about a model, as Markdown."""
    details = show.get("details") or {}
    info = show.get("model_info") or {}
    family = details.get("family") or ""
    context = next((v for k, v in info.items() if k.endswith(".context_length")), None)
    facts = [
        f"family **{family}**" if family else "",
        f"**{details['parameter_size']}** parameters" if details.get("parameter_size") else "",
        f"**{details['quantization_level']}**" if details.get("quantization_level") else "",
        f"context **{context:,}**" if isinstance(context, int) else "",
        ", ".join(show.get("capabilities") or []),
    ]
    lines = [f"### {name}", " · ".join(f for f in facts if f)]
    if show.get("parameters"):
        lines += ["", "**Parameters**", "```", show["parameters"].strip(), "```"]
    if show.get("system"):
        lines += ["", "**System prompt**", "", show["system"].strip()]
    if show.get("template"):
        template = show["template"].strip().splitlines()
        shown = template[:_TEMPLATE_LINES] + (["…"] if len(template) > _TEMPLATE_LINES else [])
        lines += ["", "**Template**", "```", *shown, "```"]
    if show.get("license"):
        first = str(show["license"]).strip().splitlines()
        lines += ["", "**License** " + (first[0] if first else "")]
    return "\n".join(lines)


def speed_markdown(speed: dict[str, Any]) -> str:
    """The predicted and measured speed of ``/api/speed``, as a Markdown paragraph."""
    figures, why = speed_figures(speed)
    parts = []
    for kind, predicted, measured in figures:
        said = [f"predicted **{tokens_per_second(predicted)}**"] if predicted else []
        if measured:
            said.append(f"measured **{measured:,.0f}**")
        parts.append(f"{kind} {' / '.join(said)} tok/s")
    if not parts and not why:
        return ""
    device = (speed.get("predicted") or {}).get("device")
    where = f" on {device}" if device and not why else ""
    return "**Speed here** " + " · ".join(parts) + where + (f" ({why})" if why else "")


class ModelsScreen(MainScreen):
    """Manage the model store."""

    MODE = "models"
    CSS_PATH = "models.tcss"
    RELOAD_ON_RESUME = True
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("p", "pull", "Pull", id="models.pull"),
        Binding("s", "discover", "Search Hub", id="models.discover"),
        Binding("c", "copy", "Copy", id="models.copy"),
        Binding("d,delete", "delete", "Delete", id="models.delete"),
        Binding("q", "quantize", "Quantize", id="models.quantize"),
        Binding("r", "refresh", "Refresh", id="models.refresh"),
        Binding("x", "cancel_transfer", "Cancel pull", id="models.cancel"),
        # Shown only while an Ollama store with models localllm lacks was found (check_action).
        Binding("i", "import_ollama", "Import from Ollama", id="models.import"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.models: list[ModelSummary] = []
        """The store's models as last listed."""
        self.transfers: dict[TransferPanel, Worker[None]] = {}
        """Pulls and quantizations, running or over, with their workers."""
        self.ollama_offer: tuple[Path, list[OllamaModel]] | None = None
        """An Ollama store on this machine and its models localllm does not have."""
        self._offered = False

    def compose(self) -> ComposeResult:
        """Build the widget tree."""
        yield StatusBar(self.MODE)
        with Vertical(id="models-body"):
            table: DataTable[str] = DataTable(
                id="models-table", cursor_type="row", zebra_stripes=True
            )
            table.add_columns(*_COLUMNS)
            yield table
            with VerticalScroll(id="model-details"):
                yield Markdown("", id="details")
            yield VerticalScroll(id="transfers")
        yield Footer(compact=True, show_command_palette=False)

    async def on_daemon_connected(self) -> None:
        """List the models, then look for an Ollama store with models to import."""
        await self.refresh_models()
        self.look_for_ollama()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Hide the import from the footer unless there is something to import."""
        if action == "import_ollama":
            return self.ollama_offer is not None
        return True

    @work(exclusive=True, group="ollama")
    async def look_for_ollama(self) -> None:
        """Find an Ollama store with models the store lacks; offer them once per session."""
        from localllm.autostart import is_local
        from localllm.store.ollama_import import find_ollama_store, missing_models
        from localllm.store.store import Store

        settings = self.llm.settings
        if not is_local(settings):
            return  # the import writes this machine's store, which a remote daemon never reads

        def scan() -> tuple[Path, list[OllamaModel]] | None:
            root = find_ollama_store(settings)
            if root is None:
                return None
            return root, missing_models(root, Store(settings.data_dir))

        found = await asyncio.to_thread(scan)
        listed = {m["name"] for m in self.models}
        missing = [m for m in found[1] if m.label not in listed] if found else []
        self.ollama_offer = (found[0], missing) if found and missing else None
        self.refresh_bindings()
        if self.ollama_offer is not None and not self._offered:
            self._offered = True
            size = human_size(sum(m.size for m in missing))
            self.notify(
                f"{self.ollama_offer[0]} has {len(missing)} model(s) localllm does not "
                f"({size}): press i to import them without downloading.",
                title="Ollama models found",
                timeout=10,
            )

    @property
    def selected(self) -> str | None:
        """The highlighted model's name."""
        table = self.query_one("#models-table", DataTable)
        if not self.models or table.cursor_row < 0 or table.cursor_row >= table.row_count:
            return None
        return str(table.coordinate_to_cell_key((table.cursor_row, 0)).row_key.value)

    async def refresh_models(self, select: str | None = None) -> None:
        """List the store again, keeping (or moving to ``select``) the highlighted model."""
        models = await self.list_models()
        if models is None:
            return
        keep = select or self.selected
        self.models = sorted(models, key=lambda m: m["name"])
        table = self.query_one("#models-table", DataTable)
        table.clear()
        now = self.llm.clock()
        for model in self.models:
            details = model.get("details") or {}
            table.add_row(
                model["name"],
                human_size(model.get("size", 0)),
                details.get("quantization_level", ""),
                details.get("parameter_size", ""),
                modified(model.get("modified_at"), now),
                key=model["name"],
            )
        names = [m["name"] for m in self.models]
        if keep and keep not in names and f"{keep}:latest" in names:
            keep = f"{keep}:latest"  # a name typed without its tag
        if keep in names:
            table.move_cursor(row=names.index(keep))
        if not names:
            await settle(
                self.query_one("#details", Markdown).update(
                    "No models yet. Press **p** to pull one (e.g. `smollm2:135m`)."
                )
            )

    @on(DataTable.RowHighlighted, "#models-table")
    def _row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key.value is not None:
            self.show_details(str(event.row_key.value))

    @work(exclusive=True, group="details")
    async def show_details(self, name: str) -> None:
        """Fetch and show what ``/api/show`` says about ``name``."""
        try:
            show = await self.llm.client.show(name)
            speed = await self.llm.client.speed(name)
        except DaemonError as exc:
            self.report(exc, f"Could not show {name}")
            return
        # The speed goes under the facts line, above the long parts (template, license).
        head, _, rest = details_markdown(name, show).partition("\n\n")
        text = "\n\n".join(p for p in (head, speed_markdown(speed), rest) if p)
        await settle(self.query_one("#details", Markdown).update(text))
        if speed.get("measuring"):
            # The daemon is measuring this machine's speed (or waits for a quiet moment to):
            # ask again shortly, while the model is still the one shown.
            self.set_timer(SPEED_RETRY_S, lambda: self._speed_again(name))

    def _speed_again(self, name: str) -> None:
        if self.selected == name and self.is_current:
            self.show_details(name)

    # -- actions --------------------------------------------------------------------------

    async def action_refresh(self) -> None:
        """List the models again."""
        await self.refresh_models()

    @work(exclusive=True, group="dialog")
    async def action_delete(self) -> None:
        """Delete the highlighted model, after asking."""
        name = self.selected
        if name is None:
            return
        if not await self.app.push_screen_wait(ConfirmDialog(f"Delete {name}?", "Delete")):
            return
        deleting = self.llm.client.delete(name)
        if await self.daemon_does(deleting, f"Could not delete {name}", f"Deleted {name}"):
            await self.refresh_models()

    @work(exclusive=True, group="dialog")
    async def action_copy(self) -> None:
        """Give the highlighted model another name."""
        name = self.selected
        if name is None:
            return
        base, _, tag = name.rpartition(":")
        suggestion = f"{base}:{tag}-copy" if base else f"{name}-copy"
        target = await self.app.push_screen_wait(NameDialog(f"Copy {name} to", suggestion))
        if not target:
            return
        copying = self.llm.client.copy(name, target)
        if await self.daemon_does(copying, f"Could not copy {name}", f"Copied {name} to {target}"):
            await self.refresh_models(select=target)

    @work(exclusive=True, group="dialog")
    async def action_pull(self) -> None:
        """Ask for a name and pull it."""
        name = await self.app.push_screen_wait(
            NameDialog("Pull a model", placeholder="smollm2:135m, hf.co/user/repo:Q4_K_M")
        )
        if name:
            await self.start_pull(name)

    def action_discover(self) -> None:
        """Search the Hugging Face Hub: quantizations, fit here, predicted speed; pull one."""
        from .discover import DiscoverScreen

        self.app.push_screen(DiscoverScreen(self.start_pull))

    @work(exclusive=True, group="dialog")
    async def action_quantize(self) -> None:
        """Quantize the highlighted model to a chosen type, as a new model."""
        name = self.selected
        if name is None:
            return
        answer = await self.app.push_screen_wait(QuantizeDialog(name, list(QUANT_TYPES)))
        if answer:
            quant, target = answer
            await self.start_quantize(name, quant, target)

    @work(exclusive=True, group="dialog")
    async def action_import_ollama(self) -> None:
        """Import the Ollama models localllm lacks, after asking."""
        if self.ollama_offer is None:
            return
        root, models = self.ollama_offer
        # One short line: the dialog does not wrap. What is imported shows in the panel.
        size = human_size(sum(m.size for m in models))
        question = f"Import {len(models)} model(s) from Ollama ({size}), without downloading?"
        if await self.app.push_screen_wait(ConfirmDialog(question, "Import")):
            await self.start_import(root, [m.label for m in models])

    def action_cancel_transfer(self) -> None:
        """Cancel the newest running transfer (each also has its own button)."""
        running = [p for p in self.transfers if p.state == "running"]
        if running:
            self._cancel(running[-1])

    # -- transfers ----------------------------------------------------------------------

    async def start_pull(self, name: str) -> TransferPanel:
        """Pull ``name`` with a progress panel; returns the panel."""
        return await self._start_transfer(f"pull {name}", "pull", self.llm.client.pull(name), name)

    async def start_quantize(self, source: str, quant: str, target: str) -> TransferPanel:
        """Quantize ``source`` to ``quant`` as ``target`` with a progress panel."""
        lines = self.llm.client.create(target, from_=source, quantize=quant)
        return await self._start_transfer(f"{source} → {target}", "quantize", lines, target)

    async def start_import(self, root: Path, names: list[str]) -> TransferPanel:
        """Import ``names`` from the Ollama store at ``root`` with a progress panel."""
        panel = ImportPanel("import from Ollama", kind="import")
        await self.query_one("#transfers").mount(panel)
        self.transfers[panel] = self.run_worker(
            self._follow_import(panel, root, names), group="transfers", name=panel.heading
        )
        return panel

    async def _follow_import(self, panel: TransferPanel, root: Path, names: list[str]) -> None:
        """Run the import in a thread (hashing gigabytes), its progress shown by ``panel``."""
        from localllm.store.ollama_import import OllamaImporter
        from localllm.store.store import Store

        loop = asyncio.get_running_loop()
        lines: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        cancel = threading.Event()
        importer = OllamaImporter(
            root,
            Store(self.llm.settings.data_dir),
            progress=lambda event: loop.call_soon_threadsafe(lines.put_nowait, event.to_json()),
            cancel=cancel,
        )

        def job() -> ImportReport:
            try:
                return importer.run(names)
            finally:
                loop.call_soon_threadsafe(lines.put_nowait, None)

        task = asyncio.ensure_future(asyncio.to_thread(job))
        try:
            while (line := await lines.get()) is not None:
                await panel.show_progress(line)
            report = await task
        except asyncio.CancelledError:
            cancel.set()  # the thread stops at its next chunk and removes its partial file
            task.add_done_callback(lambda done: done.cancelled() or done.exception())
            panel.finish("cancelled", "cancelled")
            raise
        except LocalLLMError as exc:
            panel.finish("failed", str(exc))
            return
        for outcome in report.skipped:
            self.notify(f"{outcome.label}: {outcome.reason}", title="Not imported", timeout=10)
        imported = [o.label for o in report.outcomes if o.status == "imported"]
        await self.refresh_models(select=imported[0] if imported else None)
        panel.finish("failed" if report.skipped else "done", report.summary())
        self.look_for_ollama()

    async def _start_transfer(self, title: str, kind: str, lines: Any, model: str) -> TransferPanel:
        panel = TransferPanel(title, kind=kind)
        await self.query_one("#transfers").mount(panel)
        self.transfers[panel] = self.run_worker(
            self._follow(panel, lines, model), group="transfers", name=title
        )
        return panel

    async def _follow(self, panel: TransferPanel, lines: Any, model: str) -> None:
        try:
            async for line in lines:
                await panel.show_progress(line)
        except asyncio.CancelledError:
            # Closing the stream (leaving the loop) is what cancels the job in the daemon.
            panel.finish("cancelled", "cancelled")
            raise
        except APIError as exc:
            panel.finish("failed", exc.message)
            return
        except DaemonError as exc:
            panel.finish("failed", str(exc))
            self.report(exc, panel.heading)
            return
        await self.refresh_models(select=model)
        panel.finish("done", "success")

    def _cancel(self, panel: TransferPanel) -> None:
        worker = self.transfers.get(panel)
        if panel.state == "running" and worker is not None:
            worker.cancel()
        else:
            self.transfers.pop(panel, None)
            panel.remove()

    @on(TransferPanel.CancelRequested)
    def _cancel_requested(self, event: TransferPanel.CancelRequested) -> None:
        self._cancel(event.panel)
