"""The TUI as an MCP host (Pilot): a tool call as a block in the conversation, the approval a
prompt in the chat, Esc ending a running call, the chat's settings choosing servers and tools,
MCP prompts as slash commands, resources attached, chats with tool calls saved and reloaded.

The model is a :class:`~mcp_support.ScriptedModel` (the daemon's real HTTP protocol, scripted
answers) and the tools are the test MCP server, a real subprocess.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp_support import Reply, ScriptedModel, toolbox_entry, write_config
from test_tui_support import notices, screen_text, wait_for
from textual.widgets import SelectionList

from localllm.client import AsyncClient
from localllm.settings import Settings
from localllm.tui.app import LocalLLMApp
from localllm.tui.chats import DB_NAME, ChatStore
from localllm.tui.screens.chat import ChatScreen
from localllm.tui.screens.chat_tools import ToolsDialog
from localllm.tui.widgets.message import MessageView
from localllm.tui.widgets.toolcall import ApprovalPrompt, ToolCallBlock

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    """Textual runs on asyncio."""
    return "asyncio"


@pytest.fixture(scope="module")
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel() as scripted:
        yield scripted


@pytest.fixture
def scripted(model: ScriptedModel) -> ScriptedModel:
    model.script.clear()
    model.requests.clear()
    model.capabilities = ["completion", "tools"]
    return model


def make_app(model: ScriptedModel, data: Path, calls: Path | None = None) -> LocalLLMApp:
    config = write_config(data / "mcp.json", {"toolbox": toolbox_entry(calls=calls)})
    settings = Settings.from_env(
        {
            "LOCALLLM_HOME": str(data),
            "LOCALLLM_HOST": f"127.0.0.1:{model.port}",
            "LOCALLLM_MCP_CONFIG": str(config),
            "LOCALLLM_MCP_TIMEOUT": "60",
        }
    ).replace(ollama_models=data / "no-ollama")
    return LocalLLMApp(settings, client=AsyncClient(base_url=model.url), autostart=False)


async def ready(pilot: Any, app: LocalLLMApp) -> ChatScreen:
    await wait_for(pilot, lambda: app.connection == "connected", "the connection")
    screen = app.screen
    assert isinstance(screen, ChatScreen)
    await wait_for(pilot, lambda: screen.current and screen.current.model, "a model")
    return screen


async def ask(pilot: Any, screen: ChatScreen, text: str) -> None:
    assert await screen.send(text)


def blocks(screen: ChatScreen) -> list[ToolCallBlock]:
    return list(screen.transcript().query(ToolCallBlock))


def answers(screen: ChatScreen) -> list[MessageView]:
    return list(screen.transcript().query(MessageView).filter(".assistant"))


async def test_a_call_is_a_block_asked_in_the_chat_and_the_chat_reloads_as_it_was(
    scripted: ScriptedModel, tmp_path: Path
) -> None:
    calls = tmp_path / "calls.jsonl"
    scripted.script = [Reply("Adding.", [("add", {"a": 2, "b": 3})]), Reply("It is 5.")]
    app = make_app(scripted, tmp_path, calls)
    async with app.run_test(size=(100, 40)) as pilot:
        screen = await ready(pilot, app)
        await ask(pilot, screen, "What is 2+3?")
        prompt = await wait_for(
            pilot, lambda: next(iter(screen.query(ApprovalPrompt)), None), "the approval", 90
        )
        assert "toolbox · add" in screen_text(app)
        assert not calls.exists()  # asked before it runs
        prompt.focus()
        await pilot.press("y")
        await wait_for(pilot, lambda: not screen.answering, "the answer", 60)
        (block,) = blocks(screen)
        assert block.title == "toolbox · add" and block.arguments == {"a": 2, "b": 3}
        assert block.result_text == "5" and block.status == "done"
        assert answers(screen)[-1].text == "It is 5."
        assert "tools" in answers(screen)[-1].stats_text  # the loop's own timings
        assert json.loads(calls.read_text()) == {"tool": "add", "arguments": {"a": 2, "b": 3}}
        second = scripted.chat_requests()[-1]["messages"]
        assert second[-1] == {
            "role": "tool",
            "content": "5",
            "tool_name": "add",
            "tool_call_id": "call_0",
        }
        chat_id = screen.current.id

    store = ChatStore(tmp_path / DB_NAME)
    (chat,) = [c for c in store.list_chats() if c.id == chat_id]
    store.close()
    sent = chat.request_messages()
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "assistant"]
    assert sent[1]["tool_calls"][0]["function"] == {"name": "add", "arguments": {"a": 2, "b": 3}}
    app = make_app(scripted, tmp_path, calls)
    async with app.run_test(size=(100, 40)) as pilot:
        screen = await ready(pilot, app)
        (block,) = await wait_for(pilot, lambda: blocks(screen), "the saved block")
        assert block.title == "toolbox · add" and block.result_text == "5"
        assert block.status == "done"
        assert answers(screen)[-1].text == "It is 5."


async def test_escape_ends_a_running_call_and_the_next_message_works(
    scripted: ScriptedModel, tmp_path: Path
) -> None:
    scripted.script = [Reply("", [("slow", {"seconds": 120})])]
    app = make_app(scripted, tmp_path)
    async with app.run_test(size=(100, 40)) as pilot:
        screen = await ready(pilot, app)
        await ask(pilot, screen, "Wait a while.")
        prompt = await wait_for(
            pilot, lambda: next(iter(screen.query(ApprovalPrompt)), None), "the approval", 90
        )
        prompt.focus()
        await pilot.press("a")  # always, for this chat
        (block,) = await wait_for(pilot, lambda: blocks(screen), "the block")
        await wait_for(pilot, lambda: block.status == "running", "the call to run")
        await pilot.press("escape")
        await wait_for(pilot, lambda: not screen.answering, "the loop to stop", 30)
        assert block.status == "stopped", block.status
        chat = screen.current
        assert [m.role for m in chat.messages] == ["user", "assistant", "tool"]
        assert chat.messages[-1].content == "stopped by the person before it ended"

        # the next message works, and "always" holds: no question this time
        scripted.script = [Reply("", [("slow", {"seconds": 0.01})]), Reply("Done.")]
        await ask(pilot, screen, "Wait less.")
        await wait_for(pilot, lambda: not screen.answering, "the second answer", 60)
        assert not screen.query(ApprovalPrompt)
        assert blocks(screen)[-1].result_text == "waited 0.01 s"
        assert answers(screen)[-1].text == "Done."
        # the stopped call went back to the model as a result, the history stays whole
        sent = scripted.chat_requests()[-2]["messages"]
        assert [m["role"] for m in sent] == ["user", "assistant", "tool", "user"]


async def test_settings_prompts_and_resources(scripted: ScriptedModel, tmp_path: Path) -> None:
    app = make_app(scripted, tmp_path)
    async with app.run_test(size=(100, 40)) as pilot:
        screen = await ready(pilot, app)
        # the chat's settings: the add tool off
        await pilot.press("ctrl+g")
        dialog = await wait_for(
            pilot, lambda: isinstance(app.screen, ToolsDialog) and app.screen, "the dialog", 90
        )
        listing = dialog.query_one(SelectionList)
        assert "server:toolbox" in listing.selected and "tool:toolbox/add" in listing.selected
        listing.deselect("tool:toolbox/add")
        # laid out, not only mounted: a click at a button with no region yet goes nowhere
        await wait_for(
            pilot,
            lambda: dialog.query("#save") and dialog.query_one("#save").region.area > 0,
            "the dialog's buttons",
        )
        await pilot.click("#save")
        await wait_for(pilot, lambda: app.screen is screen, "the dialog to close")
        assert screen.current.tools == {"servers": ["toolbox"], "off": ["toolbox/add"]}

        # an MCP prompt as a slash command: its text is the question
        scripted.script = [Reply("Fine.")]
        await screen.send("/review topic=the tests")
        await wait_for(pilot, lambda: len(scripted.requests) == 1, "the question")
        await wait_for(pilot, lambda: not screen.answering, "the answer")
        body = scripted.chat_requests()[-1]
        assert body["messages"][-1]["content"] == "Please review the tests in one sentence."
        offered = [tool["function"]["name"] for tool in body["tools"]]
        assert "add" not in offered and "colour_of" in offered

        # a resource attached like a file goes with the next message
        await screen.send("/resource notes://today")
        await wait_for(pilot, lambda: "notes://today" in screen_text(app), "the attachment")
        scripted.script = [Reply("Milk.")]
        await ask(pilot, screen, "What must I buy?")
        await wait_for(pilot, lambda: not screen.answering, "the answer")
        question = scripted.chat_requests()[-1]["messages"][-1]["content"]
        assert question.startswith("What must I buy?") and "Buy milk." in question

        # a server's sampling request: shown, asked about in the chat, answered by the model
        scripted.script = [
            Reply("", [("consult", {"question": "Sky colour?"})]),
            Reply("Blue"),
            Reply("The model says blue."),
        ]
        await ask(pilot, screen, "Consult the model.")
        for _ in range(2):  # the call, then the sampling request
            prompt = await wait_for(
                pilot, lambda: next(iter(screen.query(ApprovalPrompt)), None), "a question"
            )
            question = prompt.question
            prompt.focus()
            await pilot.press("y")
            asked = prompt
            await wait_for(pilot, lambda p=asked: not p.is_attached, "the question to go")
        assert question == "Let toolbox use the model?"
        await wait_for(pilot, lambda: not screen.answering, "the answer")
        consult, sampling = blocks(screen)[-2:]
        assert consult.title == "toolbox · consult"
        assert consult.result_text == "the model answered: Blue"
        assert sampling.title == "toolbox asks the model" and sampling.status == "done"
        assert answers(screen)[-1].text == "The model says blue."


async def test_a_model_that_cannot_call_tools_is_said_at_once(
    scripted: ScriptedModel, tmp_path: Path
) -> None:
    scripted.capabilities = ["completion"]
    scripted.script = [Reply("Hello.")]
    app = make_app(scripted, tmp_path)
    told = notices(app)
    async with app.run_test(size=(100, 40)) as pilot:
        screen = await ready(pilot, app)
        await ask(pilot, screen, "Hi")
        await wait_for(pilot, lambda: not screen.answering and answers(screen), "the answer")
        assert "cannot call tools" in " ".join(told)
        assert "tools" not in scripted.chat_requests()[-1]  # answered as a plain chat
        assert answers(screen)[-1].text == "Hello."
