"""The TUI side of ``localllm bench``: the Bench screen (snapshots at 80x24 and 120x40 with
fixed points, a live sweep on a real daemon with the tiny model, a refused run reported), the
dashboard card's history since the daemon started, and the chat's throttled Markdown stream.

Snapshots show fixed points injected through :meth:`BenchScreen.show_points` (no measured
number can vary); update with ``pytest tests/bench/test_bench_tui.py --snapshot-update`` and
review the SVGs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_daemon_support import Daemon, running_daemon
from test_tui_support import make_app, screen_text, wait_for
from textual.app import App, ComposeResult
from textual.pilot import Pilot
from textual.widgets import Input, Select

from localllm.bench import BenchError, Point
from localllm.daemon.history import RequestHistory
from localllm.tui.screens.bench import BenchScreen, parse_levels
from localllm.tui.widgets.loaded_model import LoadedModelCard
from localllm.tui.widgets.message import MessageView, StreamingMarkdown, settled_length

MODEL = "tiny:bench"

pytestmark = pytest.mark.slow


@pytest.fixture
def anyio_backend() -> str:
    """Textual runs on asyncio."""
    return "asyncio"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Daemon]:
    """A daemon with the tiny model (and the bundled one, which stays unloaded)."""
    home = tmp_path_factory.mktemp("bench-tui") / "home"
    with running_daemon(home, num_parallel=2, num_threads=1, context_length=512) as d:
        with d.client() as client:
            for _ in client.create(MODEL, from_=str(tiny_gguf)):
                pass
        yield d


def fixed_points() -> list[Point]:
    """A concurrency sweep's points with round numbers (what a run would show)."""
    figures = ((1, 40.0, 90.0, 88.0), (2, 65.0, 70.0, 135.0), (4, 120.0, 48.0, 180.0),
               (8, 260.0, 27.0, 200.0))  # fmt: skip
    points = [
        Point(
            MODEL,
            "concurrency",
            clients,
            128,
            "cold",
            requests=clients,
            ttft_p50_ms=ttft,
            ttft_p95_ms=ttft * 1.2,
            stream_tps_p50=stream,
            aggregate_tps=aggregate,
            queue_ms_p50=1.0,
            prefill_tps_p50=900.0,
            cached_tokens_mean=0.0,
            prompt_tokens_mean=130.0,
            wall_s=1.0,
        )
        for clients, ttft, stream, aggregate in figures
    ]
    points[-1].failed, points[-1].errors = 1, ["HTTP 503: queue full"]
    return points


async def bench_screen(pilot: Pilot[Any]) -> BenchScreen:
    """Switch to the Bench screen (F9) and wait until it lists the models."""
    app = pilot.app
    await wait_for(pilot, lambda: getattr(app, "connection", "") == "connected", "connection")
    await pilot.press("f9")
    screen = await wait_for(
        pilot, lambda: isinstance(app.screen, BenchScreen) and app.screen, "the Bench screen"
    )
    await wait_for(pilot, lambda: MODEL in screen.models, "the model list")
    return screen


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
def test_bench_screen_snapshot(
    snap_compare: Any, daemon: Daemon, tmp_path: Path, size: tuple[int, int]
) -> None:
    app = make_app(daemon, tmp_path)

    async def run_before(pilot: Pilot[Any]) -> None:
        screen = await bench_screen(pilot)
        screen.query_one("#bench-model", Select).value = MODEL
        screen.show_points(fixed_points(), "concurrency")
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=run_before)


def ended(screen: BenchScreen, requests: int) -> bool:
    """Whether ``screen``'s run of ``requests`` requests is over."""
    return not screen.running and screen.status.startswith(f"Done: {requests} requests")


@pytest.mark.anyio
async def test_a_sweep_runs_live_and_fills_the_table(daemon: Daemon, tmp_path: Path) -> None:
    app = make_app(daemon, tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await bench_screen(pilot)
        screen.query_one("#bench-model", Select).value = MODEL
        screen.query_one("#bench-levels", Input).value = "1,2"
        screen.query_one("#bench-tokens", Input).value = "4"
        drawn: list[int] = []
        original = screen.show_points

        def spy(points: list[Point], sweep: str) -> None:
            drawn.append(len(points))
            original(points, sweep)

        screen.show_points = spy  # type: ignore[method-assign]
        await pilot.press("ctrl+r")
        # Waited for by what only the end of this run shows: a short run can start and end
        # between two looks at screen.running.
        await wait_for(pilot, lambda: ended(screen, 3), "the run to end", timeout=120)
        rows = screen.summary_rows()
        assert [row[1:3] for row in rows] == [["1", "1/1"], ["2", "2/2"]], rows
        assert 1 in drawn and 2 in drawn  # the curve grew point by point
        assert screen.status.startswith("Done: 3 requests"), screen.status
        assert "throughput vs latency" in screen_text(app)

        # a prompt-length sweep: cold and cached rows per length
        await pilot.click("#bench-sweep")
        screen.query_one("#bench-sweep", Select).value = "prompt"
        await pilot.pause()
        assert screen.query_one("#bench-levels", Input).value.startswith("128,")
        screen.query_one("#bench-levels", Input).value = "16"
        screen.query_one("#bench-tokens", Input).value = "2"
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: ended(screen, 2), "the second run to end", timeout=120)
        assert [row[1:4] for row in screen.summary_rows()] == [
            ["16", "cold", "1/1"],
            ["16", "warm", "1/1"],
        ]


