"""The MCP host's pieces that need no server: the config file (its shape, its errors, a
rewrite that keeps what it does not know), tool names and schemas, results cut with a note,
the forced step's messages, prompt arguments."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from localllm._exceptions import SettingsError, ToolConfigError
from localllm.mcp.config import load_config, parse_server
from localllm.mcp.model import openai_messages
from localllm.mcp.results import outcome_from_blocks
from localllm.mcp.tools import ToolSpec, argument_problem, assign_call_names, schema_problem
from localllm.settings import Settings
from localllm.tui.screens.chat_tools import _prompt_arguments


def test_the_config_reads_the_shape_other_hosts_write(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(
        json.dumps(
            {
                "globalShortcut": "Ctrl+Space",  # another host's own setting: kept
                "mcpServers": {
                    "time": {"command": "uvx", "args": ["mcp-server-time"], "env": {"TZ": "UTC"}},
                    "docs": {"url": "https://example.com/mcp", "headers": {"X-Key": "k"}},
                    "old": {"type": "sse", "url": "https://example.com/sse"},
                    "both": {"command": "x", "url": "https://example.com"},
                    "off": {"command": "y", "disabled": True, "autoApprove": ["z"]},
                },
            }
        )
    )
    config = load_config(path)
    assert list(config.servers) == ["time", "docs", "off"]
    time = config.servers["time"]
    assert (time.command, time.args, dict(time.env)) == ("uvx", ("mcp-server-time",), {"TZ": "UTC"})
    assert config.servers["docs"].is_remote and dict(config.servers["docs"].headers) == {
        "X-Key": "k"
    }
    assert config.servers["off"].disabled
    assert "SSE transport is not supported" in config.problems["old"]
    assert "either command" in config.problems["both"]
    with pytest.raises(ToolConfigError, match="SSE"):
        config.server("old")
    with pytest.raises(ToolConfigError, match=r"no MCP server named 'nope' .*\(time, docs, off\)"):
        config.server("nope")

    config.add("git", {"command": "uvx", "args": ["mcp-server-git"]})
    config.remove("time")
    written = json.loads(path.read_text())
    assert written["globalShortcut"] == "Ctrl+Space"
    assert written["mcpServers"]["off"]["autoApprove"] == ["z"]  # unknown fields kept
    assert "time" not in written["mcpServers"] and "git" in written["mcpServers"]
    assert os.stat(path).st_mode & 0o777 == 0o600  # entries may hold tokens
    with pytest.raises(ToolConfigError, match="already in"):
        config.add("git", {"command": "other"})


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"command": ""}, "command must be a non-empty string"),
        ({"command": "x", "args": "y"}, "args must be a list of strings"),
        ({"command": "x", "env": {"A": 1}}, "env must be an object of strings"),
        ({"url": "ftp://x"}, "url must be an http"),
        ({"command": "x", "timeout": 0}, "timeout must be a positive number"),
        ({"command": "x", "disabled": "yes"}, "disabled must be true or false"),
    ],
)
def test_bad_entries_are_named(entry: dict[str, object], message: str) -> None:
    with pytest.raises(ToolConfigError, match=message):
        parse_server("s", entry)


def test_an_unreadable_config_says_where(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text("{not json")
    with pytest.raises(ToolConfigError, match=r"mcp\.json is not valid JSON \(line 1"):
        load_config(path)
    assert load_config(tmp_path / "none.json").servers == {}  # no file yet: no servers


def test_settings() -> None:
    settings = Settings.from_env(
        {
            "LOCALLLM_MCP_TIMEOUT": "2m",
            "LOCALLLM_MCP_MAX_RESULT": "8K",
            "LOCALLLM_MCP_MAX_STEPS": "3",
        }
    )
    assert (settings.mcp_timeout, settings.mcp_max_result, settings.mcp_max_steps) == (120, 8192, 3)
    env = {"XDG_CONFIG_HOME": "/tmp/cfg"}
    assert Settings.from_env(env).mcp_config_path.name == "mcp.json"
    with pytest.raises(SettingsError, match="LOCALLLM_MCP_MAX_STEPS must be at least 1"):
        Settings.from_env({"LOCALLLM_MCP_MAX_STEPS": "0"})


def test_tool_names_are_unique_and_safe() -> None:
    tools = [
        ToolSpec("git", "status"),
        ToolSpec("svn", "status"),
        ToolSpec("web", "fetch.page"),
        ToolSpec("web", "x" * 80),
    ]
    names = [tool.call_name for tool in assign_call_names(tools)]
    assert names == ["git_status", "svn_status", "fetch_page", "x" * 64]


def test_schemas_and_arguments_are_checked() -> None:
    good = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}}
    assert schema_problem(good) is None
    assert "not 'object'" in (schema_problem({"type": "array"}) or "")
    bad = schema_problem({"type": "object", "properties": {"n": {"type": "nonsense"}}})
    assert bad is not None and "at properties/n/type" in bad
    assert argument_problem(good, {"n": 2}) is None
    assert argument_problem(good, {"n": 0}) == "n: 0 is less than the minimum of 1"
    assert argument_problem(good, "text") == "the arguments must be a JSON object, got str"


def test_a_long_result_is_cut_with_a_note_and_images_follow_vision() -> None:
    text = SimpleNamespace(type="text", text="y" * 5000)
    image = SimpleNamespace(type="image", data="iVBORw0KGgo=", mime_type="image/png")
    outcome = outcome_from_blocks([text, image], limit=1000, vision=False)
    assert outcome.text.startswith("y" * 1000 + "\n")
    assert outcome.cut == outcome.total - 1000 and outcome.total > 5000
    assert "the first 1,000 are kept" in outcome.text and not outcome.images
    assert "an image was left out: this model cannot see images" in outcome.notes
    seen = outcome_from_blocks([image], limit=1000, vision=True)
    assert seen.images == ["iVBORw0KGgo="] and seen.text == ""
    structured = outcome_from_blocks([], limit=100, vision=False, structured={"a": 1})
    assert structured.text == '{"a": 1}'


def test_the_forced_step_carries_the_conversation_in_chat_completions_shape() -> None:
    messages = openai_messages(
        [
            {"role": "user", "content": "Look", "images": ["iVBORw0KGgo="]},
            {
                "role": "assistant",
                "content": "",
                "thinking": "hmm",
                "tool_calls": [{"id": "c1", "function": {"name": "shot", "arguments": {}}}],
            },
            {
                "role": "tool",
                "content": "a picture",
                "tool_name": "shot",
                "tool_call_id": "c1",
                "images": ["/9j/4AAQ"],
            },
        ]
    )
    user, assistant, tool, images = messages
    assert user["content"][1]["image_url"]["url"].startswith("data:image/png;base64,")
    assert assistant["tool_calls"][0]["function"] == {"name": "shot", "arguments": "{}"}
    assert assistant["reasoning_content"] == "hmm"
    assert tool == {"role": "tool", "content": "a picture", "tool_call_id": "c1", "name": "shot"}
    # OpenAI takes images in user messages only: the tool's follow in one
    assert images["role"] == "user"
    assert images["content"][1]["image_url"]["url"].startswith("data:image/jpeg;base64,")


def test_prompt_arguments() -> None:
    assert _prompt_arguments("topic=the tests", ["topic"]) == {"topic": "the tests"}
    assert _prompt_arguments("a=1 2 b=3", ["a", "b"]) == {"a": "1 2", "b": "3"}
    assert _prompt_arguments("just this", ["topic"]) == {"topic": "just this"}
    assert _prompt_arguments("what", ["a", "b"]) is None
    assert _prompt_arguments("", ["a"]) == {}


def test_the_docs_document_the_settings_and_the_config_shape() -> None:
    root = Path(__file__).parents[2]
    configuration = (root / "docs" / "configuration.md").read_text()
    for variable in (
        "LOCALLLM_MCP_CONFIG",
        "LOCALLLM_MCP_TIMEOUT",
        "LOCALLLM_MCP_MAX_RESULT",
        "LOCALLLM_MCP_MAX_STEPS",
    ):
        assert f"| `{variable}` |" in configuration
    tools = (root / "docs" / "tools.md").read_text()
    assert tools.startswith("# Tools (MCP)\n") and '"mcpServers"' in tools
    assert "(docs/tools.md)" in (root / "README.md").read_text()
