"""The agent loop shared by ``localllm run`` and the TUI, against the test MCP server (a real
subprocess, the SDK's ``MCPServer``) and a scripted model behind the daemon's real HTTP
protocol: calls checked, asked, remembered; servers that fail to start, hang, exit mid-call,
answer too slowly or with megabytes; sampling answered by the model; the forced first step
and the step limit. Each test asserts what the model was sent and what ran, never timings.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp_support import Reply, ScriptedModel, toolbox_entry, write_config

from localllm._exceptions import LocalLLMError
from localllm.client import AsyncClient
from localllm.mcp.host import ToolHost
from localllm.mcp.loop import LoopRequest, LoopResult
from localllm.settings import Settings

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """The SDK and the client run on asyncio here, as in the CLI and the TUI (one event loop
    for the module, so that the tests share one test server)."""
    return "asyncio"


@pytest.fixture(scope="module")
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel() as scripted:
        yield scripted


@pytest.fixture
def scripted(model: ScriptedModel) -> ScriptedModel:
    model.script.clear()
    model.requests.clear()
    return model


class Recorder:
    """The loop's events, recorded; approvals answered from :attr:`answers` in order."""

    def __init__(self, answers: list[str] | None = None) -> None:
        self.answers = list(answers or [])
        self.asked: list[str] = []
        self.sampling: list[tuple[str, str]] = []
        self.notices: list[str] = []
        self.text: list[str] = []

    async def step_started(self, number: int) -> None:
        pass

    async def write(self, thinking: str, content: str) -> None:
        self.text.append(content)

    async def step_finished(self, number: int, reply: Any) -> None:
        pass

    async def call_shown(self, record: Any) -> None:
        pass

    async def approve(self, record: Any) -> str:
        self.asked.append(record.title)
        return self.answers.pop(0)

    async def call_finished(self, record: Any) -> None:
        pass

    async def approve_sampling(self, server: str, preview: str) -> str:
        self.sampling.append((server, preview))
        return self.answers.pop(0)

    async def notice(self, text: str) -> None:
        self.notices.append(text)


@pytest.fixture(scope="module")
async def box(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ToolHost]:
    """A host with the test server, started once for the module."""
    folder = tmp_path_factory.mktemp("box")
    host = ToolHost.from_settings(
        settings_for(folder, {"box": toolbox_entry(calls=folder / "calls.jsonl")})
    )
    try:
        assert await host.start() == []
        yield host
    finally:
        await host.close()


@pytest.fixture
def host(box: ToolHost) -> ToolHost:
    """The module's host, with nothing approved for good yet and no calls logged."""
    box.approvals.always.clear()
    calls(box).unlink(missing_ok=True)
    return box


def calls(host: ToolHost) -> Path:
    """The file where the host's test server logs the calls it ran."""
    return Path(host.manager.handle("box").config.env["TOOLBOX_CALLS"])


def settings_for(tmp_path: Path, servers: dict[str, Any], **env: str) -> Settings:
    config = write_config(tmp_path / "mcp.json", servers)
    return Settings.from_env(
        {"LOCALLLM_HOME": str(tmp_path), "LOCALLLM_MCP_CONFIG": str(config), **env}
    )


async def run(
    host: ToolHost, model: ScriptedModel, events: Recorder, question: str, **request: Any
) -> LoopResult:
    async with AsyncClient(base_url=model.url) as client:
        loop = host.loop(
            client,
            LoopRequest("scripted", [{"role": "user", "content": question}], [], **request),
            events,
        )
        return await loop.run()


def tool_results(result: LoopResult) -> list[str]:
    return [m["content"] for m in result.messages if m["role"] == "tool"]


