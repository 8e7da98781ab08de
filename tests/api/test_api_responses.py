"""OpenAI's Responses API end to end: a real daemon, tiny models, the official ``openai``
client's ``responses.create`` and ``responses.stream`` (and plain HTTP for bad requests).

The daemon and models come from :mod:`test_api_tools` and :mod:`test_api_anthropic` (which
adds a model with a reasoning switch). Nothing asserts what a model says: only shapes, counts,
statuses, schema-valid calls, and that a stream reassembles to the whole answer.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import test_api_anthropic
from test_api_anthropic import THINK
from test_api_tools import HERMES, JSONTOOLS, TOOLS, _valid
from test_daemon_support import Daemon

pytestmark = pytest.mark.slow

daemon = test_api_anthropic.daemon  # tiny:hermes and tiny:jsontools (module-scoped)
models = test_api_anthropic.models  # adds tiny:think

FLAT_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]
ASK = "What time is it in Paris?"


@pytest.fixture(scope="module")
def oai(models: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{models.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def http(models: Daemon) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=models.url, timeout=120) as client:
        yield client


def _events(oai: openai.OpenAI, **kwargs: Any) -> list[Any]:
    return list(oai.responses.create(stream=True, temperature=0, **kwargs))


def _check_sequence(events: list[Any]) -> None:
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    ids = {
        e.response.id for e in events if e.type.startswith("response.") and hasattr(e, "response")
    }
    assert len(ids) == 1


def test_plain_answer_whole_and_streamed(oai: openai.OpenAI) -> None:
    whole = oai.responses.create(
        model=HERMES, input="Hello there", max_output_tokens=16, temperature=0
    )
    assert whole.id.startswith("resp_") and whole.object == "response"
    assert whole.model == HERMES and whole.status in ("completed", "incomplete")
    assert whole.store is False  # nothing is kept
    (message,) = whole.output
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_") and message.status == whole.status
    assert [p.type for p in message.content] == ["output_text"]
    usage = whole.usage
    assert usage is not None and usage.input_tokens > 0 and 0 < usage.output_tokens <= 16
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    if whole.status == "incomplete":
        assert whole.incomplete_details is not None
        assert whole.incomplete_details.reason == "max_output_tokens"

    events = _events(oai, model=HERMES, input="Hello there", max_output_tokens=16)
    _check_sequence(events)
    kinds = [e.type for e in events]
    assert kinds[-1] == f"response.{whole.status}"
    assert kinds[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert kinds[-4:-1] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text
    done = next(e for e in events if e.type == "response.output_text.done")
    assert done.text == deltas
    final = events[-1].response
    assert final.output_text == whole.output_text
    assert final.usage.output_tokens == usage.output_tokens

    # the client's stream helper accumulates the same answer
    with oai.responses.stream(
        model=HERMES, input="Hello there", max_output_tokens=16, temperature=0
    ) as stream:
        for _ in stream:
            pass
        assert stream.get_final_response().output_text == whole.output_text


def test_instructions_and_message_items(oai: openai.OpenAI) -> None:
    def prompt_tokens(**kwargs: Any) -> int:
        answer = oai.responses.create(model=HERMES, max_output_tokens=1, temperature=0, **kwargs)
        assert answer.usage is not None
        return answer.usage.input_tokens

    def message(role: str, part: str, text: str) -> dict[str, Any]:
        return {"type": "message", "role": role, "content": [{"type": part, "text": text}]}

    bare = prompt_tokens(input="Hello there")
    instructed = prompt_tokens(input="Hello there", instructions="You answer in French.")
    assert instructed > bare + 5
    as_items = prompt_tokens(
        input=[
            {"role": "developer", "content": "You answer in French."},
            message("user", "input_text", "Hello there"),
        ]
    )
    assert as_items == instructed
    history = prompt_tokens(
        input=[
            {"role": "user", "content": "Hello there"},
            message("assistant", "output_text", "Bonjour!"),
            {"role": "user", "content": "How are you?"},
        ]
    )
    assert history > bare + 5


def _calls(response: Any) -> list[Any]:
    return [item for item in response.output if item.type == "function_call"]


def test_required_call_whole_and_streamed(oai: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {
        "model": HERMES,
        "input": ASK,
        "tools": FLAT_TOOLS,
        "tool_choice": "required",
        "max_output_tokens": 120,
    }
    whole = oai.responses.create(**kwargs, temperature=0)
    calls = _calls(whole)
    assert calls and whole.status == "completed"
    for call in calls:
        assert call.id.startswith("fc_") and call.call_id.startswith("call_")
        assert call.status == "completed"
        assert _valid(call.name, json.loads(call.arguments))

    events = _events(oai, **kwargs)
    _check_sequence(events)
    assert events[-1].type == "response.completed"
    arguments: dict[str, str] = {}
    for event in events:
        if event.type == "response.function_call_arguments.delta":
            arguments[event.item_id] = arguments.get(event.item_id, "") + event.delta
        if event.type == "response.function_call_arguments.done":
            assert event.arguments == arguments[event.item_id]
    added = [e.item for e in events if e.type == "response.output_item.added"]
    assert all(item.type == "function_call" and item.arguments == "" for item in added)
    streamed = [(item.name, json.loads(arguments[item.id])) for item in added]
    assert streamed == [(c.name, json.loads(c.arguments)) for c in calls]

    with oai.responses.stream(**kwargs, temperature=0) as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    assert [(c.name, json.loads(c.arguments)) for c in _calls(final)] == streamed


def test_named_call_and_limits(oai: openai.OpenAI) -> None:
    named = oai.responses.create(
        model=HERMES,
        input=ASK,
        tools=FLAT_TOOLS,  # type: ignore[arg-type]
        tool_choice={"type": "function", "name": "set_alarm"},
        parallel_tool_calls=False,
        max_output_tokens=120,
        temperature=0,
    )
    (call,) = _calls(named)
    assert call.name == "set_alarm" and _valid("set_alarm", json.loads(call.arguments))
    assert named.parallel_tool_calls is False
    allowed = oai.responses.create(
        model=HERMES,
        input=ASK,
        tools=FLAT_TOOLS,  # type: ignore[arg-type]
        tool_choice={
            "type": "allowed_tools",
            "mode": "required",
            "tools": [{"type": "function", "name": "get_time"}],
        },
        max_tool_calls=1,
        max_output_tokens=120,
        temperature=0,
    )
    assert [c.name for c in _calls(allowed)] == ["get_time"]


def test_multi_turn_with_function_call_output(oai: openai.OpenAI) -> None:
    first = oai.responses.create(
        model=HERMES,
        input=ASK,
        tools=FLAT_TOOLS,  # type: ignore[arg-type]
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=120,
        temperature=0,
    )
    (call,) = _calls(first)
    history: list[Any] = [
        {"role": "user", "content": ASK},
        {
            "type": "function_call",
            "call_id": call.call_id,
            "name": call.name,
            "arguments": call.arguments,
        },
    ]
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "12:00"}

    def run(items: list[Any]) -> Any:
        return oai.responses.create(
            model=HERMES,
            input=items,
            tools=FLAT_TOOLS,  # type: ignore[arg-type]
            max_output_tokens=3,
            temperature=0,
        )

    without = run(history)
    answer = run([*history, output])
    assert answer.status in ("completed", "incomplete")
    assert answer.usage.input_tokens > without.usage.input_tokens + 5  # the result was rendered
    # the SDK's own output items can go straight back as input
    again = run([{"role": "user", "content": ASK}, *first.output, output])
    assert again.usage.input_tokens == answer.usage.input_tokens


def test_reasoning_items(oai: openai.OpenAI) -> None:
    def run(**kwargs: Any) -> Any:
        return oai.responses.create(
            model=THINK, input="Hello there", max_output_tokens=12, temperature=0, **kwargs
        )

    off = run(reasoning={"effort": "none"})
    on = run(
        reasoning={"effort": "high", "summary": "auto"}, include=["reasoning.encrypted_content"]
    )
    assert off.usage.input_tokens > on.usage.input_tokens  # the template closed the block
    reasoning = on.output[0]
    assert reasoning.type == "reasoning" and reasoning.id.startswith("rs_")
    text = reasoning.content[0].text
    assert text and reasoning.content[0].type == "reasoning_text"
    assert [s.text for s in reasoning.summary] == [text]
    assert reasoning.encrypted_content == text
    assert on.usage.output_tokens_details.reasoning_tokens > 0
    assert all(item.type != "reasoning" for item in off.output)

    events = _events(
        oai,
        model=THINK,
        input="Hello there",
        max_output_tokens=12,
        reasoning={"effort": "high", "summary": "auto"},
    )
    _check_sequence(events)
    streamed = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert streamed == text
    summary = [e.text for e in events if e.type == "response.reasoning_summary_text.done"]
    assert summary == [text]
    assert events[-1].response.output[0].content[0].text == text

    # a reasoning item sent back (as Codex does) becomes the assistant turn's reasoning
    back = oai.responses.create(
        model=THINK,
        input=[
            {"role": "user", "content": "Hello there"},
            {"type": "reasoning", "id": reasoning.id, "summary": [], "encrypted_content": text},
            {"role": "assistant", "content": "Hi!"},
            {"role": "user", "content": "How are you?"},
        ],
        max_output_tokens=2,
        temperature=0,
    )
    assert back.status in ("completed", "incomplete")


BASE: dict[str, Any] = {"model": HERMES, "input": "Hello there", "max_output_tokens": 4}


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"previous_response_id": "resp_123"}, "previous_response_id"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"background": True}, "background"),
        ({"include": ["message.output_text.logprobs"]}, "include[0]"),
        ({"service_tier": "flex"}, "service_tier"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [{"type": "function", "name": "a b"}]}, "tools[0].name"),
        (
            {"tools": FLAT_TOOLS, "tool_choice": {"type": "function", "name": "nope"}},
            "tool_choice.name",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"reasoning": {"effort": "high"}}, "reasoning.effort"),
        ({"text": {"verbosity": "low"}}, "text.verbosity"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
        ({"input": []}, "input"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0]",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file"}]}]},
            "input[0].content[0].type",
        ),
        (
            {
                "input": [
                    {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{oops"}
                ]
            },
            "input[0].arguments",
        ),
        (
            {"tools": [{"type": "function", "name": "f", "strict": True}], "model": JSONTOOLS},
            "tools",
        ),
    ],
)
def test_bad_requests_name_the_field(
    http: httpx.Client, change: dict[str, Any], param: str
) -> None:
    response = http.post("/v1/responses", json={**BASE, **change})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error


def test_errors_with_the_client(oai: openai.OpenAI, http: httpx.Client) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        oai.responses.create(model="nosuch:model", input="hi")
    assert "localllm pull" in missing.value.message
    with pytest.raises(openai.BadRequestError) as image:
        oai.responses.create(
            model=HERMES,
            input=[
                {
                    "role": "user",
                    "content": [{"type": "input_image", "image_url": "x", "detail": "auto"}],
                }
            ],
        )
    assert "no vision support" in image.value.message
    with pytest.raises(openai.BadRequestError) as stateful:
        oai.responses.create(model=HERMES, input="hi", previous_response_id="resp_1")
    assert "stateless" in stateful.value.message
    # store and metadata are accepted; nothing is stored
    kept = oai.responses.create(
        model=HERMES, input="hi", store=True, metadata={"k": "v"}, max_output_tokens=2
    )
    assert kept.store is False and kept.metadata == {"k": "v"}
    assert http.get(f"/v1/responses/{kept.id}").status_code == 404


def test_prompt_too_long(http: httpx.Client) -> None:
    for stream in (False, True):
        body = {**BASE, "input": "hello " * 8000, "stream": stream}
        response = http.post("/v1/responses", json=body)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == "context_length_exceeded" and error["param"] == "input"
