"""Regenerating an answer that called a tool (the MCP agent loop, a scripted model speaking the
daemon's protocol, the test MCP server): the new answer is a branch beside the old one, its
header says ``2/2`` even though the branch begins with a step that only called the tool (that
step has no box of its own), and Alt+Left goes back to the old answer with its call."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp_support import Reply, ScriptedModel
from test_mcp_tui import answers, ask, blocks, make_app, model, ready, scripted
from test_tui_support import wait_for

from localllm.tui.widgets.toolcall import ApprovalPrompt

pytestmark = pytest.mark.anyio
__all__ = ["model", "scripted"]  # the fixtures, used by name


@pytest.fixture
def anyio_backend() -> str:
    """Textual runs on asyncio."""
    return "asyncio"


async def _approve(pilot, screen) -> None:  # type: ignore[no-untyped-def]
    prompt = await wait_for(
        pilot, lambda: next(iter(screen.query(ApprovalPrompt)), None), "the approval", 90
    )
    prompt.focus()
    await pilot.press("y")


async def test_regenerate_an_answer_that_called_a_tool(
    scripted: ScriptedModel, tmp_path: Path
) -> None:
    scripted.script = [
        Reply("", [("add", {"a": 2, "b": 3})]),
        Reply("It is 5."),
        Reply("", [("add", {"a": 2, "b": 3})]),
        Reply("Five."),
    ]
    app = make_app(scripted, tmp_path)
    async with app.run_test(size=(100, 40)) as pilot:
        screen = await ready(pilot, app)
        chat = screen.current
        assert chat is not None
        await ask(pilot, screen, "What is 2+3?")
        await _approve(pilot, screen)
        await wait_for(pilot, lambda: len(chat.all_messages()) == 4, "the first answer", 60)
        await wait_for(pilot, lambda: not screen.answering, "the loop to end")
        assert answers(screen)[-1].heading.endswith(chat.model or "")  # one branch: no n/N

        await pilot.press("ctrl+r")
        await _approve(pilot, screen)
        await wait_for(pilot, lambda: len(chat.all_messages()) == 7, "the second answer", 60)
        await wait_for(pilot, lambda: not screen.answering, "the loop to end")
        assert [m.role for m in chat.messages] == ["user", "assistant", "tool", "assistant"]
        assert chat.messages[-1].content == "Five." and chat.branch_label(chat.messages[1])
        assert len(blocks(screen)) == 1 and answers(screen)[-1].text == "Five."
        await wait_for(pilot, lambda: answers(screen)[-1].heading.endswith("‹ 2/2 ›"), "2/2")

        await pilot.press("alt+left")
        await wait_for(pilot, lambda: chat.messages[-1].content == "It is 5.", "the first")
        assert answers(screen)[-1].text == "It is 5." and len(blocks(screen)) == 1
        assert answers(screen)[-1].heading.endswith("‹ 1/2 ›")