@pytest.mark.anyio
async def test_bad_levels_and_a_vanished_model_are_reported(daemon: Daemon, tmp_path: Path) -> None:
    app = make_app(daemon, tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await bench_screen(pilot)
        screen.query_one("#bench-levels", Input).value = "1,two"
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert not screen.running
        # a model the daemon does not have: every request fails, the screen says why
        select = screen.query_one("#bench-model", Select)
        select.set_options([("gone:latest", "gone:latest")])
        select.value = "gone:latest"
        screen.query_one("#bench-levels", Input).value = "1"
        screen.query_one("#bench-tokens", Input).value = "2"
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: not screen.running and screen.status, "the run to end")
        await wait_for(pilot, lambda: "failed" in screen.status, "the failure")
        assert "404" in screen.status, screen.status
        assert screen.summary_rows()[0][2] == "0/1"


def test_parse_levels() -> None:
    assert parse_levels(" 1, 2,4 ") == [1, 2, 4]
    for bad in ("", "0", "1,x", "-1"):
        with pytest.raises(BenchError):
            parse_levels(bad)


# -- the dashboard's history since the daemon started -------------------------------------------


class _CardApp(App[None]):
    def compose(self) -> ComposeResult:
        yield LoadedModelCard(MODEL, history=10)


@pytest.mark.anyio
async def test_card_shows_the_daemon_history_only_when_there_is_one() -> None:
    history = RequestHistory(started_at=1000.0)
    for i in range(120):
        history.record(MODEL, ttft_ms=20.0 + i, decode_tps=100.0 - i / 2, when=1000.0 + i)
    app = _CardApp()
    async with app.run_test(size=(100, 20)) as pilot:
        card = app.query_one(LoadedModelCard)
        card.show({"slots_total": 2}, 0.0)  # an older daemon: no history field
        await pilot.pause()
        assert card.history_requests == 0
        assert not card.query_one(".history").display or not card.query_one(".history").has_class(
            "-shown"
        )
        card.show({"slots_total": 2, "history": history.series(MODEL, points=30)}, 0.0)
        await pilot.pause()
        assert card.history_requests == 120
        assert card.query_one(".history").has_class("-shown")
        assert "since start" in screen_text(app)


def test_history_is_bounded_and_spans_the_whole_time() -> None:
    history = RequestHistory(capacity=16, max_models=2, started_at=0.0)
    for i in range(1000):
        history.record("a", ttft_ms=float(i), decode_tps=10.0, when=float(i))
    history.record("a", ttft_ms=5.0, decode_tps=5.0, tokens=0)  # no tokens: not a sample
    series = history.series("a", points=8)
    assert series["requests"] == 1000
    assert 1 <= len(series["time"]) <= 8
    assert len(series["time"]) == len(series["ttft_ms"]) == len(series["decode_tps"])
    assert series["time"][-1] == 999.0 and series["ttft_ms"][0] < series["ttft_ms"][-1]
    for name in ("b", "c"):  # a third model forgets the least recently active one
        history.record(name, 1.0, 1.0)
    assert history.models() == ["b", "c"] and history.series("a")["requests"] == 0


# -- the chat's throttled stream ---------------------------------------------------------------


class _AnswerApp(App[None]):
    def compose(self) -> ComposeResult:
        yield MessageView("assistant", author="model")


@pytest.mark.anyio
async def test_a_fast_stream_renders_a_few_times_not_once_per_piece() -> None:
    app = _AnswerApp()
    async with app.run_test() as pilot:
        view = app.query_one(MessageView)
        view.STREAM_REFRESHES_PER_SECOND = 10
        stream = view.stream()
        pieces = [f"word{i} " for i in range(500)] + ["\n\n- a list\n- of items\n"]
        for piece in pieces:
            await stream.write(piece)
        await stream.stop()
        await pilot.pause()
        assert view.markdown.source == "".join(pieces) == view.text
        assert stream.appends <= 3, stream.appends
        assert view.markdown.display and not view.query(StreamingMarkdown)
        with pytest.raises(RuntimeError):
            await stream.write("late")


@pytest.mark.anyio
async def test_while_streaming_only_the_last_block_is_rendered_again() -> None:
    app = _AnswerApp()
    async with app.run_test() as pilot:
        view = app.query_one(MessageView)
        stream = view.stream()
        first = "# Title\n\nFirst paragraph.\n\nSecond"
        for char in first:
            await stream.write(char)
        await wait_for(pilot, lambda: view.text == first, "the first part to show")
        streaming = view.query_one(StreamingMarkdown)
        assert len(streaming.children) == 2 and not view.markdown.display  # settled + tail
        rest = " paragraph.\n\n```python\nx = 1\n\ny = 2\n```\n\nLast"
        for char in rest:
            await stream.write(char)
        text = first + rest
        await wait_for(pilot, lambda: view.text == text, "the rest to show")
        # the second paragraph and the code block (whose blank line does not end it) settled
        # into one more block; the first one was not rendered again
        assert len(streaming.children) == 3
        await stream.stop()
        assert view.markdown.source == text and view.markdown.display


def test_settled_length() -> None:
    assert settled_length("one\n\ntwo") == len("one\n\n")
    assert settled_length("one\ntwo") == 0
    assert settled_length("```\na\n\nb\n") == 0  # inside a fence
    assert settled_length("```\na\n\nb\n```\n\nc") == len("```\na\n\nb\n```\n\n")
    assert settled_length("one\n\n") == len("one\n\n")
