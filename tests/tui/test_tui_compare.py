"""Comparing models in the TUI against a real daemon: the starter SmolLM2 and a copy of it
with another system prompt answer one question side by side, each column with its own TTFT,
prefill and decode speed and its runner's CPU threads; the memory plan says before sending
whether they fit together; the answer picked continues the chat and every answer is kept as a
branch. Nothing asserts what a model says."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_daemon_support import Daemon, running_daemon
from test_tui import SMOL, connected
from test_tui_branches import footer, headings, open_chat
from test_tui_support import make_app, screen_text, wait_for
from textual.widgets import Label

from localllm.tui.screens.chat import ChatScreen
from localllm.tui.screens.compare import CompareScreen, fit_sentence
from localllm.tui.widgets.prompt import PromptArea

PIRATE = "pirate:latest"

pytestmark = [pytest.mark.slow, pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    """Textual runs on asyncio."""
    return "asyncio"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon with the starter and ``pirate``, the starter with another system prompt."""
    home = tmp_path_factory.mktemp("tui-compare") / "home"
    with running_daemon(home, num_parallel=1, num_threads=2) as d:
        with d.client() as client:
            for _ in client.create("pirate", from_=SMOL, system="You are a pirate. Say arr."):
                pass  # its progress
        yield d


def _plan(size: int, budget: int, *, loaded: bool = False) -> dict[str, Any]:
    return {"loaded": loaded, "plan": {"size": size, "budgets": {"CPU": budget}}}


def test_the_fit_sentence() -> None:
    mib = 1 << 20
    fits, said = fit_sentence({"a": _plan(300 * mib, 1000 * mib), "b": _plan(400 * mib, 900 * mib)})
    assert fits and "fit together" in said and "700 MiB" in said
    fits, said = fit_sentence({"a": _plan(600 * mib, 1000 * mib), "b": _plan(500 * mib, 900 * mib)})
    assert not fits and "do not fit together" in said and "1,100 MiB" in said
    # a model loaded already needs nothing more
    fits, _ = fit_sentence({"a": _plan(600 * mib, 500 * mib, loaded=True), "b": _plan(400, 500)})
    assert fits
    fits, said = fit_sentence({"a": {"refusal": "needs 9 GiB, 2 GiB free"}, "b": _plan(1, 9)})
    assert not fits and "a: needs 9 GiB" in said


async def test_two_models_side_by_side_and_the_picked_answer_goes_on(
    daemon: Daemon, tmp_path: Path
) -> None:
    open_chat(tmp_path, num_predict=24, temperature=0)
    app = make_app(daemon, tmp_path)
    async with app.run_test(size=(120, 36)) as pilot:
        await connected(pilot, app)
        screen = app.screen
        assert isinstance(screen, ChatScreen) and screen.current is not None
        await wait_for(
            pilot, lambda: PIRATE in screen.models, f"the copy in the list: {screen.models}"
        )
        chat = screen.current
        await wait_for(pilot, lambda: "Compare" in footer(app), "Compare in the footer")
        await pilot.press(*"Why is the sky blue?", "f12")
        compare = await wait_for(
            pilot, lambda: isinstance(app.screen, CompareScreen) and app.screen, "compare"
        )
        # said before sending: whether the two fit together (the plan of each)
        await wait_for(pilot, lambda: compare.fits is not None, "the memory plan")
        assert set(compare.picked_models) == {SMOL, PIRATE}  # the chat's and the next
        fit = str(compare.query_one("#fit", Label).content)
        assert compare.fits and "fit together" in fit, fit
        await wait_for(pilot, lambda: "Send to all" in footer(app), "Send in the footer")

        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: len(compare.columns) == 2, "two columns")
        await wait_for(
            pilot, lambda: all(c.answer is not None for c in compare.columns), "both answers"
        )
        for column in compare.columns:
            assert column.answer is not None and column.answer.model == column.model
            assert column.answer.content and "error" not in (column.answer.stats or {})
            for part in ("TTFT", "prefill", "decode"):
                assert part in column.view.stats_text, column.view.stats_text
            await wait_for(pilot, lambda c=column: c.threads_seen, "the threads line")
            assert "CPU threads" in str(column.threads.content)
        shown = screen_text(app)
        assert shown.count("TTFT") == 2 and shown.count("CPU threads") == 2
        await wait_for(pilot, lambda: "Keep 2" in footer(app), "the keys to pick")
        assert "Keep 3" not in footer(app)

        # keep the second: the chat goes on from it, the first is its other branch
        kept = compare.columns[1]
        await pilot.press("2")
        await wait_for(pilot, lambda: app.screen is screen, "back to the chat")
        assert [m.role for m in chat.messages] == ["user", "assistant"]
        assert chat.messages[0].content == "Why is the sky blue?"
        assert chat.messages[1].content == kept.answer.content  # type: ignore[union-attr]
        assert chat.messages[1].model == kept.model
        assert headings(screen)[1] == f"{kept.model}  ‹ 2/2 ›"
        assert screen.query_one(PromptArea).text == ""
        await pilot.press("alt+left")
        await wait_for(
            pilot, lambda: chat.messages[1].model == compare.columns[0].model, "the other one"
        )
