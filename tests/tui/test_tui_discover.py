"""The models screen's Discover view, driven with the Pilot against a real daemon and a loopback
Hub: search, a repository's quantizations with their fit badge and predicted speed, a pull with
live progress on the models screen, then the model in its list."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes.helpers import TinyModels
from fakes.hf_hub import FakeHub
from speed_support import seed_calibration
from test_daemon_support import Daemon, running_daemon
from test_tui_support import make_app, screen_text, wait_for
from textual.app import App
from textual.widgets import DataTable, Input

from localllm.tui.screens.discover import DiscoverScreen, fit_badge
from localllm.tui.screens.models import ModelsScreen

pytest_plugins = ["fakes.fixtures"]
pytestmark = [pytest.mark.slow, pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    """Textual runs on asyncio."""
    return "asyncio"


@pytest.fixture(scope="module")
def hub(tiny_models: TinyModels) -> Iterator[FakeHub]:
    with FakeHub() as server:
        server.add_repo(
            "tester/tiny-GGUF",
            {"tiny-F16.gguf": tiny_models.f16, "tiny-Q8_0.gguf": tiny_models.other},
            downloads=77,
        )
        server.add_repo("tester/other-GGUF", {"o-Q4_0.gguf": tiny_models.f32}, downloads=5)
        yield server


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, hub: FakeHub) -> Iterator[Daemon]:
    root = tmp_path_factory.mktemp("tui-discover")
    seed_calibration(root / "cache", threads=1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_ENDPOINT", hub.url)
        patch.setenv("XDG_CACHE_HOME", str(root / "cache"))
        with running_daemon(root / "home", num_parallel=1, num_threads=1) as started:
            yield started


def test_badges_name_each_fit() -> None:
    assert fit_badge({"fit": "gpu", "shapes": "header"}).plain == "● GPU"
    assert fit_badge({"fit": "none", "shapes": "scaled from Q8_0"}).plain == "≈✕ too large"


async def test_search_look_and_pull_from_the_discover_view(daemon: Daemon, tmp_path: Path) -> None:
    app = make_app(daemon, tmp_path)
    async with app.run_test(size=(100, 32)) as pilot:
        await wait_for(pilot, lambda: app.connection == "connected", "the connection")
        await pilot.press("f3")
        models = await wait_for(
            pilot, lambda: isinstance(app.screen, ModelsScreen) and app.screen, "models"
        )
        await pilot.press("s")
        view = await wait_for(
            pilot, lambda: isinstance(app.screen, DiscoverScreen) and app.screen, "Discover"
        )
        view.query_one("#discover-query", Input).value = "tiny"
        await pilot.press("enter")
        results = view.query_one("#discover-results", DataTable)
        await wait_for(pilot, lambda: results.row_count == 1, "the search results")
        # the table has its row before the screen is drawn again
        text = await wait_for(pilot, lambda: _showing(app, "tester/tiny-GGUF"), "the result")
        assert "77" in text

        await pilot.press("enter")  # the highlighted result's quantizations
        quants = view.query_one("#discover-quants", DataTable)
        await wait_for(pilot, lambda: quants.row_count == 2, "the quantizations")
        text = await wait_for(pilot, lambda: _showing(app, "○ CPU"), "the quantizations drawn")
        assert "○ CPU" in text and "tok/s" in text and "1×" in text
        labels = [str(quants.get_row_at(i)[0]) for i in range(quants.row_count)]
        quants.move_cursor(row=labels.index("Q8_0"))
        await pilot.press("p")

        await wait_for(pilot, lambda: app.screen is models, "the models screen again")
        panel = await wait_for(pilot, lambda: next(iter(models.transfers), None), "the pull")
        await wait_for(pilot, lambda: panel.state != "running", "the pull to end", timeout=120)
        assert panel.state == "done", panel.status
        names = [m["name"] for m in models.models]
        assert "hf.co/tester/tiny-GGUF:Q8_0" in names
        assert models.selected == "hf.co/tester/tiny-GGUF:Q8_0"


async def test_hub_errors_show_in_the_status_line(
    daemon: Daemon, hub: FakeHub, tmp_path: Path
) -> None:
    app = make_app(daemon, tmp_path)
    hub.api_failure = (429, {"Retry-After": "12"})
    try:
        async with app.run_test(size=(100, 32)) as pilot:
            await wait_for(pilot, lambda: app.connection == "connected", "the connection")
            await pilot.press("f3")
            await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen), "models")
            await pilot.press("s")
            view = await wait_for(
                pilot, lambda: isinstance(app.screen, DiscoverScreen) and app.screen, "Discover"
            )
            view.query_one("#discover-query", Input).value = "tiny"
            await pilot.press("enter")
            await wait_for(
                pilot, lambda: "try again in 12 s" in screen_text(app), "the 429 in the status"
            )
            await pilot.press("escape")
            await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen), "back")
    finally:
        hub.api_failure = None


def _showing(app: App[Any], wanted: str) -> str:
    """The screen's text once it shows ``wanted``, else empty (for :func:`wait_for`)."""
    text = screen_text(app)
    return text if wanted in text else ""
