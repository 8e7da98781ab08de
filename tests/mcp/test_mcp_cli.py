"""``localllm mcp add|list|rm`` and ``localllm run`` as an MCP host, run as a user runs them:
in a real terminal (pexpect) where the approvals are typed, and piped. The loop's answers
come from a scripted model (the daemon's real HTTP protocol) where a real model's choices
would make the test flaky; one test runs the bundled starter (SmolLM2) with a chat template
that declares tools, on a real daemon. The tools are the test MCP server and the published
``mcp-server-time``, both real subprocesses.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pexpect
import pytest
from mcp_support import Reply, ScriptedModel, toolbox_entry, write_config
from test_cli_support import CliHome, cli_home, closed_port_url
from tiny_gguf import HERMES_TEMPLATE

TIME_SERVER = {
    "command": sys.executable,
    "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
}


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


@pytest.fixture
def home(tmp_path: Path, model: ScriptedModel) -> Iterator[CliHome]:
    """A home whose "daemon" is the scripted model, with an MCP config of its own."""
    with cli_home(
        tmp_path / "home",
        LOCALLLM_HOST=f"127.0.0.1:{model.port}",
        LOCALLLM_MCP_CONFIG=str(tmp_path / "mcp.json"),
    ) as cli:
        yield cli


def ran(calls: Path) -> list[dict[str, Any]]:
    if not calls.exists():
        return []
    return [json.loads(line) for line in calls.read_text().splitlines()]


def test_mcp_add_list_and_rm(home: CliHome, tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "mcp.json",
        {"time": TIME_SERVER, "gone": {"command": str(tmp_path / "no-such-program")}},
    )
    toolbox = str(toolbox_entry()["args"][0])
    out = home.ok(
        "mcp", "add", "box", "--env", "A=1", "--", sys.executable, toolbox, "--bad-schema"
    )
    assert "Added MCP server 'box'" in out and str(config) in out
    home.ok("mcp", "add", "remote", "--url", f"{closed_port_url()}/mcp", "--header", "X-Key: k")
    written = json.loads(config.read_text())["mcpServers"]
    assert written["box"]["env"] == {"A": "1"} and written["box"]["args"][-1] == "--bad-schema"
    assert written["remote"] == {"url": written["remote"]["url"], "headers": {"X-Key": "k"}}
    assert written["time"] == TIME_SERVER  # the entries already there are kept as they were
    assert "already in" in home.fails("mcp", "add", "box", "--", "other")

    listing = home.run("mcp", "list")
    assert listing.returncode == 0, listing.stderr
    text = listing.stdout
    assert re.search(r"box .*\n  state: ok\n  tool add  Add two whole numbers\.", text), text
    assert "prompts: review" in text and "resources: notes://today" in text
    assert "tool get_current_time" in text and "tool convert_time" in text  # the published one
    assert "gone " in text and "state: failed: no such program" in text
    assert re.search(r"remote .*\n  state: failed: ", text), text
    assert "box/broken left out: its input schema is not valid JSON Schema" in listing.stderr

    assert "Removed MCP server 'gone'" in home.ok("mcp", "rm", "gone")
    assert "no MCP server named 'gone'" in home.fails("mcp", "rm", "gone")
    assert "gone" not in json.loads(config.read_text())["mcpServers"]


def test_run_asks_before_each_call_in_a_terminal(
    home: CliHome, scripted: ScriptedModel, tmp_path: Path
) -> None:
    calls = tmp_path / "calls.jsonl"
    write_config(tmp_path / "mcp.json", {"box": toolbox_entry("--bad-schema", calls=calls)})
    scripted.script = [
        Reply("Let me add.", [("add", {"a": 2, "b": 3})]),  # n
        Reply("", [("add", {"a": 1, "b": 2})]),  # a: always for add
        Reply("", [("add", {"a": 5, "b": 5})]),  # not asked
        Reply("Five."),
    ]
    child = home.spawn("run", "scripted", timeout=60)
    child.expect(">>> ")
    child.sendline("What is 2+3?")
    child.expect("warning: MCP tool box/broken left out")
    child.expect_exact('⚙ box · add {"a": 2, "b": 3}')
    child.expect(r"Run it\? \[y\]es, \[n\]o, \[a\]lways for this tool, \[s\]top: ")
    assert ran(calls) == []  # asked before it runs
    child.sendline("n")
    child.expect("box · add declined")
    child.expect_exact('⚙ box · add {"a": 1, "b": 2}')
    child.expect(r"Run it\?")
    child.sendline("a")
    child.expect(r"✓ box · add done \(\d+ ms\): 3")
    child.expect(r"✓ box · add done \(\d+ ms\): 10")
    child.expect("Five.")
    child.expect(">>> ")
    assert [c["arguments"] for c in ran(calls)] == [{"a": 1, "b": 2}, {"a": 5, "b": 5}]

    child.sendline("/tools")
    child.expect("box: running")
    child.expect("  slow ")
    child.expect(">>> ")

    # Ctrl-C at the question stops the loop; the chat goes on
    scripted.script = [Reply("", [("slow", {"seconds": 1})]), Reply("Hello again.")]
    child.sendline("Wait for me.")
    child.expect(r"Run it\?")
    child.sendintr()
    child.expect(">>> ")
    child.sendline("Still there?")
    child.expect("Hello again.")
    child.expect(">>> ")
    child.sendline("/bye")
    child.expect(pexpect.EOF)
    assert all(c["tool"] != "slow" for c in ran(calls))
    # the stopped call was answered in the history the model saw next
    sent = scripted.chat_requests()[-1]["messages"]
    assert sent[-3]["tool_calls"][0]["function"]["name"] == "slow"
    assert sent[-2] == {
        "role": "tool",
        "content": "the person declined this call",
        "tool_name": "slow",
        "tool_call_id": "call_0",
    }


def test_run_yes_with_the_published_time_server(
    home: CliHome, scripted: ScriptedModel, tmp_path: Path
) -> None:
    write_config(
        tmp_path / "mcp.json", {"time": TIME_SERVER, "off": {"command": "x", "disabled": True}}
    )
    scripted.script = [Reply("", [("get_current_time", {"timezone": "UTC"})]), Reply("It is late.")]
    result = home.run("run", "scripted", "--yes", "--verbose", "What time is it?")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "It is late.\n"
    err = result.stderr
    assert '⚙ time · get_current_time {"timezone": "UTC"}' in err
    assert re.search(r"✓ time · get_current_time done \(\d+ ms\): \{ \"timezone\": \"UTC\"", err), (
        err
    )
    # where the time went: each model step, the call, then the last step's usual block
    assert re.search(r"^model step 1: +\S+ +TTFT", err, re.MULTILINE), err
    assert re.search(r"^tool time/get_current_time: +\S+ +done", err, re.MULTILINE), err
    assert re.search(r"^loop: model .* · tools .* \(1 call\)", err, re.MULTILINE), err
    assert re.search(r"^eval rate: ", err, re.MULTILINE), err
    result_message = scripted.chat_requests()[-1]["messages"][-1]
    assert result_message["role"] == "tool"
    assert json.loads(result_message["content"])["timezone"] == "UTC"

    # piped, without --yes: nobody to ask, so nothing runs, and the line says why
    scripted.script = [Reply("", [("get_current_time", {"timezone": "UTC"})]), Reply("Fine.")]
    piped = home.run("run", "scripted", input="What time is it?\n")
    assert piped.returncode == 0, piped.stderr
    assert "no terminal to ask: not run; `localllm run --yes` approves calls" in piped.stderr
    assert (
        scripted.chat_requests()[-1]["messages"][-1]["content"] == "the person declined this call"
    )

    # --mcp naming a server that does not exist: an error before anything starts
    assert "no MCP server named 'nope'" in home.fails("run", "scripted", "--mcp", "nope", "Hi")

    # a model whose template declares no tools: said at once, and it answers plainly
    scripted.capabilities = ["completion"]
    scripted.script = [Reply("Plain.")]
    plain = home.run("run", "scripted", "Hi")
    assert plain.returncode == 0 and plain.stdout == "Plain.\n", plain.stderr
    assert 'note: "scripted" cannot call tools (its template declares none' in plain.stderr
    assert "tools" not in scripted.chat_requests()[-1]
    refused = home.fails("run", "scripted", "--tools", "required", "Hi")
    assert '"scripted" cannot call tools' in refused


@pytest.mark.slow
def test_the_starter_calls_a_tool(tmp_path: Path) -> None:
    """SmolLM2 with a template that declares tools (Qwen's Hermes style, which its ChatML
    tokens fit), forced to call the test server's one enum tool: the call is whatever the
    model picks within the schema, so only its shape and its effect are asserted."""
    calls = tmp_path / "calls.jsonl"
    config = write_config(
        tmp_path / "mcp.json", {"box": toolbox_entry("--only", "colour_of", calls=calls)}
    )
    modelfile = tmp_path / "Modelfile"
    modelfile.write_text(
        f'FROM smollm2:135m\nTEMPLATE """{HERMES_TEMPLATE}"""\n'
        "PARAMETER num_predict 32\nPARAMETER temperature 0\n"
    )
    with cli_home(
        tmp_path / "home",
        LOCALLLM_MCP_CONFIG=str(config),
        LOCALLLM_NUM_PARALLEL="1",
        LOCALLLM_MCP_MAX_STEPS="2",  # the forced call, then the answer (or a call not run)
    ) as cli:
        cli.ok("create", "smoltools", "-f", str(modelfile))
        result = cli.run(
            "run",
            "smoltools",
            "--tools",
            "required",
            "--yes",
            "--verbose",
            "What colour is the sky?",
        )
        assert result.returncode == 0, result.stderr
        call = re.search(r'⚙ box · colour_of \{"thing": "(sky|grass)"\}', result.stderr)
        assert call, result.stderr
        assert ran(calls) == [{"tool": "colour_of", "arguments": {"thing": call.group(1)}}]
        colour = {"sky": "blue", "grass": "green"}[call.group(1)]
        assert "✓ box · colour_of done" in result.stderr and f": {colour}" in result.stderr
        assert re.search(r"^model step 2: ", result.stderr, re.MULTILINE), result.stderr