def ran(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_calls_are_checked_asked_and_remembered(
    scripted: ScriptedModel, host: ToolHost
) -> None:
    scripted.script = [
        Reply(
            "Let me see.",
            [
                ("add", {"a": 2, "b": 3}),  # declined
                ("colour_of", {"thing": "moon"}),  # not in the enum: never asked
                ("nosuch", {}),  # no such tool
            ],
        ),
        Reply("", [("add", {"a": 1, "b": 2})]),  # "always"
        Reply("", [("add", {"a": 5, "b": 5})]),  # not asked again
        Reply("Done."),
    ]
    events = Recorder(["no", "always"])
    result = await run(host, scripted, events, "Add things.")
    assert events.asked == ["box · add", "box · add"]
    assert [c["arguments"] for c in ran(calls(host))] == [{"a": 1, "b": 2}, {"a": 5, "b": 5}]
    declined, invalid, unknown, three, ten = tool_results(result)
    assert declined == "the person declined this call"
    assert invalid.startswith("invalid arguments, not run: thing: 'moon' is not one of")
    assert unknown.startswith("no tool is called 'nosuch'")
    assert (three, ten) == ("3", "10")
    assert result.content == "Done." and not result.limit_reached
    # every step was offered the server's tools, under their own names
    for body in scripted.chat_requests():
        assert {t["function"]["name"] for t in body["tools"]} >= {"add", "colour_of", "slow"}
    # the model got every call answered, in order, with its id
    last = scripted.chat_requests()[-1]["messages"]
    assert [m["role"] for m in last] == ["user", "assistant", *["tool"] * 3] + [
        "assistant",
        "tool",
    ] * 2
    summary = result.timings.summary()
    assert "2 calls" in summary and "4 steps" in summary  # the declined call never ran


async def test_servers_that_misbehave_never_hang_or_lose_the_chat(
    scripted: ScriptedModel, tmp_path: Path
) -> None:
    settings = settings_for(
        tmp_path,
        {
            "box": toolbox_entry("--bad-schema", timeout=2),
            "dead": toolbox_entry("--fail-start"),
            "stuck": toolbox_entry("--hang-start", start_timeout=2),
            "missing": {"command": str(tmp_path / "no-such-program")},
        },
        LOCALLLM_MCP_MAX_RESULT="4K",
    )
    host = ToolHost.from_settings(settings, auto_approve=True)  # as `run --yes`
    scripted.script = [
        Reply("", [("slow", {"seconds": 60})]),  # past its 2 s timeout
        Reply("", [("flood", {"megabytes": 3})]),  # cut to 4K characters
        Reply("", [("crash", {})]),  # the process exits mid-call
        Reply("", [("add", {"a": 1, "b": 1})]),  # started again on the next need
        Reply("Survived."),
    ]
    try:
        problems = " | ".join(await host.start())
        assert "'dead' failed: exited while starting" in problems
        assert "cannot open the database /nowhere/db.sqlite" in problems  # its log's cause
        assert "'stuck' failed: did not answer within 2s of its start" in problems
        assert "'missing' failed: no such program" in problems
        assert "box/broken left out: its input schema is not valid JSON Schema" in problems
        assert "broken" not in {tool.name for tool in host.tools()}
        result = await run(host, scripted, Recorder(), "Misbehave.", max_result=4096)
        again = await run(host, scripted, Recorder(), "Still there?")
    finally:
        await host.close()
    slow, flood, crash, added = tool_results(result)
    assert slow == "the tool 'slow' on 'box' did not answer within 2s"
    assert flood.startswith("x" * 4096 + "\n[cut: the tool returned 3.0 M characters; ")
    assert flood.endswith("the first 4,096 are kept, 3.0 M left out]")
    assert "exited" in crash and "crashing on purpose" in crash  # the log's last line
    assert added == "2"
    statuses = [record.status for record in result.calls]
    assert statuses == ["timeout", "done", "error", "done"]
    assert result.calls[1].outcome is not None and result.calls[1].outcome.cut > 3_000_000
    assert result.content == "Survived." and again.content == "done"
    offered = {t["function"]["name"] for t in scripted.chat_requests()[0]["tools"]}
    assert "broken" not in offered and "add" in offered


async def test_sampling_is_answered_by_the_model_with_approval(
    scripted: ScriptedModel, host: ToolHost
) -> None:
    scripted.script = [
        Reply("", [("consult", {"question": "What colour is the sky?"})]),
        Reply("Blue"),  # the sampling request, answered by the same model
        Reply("", [("consult", {"question": "And grass?"})]),  # declined this time
        Reply("Done."),
    ]
    events = Recorder(["yes", "yes", "yes", "no"])  # call, sampling, call, sampling
    result = await run(host, scripted, events, "Ask the model.", options={"seed": 3})
    first, second = tool_results(result)
    assert first == "the model answered: Blue"
    assert "declined" in second
    assert [server for server, _ in events.sampling] == ["box", "box"]
    assert events.sampling[0][1] == "What colour is the sky?"
    (path, sampled) = scripted.requests[1]
    assert path == "/api/chat" and sampled["stream"] is False and "tools" not in sampled
    assert sampled["messages"] == [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "What colour is the sky?"},
    ]
    assert sampled["options"] == {"seed": 3, "num_predict": 16}  # the server's max_tokens
    assert [s.kind for s in result.timings.steps].count("sampling") == 1
    assert any("box asked the model" in notice for notice in events.notices)


async def test_a_forced_first_step_and_the_step_limit(
    scripted: ScriptedModel, host: ToolHost
) -> None:
    scripted.script = [
        Reply("", [("picture", {})]),
        Reply("", [("add", {"a": 1, "b": 1})]),  # the last step: not run
    ]
    events = Recorder(["always", "always"])
    options = {"temperature": 0, "num_predict": 50}
    result = await run(
        host, scripted, events, "Show me.", required=True, max_steps=2, options=options, vision=True
    )
    with pytest.raises(LocalLLMError, match="the option num_ctx cannot go with --tools"):
        await run(host, scripted, events, "Again.", required=True, options={"num_ctx": 512})
    (first_path, forced), (second_path, plain) = scripted.requests[:2]
    assert first_path == "/v1/chat/completions" and second_path == "/api/chat"
    assert forced["tool_choice"] == "required"
    assert forced["max_tokens"] == 50 and forced["temperature"] == 0
    assert {t["function"]["name"] for t in forced["tools"]} == {
        t["function"]["name"] for t in plain["tools"]
    }
    assert plain["options"] == options and "tool_choice" not in plain
    picture = plain["messages"][-1]
    assert picture["role"] == "tool" and picture["images"]  # a model that sees gets it
    assert result.limit_reached and result.calls[-1].status == "skipped"
    assert tool_results(result)[-1] == "not run: the step limit was reached"
    assert any("stopped after 2 model steps" in notice for notice in events.notices)
