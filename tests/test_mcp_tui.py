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
from test_tui_support import screen_text, wait_for
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
        assert second[-1] == {"role": "tool", "content": "5", "tool_name": "add", "tool_call_id": "call_0"}
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
