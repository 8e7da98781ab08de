"""Anthropic's Messages API end to end: a real daemon, tiny models, the official ``anthropic``
client (and plain HTTP for the raw event stream and bad requests).

The daemon and its tiny tool-calling model come from :mod:`test_api_tools`; a third tiny model
here has a Qwen3-style reasoning switch. The weights are random: nothing asserts what a model
says, only shapes, counts, stop reasons, schema-valid calls, and that a stream reassembles to
the whole answer (greedy decoding, same run).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
import test_api_tools
from test_api_tools import HERMES, HERMES_TEMPLATE, JSONTOOLS, TOOLS, _valid
from test_daemon_support import Daemon

from localllm.client import Client
from localllm.daemon.api.errorshapes import anthropic_error
from localllm.daemon.engine.text import TextStream
from localllm.daemon.errors import HTTPProblem

pytestmark = pytest.mark.slow

daemon = test_api_tools.daemon  # a daemon with tiny:hermes and tiny:jsontools (module-scoped)

THINK = "tiny:think"
# HERMES_TEMPLATE with a reasoning switch, as Qwen3 and DeepSeek R1 have it: on, the answer
# starts inside <think>; off, the template closes an empty reasoning block itself.
THINK_TEMPLATE = HERMES_TEMPLATE.replace(
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking %}<think>\n"
    "{% else %}<think>\n\n</think>\n\n{% endif %}{% endif %}",
)
assert THINK_TEMPLATE != HERMES_TEMPLATE

# The same tools as test_api_tools, in Anthropic's shape.
ANTHROPIC_TOOLS = [
    {
        "name": t["function"]["name"],
        **({"description": t["function"]["description"]} if "description" in t["function"] else {}),
        "input_schema": t["function"]["parameters"],
    }
    for t in TOOLS
]
HI = [{"role": "user", "content": "Hello there"}]
ASK = [{"role": "user", "content": "What time is it in Paris?"}]
GREEDY = {"temperature": 0}  # the anthropic client has no temperature argument any more


@pytest.fixture(scope="module")
def models(daemon: Daemon, tiny_gguf: Path) -> Daemon:
    """The daemon, with a reasoning model added."""
    list(Client(daemon.settings).create(THINK, from_=str(tiny_gguf), template=THINK_TEMPLATE))
    return daemon


@pytest.fixture(scope="module")
def claude(models: Daemon) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=models.url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def http(models: Daemon) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=models.url, timeout=120) as client:
        yield client


def raw_events(http: httpx.Client, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The (event, data) pairs of a streamed answer, as sent."""
    events = []
    with http.stream("POST", "/v1/messages", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        name = None
        for line in response.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                data = json.loads(line[len("data: ") :])
                assert name == data["type"], (name, data)  # every event names its type
                events.append((name, data))
    return events


def reassemble(events: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Content blocks built from the events as a client builds them."""
    blocks: dict[int, dict[str, Any]] = {}
    partial: dict[int, str] = {}
    for name, data in events:
        if name == "content_block_start":
            blocks[data["index"]] = dict(data["content_block"])
        elif name == "content_block_delta":
            block, delta = blocks[data["index"]], data["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "input_json_delta":
                partial[data["index"]] = partial.get(data["index"], "") + delta["partial_json"]
    for index, text in partial.items():
        blocks[index]["input"] = json.loads(text)
    return [blocks[i] for i in sorted(blocks)]


def test_plain_message_whole_and_streamed(claude: anthropic.Anthropic, http: httpx.Client) -> None:
    whole = claude.messages.create(model=HERMES, max_tokens=16, messages=HI, extra_body=GREEDY)
    assert whole.id.startswith("msg_") and whole.type == "message" and whole.role == "assistant"
    assert whole.model == HERMES
    assert [b.type for b in whole.content] == ["text"]
    assert whole.stop_reason in ("end_turn", "max_tokens") and whole.stop_sequence is None
    assert 0 < whole.usage.output_tokens <= 16
    prompt = whole.usage.input_tokens + (whole.usage.cache_read_input_tokens or 0)
    assert prompt > 0

    # the client's own stream helper
    with claude.messages.stream(
        model=HERMES, max_tokens=16, messages=HI, extra_body=GREEDY
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text  # type: ignore[union-attr]
    assert final.content[0].text == text  # type: ignore[union-attr]
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0) == prompt

    # the events as sent: Anthropic's order
    body = {"model": HERMES, "max_tokens": 16, "messages": HI, **GREEDY}
    events = raw_events(http, body)
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert "ping" in names
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] == prompt
    assert names.count("content_block_start") == names.count("content_block_stop") == 1
    assert reassemble(events) == [{"type": "text", "text": text, "citations": None}]
    assert events[-2][1]["delta"]["stop_reason"] == whole.stop_reason


def test_system_prompt_string_or_blocks(claude: anthropic.Anthropic) -> None:
    def count(**kwargs: Any) -> int:
        return claude.messages.count_tokens(model=HERMES, messages=HI, **kwargs).input_tokens

    bare = count()
    as_string = count(system="You answer in French. Keep it short.")
    as_blocks = count(
        system=[
            {"type": "text", "text": "You answer in French."},
            {"type": "text", "text": "Keep it short.", "cache_control": {"type": "ephemeral"}},
        ]
    )
    assert as_string > bare + 5
    assert abs(as_blocks - as_string) <= 2  # the blocks are joined with a blank line
    answer = claude.messages.create(
        model=HERMES, max_tokens=4, messages=HI, system="You answer in French.", extra_body=GREEDY
    )
    total = answer.usage.input_tokens + (answer.usage.cache_read_input_tokens or 0)
    assert total == count(system="You answer in French.")


def test_forced_tool_use_whole_and_streamed(
    claude: anthropic.Anthropic, http: httpx.Client
) -> None:
    kwargs: dict[str, Any] = {
        "model": HERMES,
        "max_tokens": 120,
        "messages": ASK,
        "tools": ANTHROPIC_TOOLS,
        "tool_choice": {"type": "any"},
    }
    whole = claude.messages.create(**kwargs, extra_body=GREEDY)
    assert whole.stop_reason == "tool_use"
    calls = [b for b in whole.content if b.type == "tool_use"]
    assert calls
    for call in calls:
        assert call.id and isinstance(call.input, dict)
        assert _valid(call.name, call.input)
    events = raw_events(http, {**kwargs, **GREEDY})
    streamed = [b for b in reassemble(events) if b["type"] == "tool_use"]
    assert [(b["name"], b["input"]) for b in streamed] == [(c.name, c.input) for c in calls]
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    # the client's stream helper parses the same input from the input_json_delta events
    with claude.messages.stream(**kwargs, extra_body=GREEDY) as stream:
        final = stream.get_final_message()
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == [
        (c.name, c.input) for c in calls
    ]


def ask_with_tools(claude: anthropic.Anthropic, tool_choice: dict[str, Any]) -> Any:
    """:data:`ASK` with the tools, greedy, as ``tool_choice`` says."""
    return claude.messages.create(
        model=HERMES,
        max_tokens=120,
        messages=ASK,
        tools=ANTHROPIC_TOOLS,  # type: ignore[arg-type]
        tool_choice=tool_choice,  # type: ignore[arg-type]
        extra_body=GREEDY,
    )


def test_named_tool_without_parallel_calls(claude: anthropic.Anthropic) -> None:
    answer = ask_with_tools(
        claude, {"type": "tool", "name": "set_alarm", "disable_parallel_tool_use": True}
    )
    calls = [b for b in answer.content if b.type == "tool_use"]
    assert len(calls) == 1 and calls[0].name == "set_alarm"
    assert _valid("set_alarm", calls[0].input)  # type: ignore[arg-type]
    assert answer.stop_reason == "tool_use"


def test_multi_turn_with_tool_use_and_result(claude: anthropic.Anthropic) -> None:
    first = ask_with_tools(claude, {"type": "any", "disable_parallel_tool_use": True})
    (call,) = [b for b in first.content if b.type == "tool_use"]
    history: list[Any] = [
        *ASK,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
    ]

    def result(content: Any, **extra: Any) -> dict[str, Any]:
        block = {"type": "tool_result", "tool_use_id": call.id, "content": content, **extra}
        return {"role": "user", "content": [block]}

    def count(messages: list[Any]) -> int:
        return claude.messages.count_tokens(
            model=HERMES,
            messages=messages,
            tools=ANTHROPIC_TOOLS,  # type: ignore[arg-type]
        ).input_tokens

    with_text = count([*history, result("12:00 in Paris")])
    with_blocks = count([*history, result([{"type": "text", "text": "12:00 in Paris"}])])
    failed = count([*history, result("no clock", is_error=True)])
    before = count(history[:1])
    assert with_text == with_blocks and with_text > before + 10
    assert failed > before
    answer = claude.messages.create(
        model=HERMES,
        max_tokens=3,
        messages=[*history, result("12:00 in Paris")],
        tools=ANTHROPIC_TOOLS,  # type: ignore[arg-type]
        extra_body=GREEDY,
    )
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert answer.usage.input_tokens + (answer.usage.cache_read_input_tokens or 0) == with_text


def test_stop_sequences(claude: anthropic.Anthropic, http: httpx.Client) -> None:
    # a stop sequence taken from the model's own answer (whatever it is on this CPU)
    for question in ("Why is the sky blue?", "Tell me a story", "Hello there"):
        messages = [{"role": "user", "content": question}]
        # Asked twice: the answer compared against is then computed from the cached prompt,
        # as the requests below are (a prompt evaluated in one batch and one reused from the
        # cache can differ in the last bits of a logit, enough to flip a greedy near-tie).
        for _ in range(2):
            whole = claude.messages.create(
                model=HERMES, max_tokens=24, messages=messages, extra_body=GREEDY
            )
        text = whole.content[0].text  # type: ignore[union-attr]
        stops = [text[i : i + 2] for i in range(3, len(text) - 2) if text[i : i + 2].strip()]
        if stops:
            break
    else:
        pytest.skip(f"the greedy answers are too short to cut: {text!r}")
    stop = stops[0]
    cut = claude.messages.create(
        model=HERMES, max_tokens=24, messages=messages, stop_sequences=[stop], extra_body=GREEDY
    )
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].text == text[: text.find(stop)]  # type: ignore[union-attr]
    assert cut.usage.output_tokens < whole.usage.output_tokens
    body = {"model": HERMES, "max_tokens": 24, "messages": messages, "stop_sequences": [stop]}
    events = raw_events(http, {**body, **GREEDY})
    shown = text[: text.find(stop)]
    assert reassemble(events) == [{"type": "text", "text": shown, "citations": None}]
    delta = events[-2][1]
    assert delta["delta"]["stop_reason"] == "stop_sequence"
    assert delta["delta"]["stop_sequence"] == stop
    assert delta["usage"]["output_tokens"] == cut.usage.output_tokens


def test_thinking_switch_and_budget(claude: anthropic.Anthropic, http: httpx.Client) -> None:
    def count(thinking: Any) -> int:
        return claude.messages.count_tokens(
            model=THINK, messages=HI, thinking=thinking
        ).input_tokens

    on = count({"type": "enabled", "budget_tokens": 1024})
    off = count({"type": "disabled"})
    assert off > on  # the template closed an empty reasoning block itself
    assert count(None) == off  # no thinking field: off, as Anthropic's default

    budget = 6
    kwargs: dict[str, Any] = {
        "model": THINK,
        "max_tokens": 40,
        "messages": HI,
        "thinking": {"type": "enabled", "budget_tokens": budget},
    }
    whole = claude.messages.create(**kwargs, extra_body=GREEDY)
    assert whole.content[0].type == "thinking" and whole.content[0].thinking
    assert whole.content[0].signature == ""
    # the budget closes the reasoning (its close tag inserted) and the answer follows: the
    # answer ends as answers do, never at the budget
    assert [b.type for b in whole.content] in (["thinking"], ["thinking", "text"])
    assert whole.stop_reason in ("end_turn", "max_tokens")
    if whole.stop_reason == "max_tokens":
        assert whole.usage.output_tokens == kwargs["max_tokens"]
    events = raw_events(http, {**kwargs, **GREEDY})
    shown = [{k: v for k, v in block.items() if v is not None} for block in reassemble(events)]
    assert shown == [b.model_dump(exclude_none=True) for b in whole.content]
    omitted = claude.messages.create(
        **{**kwargs, "thinking": {**kwargs["thinking"], "display": "omitted"}}, extra_body=GREEDY
    )
    assert omitted.content[0].type == "thinking" and omitted.content[0].thinking == ""

    # a thinking block in the history is accepted (its signature is not checked)
    history = [
        *HI,
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "They greet me.", "signature": "abc"},
                {"type": "text", "text": "Hi!"},
            ],
        },
        {"role": "user", "content": "How are you?"},
    ]
    again = claude.messages.create(model=THINK, max_tokens=2, messages=history, extra_body=GREEDY)
    assert again.stop_reason in ("end_turn", "max_tokens")


def _error(http: httpx.Client, body: dict[str, Any], path: str = "/v1/messages") -> Any:
    response = http.post(path, json=body)
    data = response.json()
    assert data["type"] == "error", data
    return response.status_code, data["error"]["type"], data["error"]["message"]


BASE: dict[str, Any] = {"model": HERMES, "max_tokens": 8, "messages": HI}
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}}


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"model": HERMES, "messages": HI}, "max_tokens"),
        ({**BASE, "speed": "fast"}, "speed"),
        ({**BASE, "frequency_penalty": 1}, "frequency_penalty"),
        ({**BASE, "messages": [{"role": "user", "content": [IMAGE]}]}, "no vision support"),
        (
            {
                **BASE,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": "t", "content": [IMAGE]}
                        ],
                    }
                ],
            },
            "no vision support",
        ),
        (
            {**BASE, "thinking": {"type": "enabled", "budget_tokens": 4}},
            "does not support thinking",
        ),
        (
            {**BASE, "model": THINK, "thinking": {"type": "enabled", "budget_tokens": 8}},
            "greater than thinking.budget_tokens",
        ),
        ({**BASE, "tools": [{"type": "web_search_20250305", "name": "web"}]}, "server tools"),
        ({**BASE, "tools": [{"name": "f"}]}, "input_schema"),
        ({**BASE, "tools": [{"name": "a b", "input_schema": {}}]}, "tools[0].name"),
        ({**BASE, "tool_choice": {"type": "any"}}, "tool_choice"),
        (
            {**BASE, "tools": ANTHROPIC_TOOLS, "tool_choice": {"type": "tool", "name": "nope"}},
            "tool_choice.name",
        ),
        ({**BASE, "messages": [*HI, {"role": "assistant", "content": "Sure"}]}, "prefill"),
        ({**BASE, "messages": [{"role": "user", "content": [{"type": "video"}]}]}, "video"),
        ({**BASE, "stop_sequences": [""]}, "stop_sequences"),
        ({**BASE, "output_config": {"effort": "high"}}, "effort"),
        ({**BASE, "model": "bad name!"}, "model"),
    ],
)
def test_bad_requests_are_invalid_request_errors(
    http: httpx.Client, body: dict[str, Any], words: str
) -> None:
    status, kind, message = _error(http, body)
    assert (status, kind) == (400, "invalid_request_error"), message
    assert words in message


def test_strict_tools_need_an_opener(http: httpx.Client) -> None:
    strict = [{**ANTHROPIC_TOOLS[0], "strict": True}]
    # hermes calls open with <tool_call>: a lazy grammar checks calls from there on
    ok = http.post("/v1/messages", json={**BASE, "tools": strict, **GREEDY})
    assert ok.status_code == 200, ok.text
    # bare JSON calls have no opener to wait for: refused rather than not checked
    status, kind, message = _error(http, {**BASE, "model": JSONTOOLS, "tools": strict})
    assert (status, kind) == (400, "invalid_request_error") and "strict" in message


def test_unknown_model_and_client_errors(claude: anthropic.Anthropic, http: httpx.Client) -> None:
    status, kind, message = _error(http, {**BASE, "model": "nosuch:model"})
    assert (status, kind) == (404, "not_found_error") and "localllm pull" in message
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.create(model="nosuch:model", max_tokens=4, messages=HI)
    with pytest.raises(anthropic.BadRequestError) as info:
        claude.messages.create(
            model=HERMES,
            max_tokens=4,
            messages=[{"role": "user", "content": [IMAGE]}],  # type: ignore[list-item]
        )
    assert "no vision support" in str(info.value)
    status, kind, _ = _error(
        http, {"model": "nosuch:model", "messages": HI}, "/v1/messages/count_tokens"
    )
    assert (status, kind) == (404, "not_found_error")
    # not JSON at all
    response = http.post("/v1/messages", content=b"{nope")
    assert response.status_code == 400 and response.json()["type"] == "error"
    # Anthropic's headers are accepted
    headers = {"x-api-key": "k", "anthropic-version": "2023-06-01", "anthropic-beta": "x"}
    ok = http.post("/v1/messages", json={**BASE, **GREEDY}, headers=headers)
    assert ok.status_code == 200 and ok.json()["type"] == "message"


def test_prompt_too_long(http: httpx.Client) -> None:
    # Anthropic's wording, which Claude Code looks for to compact the conversation
    long = [{"role": "user", "content": "hello " * 8000}]
    for stream in (False, True):
        status, kind, message = _error(http, {**BASE, "messages": long, "stream": stream})
        assert (status, kind) == (400, "invalid_request_error")
        assert re.match(r"prompt is too long: \d+ tokens > \d+ maximum", message), message


# --- units -------------------------------------------------------------------------------------


def test_stop_sequences_across_pieces() -> None:
    """The runner's stop matching, which every API reports: the earliest stop string in the
    text, found across token pieces, never emitted, and named."""

    def feed(stream: TextStream, pieces: tuple[str, ...]) -> list[str]:
        return [stream.push(piece.encode()) for piece in pieces]

    stream = TextStream(["END", "STOP"])
    assert feed(stream, ("hello E", "x E", "N", "Dmore", "after")) == ["hello ", "Ex ", "", "", ""]
    assert stream.stopped_by == "END" and stream.finish() == ""
    earliest = TextStream(["later", "soon"])
    assert earliest.push(b"a soon and later") == "a "
    assert earliest.stopped_by == "soon"
    unmatched = TextStream(["END"])
    assert unmatched.push(b"the EN") == "the "
    assert unmatched.finish() == "EN" and unmatched.stopped_by is None  # held, then released


@pytest.mark.parametrize(
    ("problem", "status", "kind"),
    [
        (HTTPProblem(400, "bad"), 400, "invalid_request_error"),
        (HTTPProblem(401, "key"), 401, "authentication_error"),
        (HTTPProblem(404, "no model", code="model_not_found"), 404, "not_found_error"),
        (HTTPProblem(413, "big"), 413, "request_too_large"),
        (HTTPProblem(503, "busy", code="server_busy"), 529, "overloaded_error"),
        (HTTPProblem(500, "runner died"), 500, "api_error"),
        (HTTPProblem(507, "disk full"), 507, "api_error"),
    ],
)
def test_error_shapes(problem: HTTPProblem, status: int, kind: str) -> None:
    got_status, body = anthropic_error(problem)
    assert got_status == status
    assert body["request_id"].startswith("req_")
    assert body == {
        "type": "error",
        "error": {"type": kind, "message": problem.message},
        "request_id": body["request_id"],
    }
