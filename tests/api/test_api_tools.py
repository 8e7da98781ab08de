"""Tool calling end to end: a real daemon, tiny models whose chat templates take tools, and the
official ``openai`` and ``ollama`` clients.

The tiny model's weights are random, so a call is made certain by constraining its output:
``tool_choice: "required"`` (the daemon's grammar in the template's call syntax) on the OpenAI
side, a JSON-schema ``format`` on the Ollama side (which has no tool_choice). The tools take
only enum and boolean arguments so a constrained answer is short and always ends. Nothing
asserts what the model "chose": only that calls are well formed, valid for the schemas, and
the same streamed or not (greedy decoding, same run).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import openai
import pytest
from test_daemon_support import Daemon, running_daemon
from tiny_gguf import HERMES_TEMPLATE, write_tiny_gguf

SMOL = "smollm2:135m"
HERMES = "tiny:hermes"
JSONTOOLS = "tiny:jsontools"

pytestmark = pytest.mark.slow

# Takes tools but shows no call syntax: the generic JSON family.
GENERIC_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nFunctions: {{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

ZONE = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a zone",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
            "required": ["zone"],
        },
    },
}
ALARM = {
    "type": "function",
    "function": {
        "name": "set_alarm",
        "parameters": {
            "type": "object",
            "properties": {"loud": {"type": "boolean"}},
            "required": ["loud"],
        },
    },
}
TOOLS = [ZONE, ALARM]
ASK = [{"role": "user", "content": "What time is it in Paris?"}]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Daemon]:
    home = tmp_path_factory.mktemp("tools") / "home"
    hermes = write_tiny_gguf(
        tmp_path_factory.mktemp("models") / "hermes.gguf", chat_template=HERMES_TEMPLATE
    )
    with running_daemon(home, num_parallel=2, num_threads=1) as d:
        d.create(HERMES, hermes)
        # a Modelfile TEMPLATE that renders tools gives the plain tiny model the capability
        d.create(JSONTOOLS, tiny_gguf, template=GENERIC_TEMPLATE)
        yield d


def _valid(name: str, arguments: dict[str, Any]) -> bool:
    if name == "get_time":
        return set(arguments) == {"zone"} and arguments["zone"] in ("UTC", "CET")
    if name == "set_alarm":
        return set(arguments) == {"loud"} and isinstance(arguments["loud"], bool)
    return False


def test_capabilities(oll: ollama.Client) -> None:
    assert "tools" in (oll.show(HERMES).capabilities or [])
    assert "tools" in (oll.show(JSONTOOLS).capabilities or [])
    assert "tools" not in (oll.show(SMOL).capabilities or [])


def test_model_without_tool_support(oai: openai.OpenAI, oll: ollama.Client) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(model=SMOL, messages=ASK, tools=TOOLS, max_tokens=2)
    assert f"{SMOL} does not support tools" in info.value.message
    assert isinstance(info.value.body, dict) and info.value.body.get("param") == "tools"
    with pytest.raises(ollama.ResponseError) as refused:
        oll.chat(model=SMOL, messages=ASK, tools=TOOLS)
    assert refused.value.status_code == 400 and "does not support tools" in refused.value.error
    # tool_choice "none" drops the tools: the model answers as it would without them
    answer = oai.chat.completions.create(
        model=SMOL, messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=2, temperature=0
    )
    assert answer.choices[0].message.tool_calls is None


def _non_streamed(oai: openai.OpenAI, **kwargs: Any) -> Any:
    return oai.chat.completions.create(
        model=HERMES, messages=ASK, tools=TOOLS, temperature=0, max_tokens=120, **kwargs
    )


def _streamed_calls(oai: openai.OpenAI, **kwargs: Any) -> tuple[list[dict[str, Any]], str]:
    kwargs.setdefault("max_tokens", 120)
    """Calls reassembled from a stream as clients do (joined by index), and the finish."""
    stream = oai.chat.completions.create(
        model=HERMES, messages=ASK, tools=TOOLS, temperature=0, stream=True, **kwargs
    )
    calls: dict[int, dict[str, Any]] = {}
    finish = ""
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        for part in choice.delta.tool_calls or []:
            call = calls.setdefault(part.index, {"id": "", "name": "", "arguments": ""})
            call["id"] += part.id or ""
            if part.function is not None:
                call["name"] += part.function.name or ""
                call["arguments"] += part.function.arguments or ""
        finish = choice.finish_reason or finish
    return [calls[i] for i in sorted(calls)], finish


def test_openai_required_call_streamed_and_not(oai: openai.OpenAI) -> None:
    whole = _non_streamed(oai, tool_choice="required")
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert _valid(call.function.name, json.loads(call.function.arguments))
    streamed, finish = _streamed_calls(oai, tool_choice="required")
    assert finish == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for c in streamed] == [
        (c.function.name, json.loads(c.function.arguments)) for c in calls
    ]
    assert all(c["id"].startswith("call_") for c in streamed)


def test_openai_named_function_and_no_parallel_calls(oai: openai.OpenAI) -> None:
    named = _non_streamed(
        oai,
        tool_choice={"type": "function", "function": {"name": "set_alarm"}},
        parallel_tool_calls=False,
    )
    calls = named.choices[0].message.tool_calls
    assert calls is not None and len(calls) == 1
    assert calls[0].function.name == "set_alarm"
    assert _valid("set_alarm", json.loads(calls[0].function.arguments))
    allowed = _non_streamed(
        oai,
        tool_choice={
            "type": "allowed_tools",
            "allowed_tools": {"mode": "required", "tools": [ZONE]},
        },
    )
    assert {c.function.name for c in allowed.choices[0].message.tool_calls or []} == {"get_time"}


def test_openai_multi_turn_with_tool_results(oai: openai.OpenAI) -> None:
    first = _non_streamed(oai, tool_choice="required", parallel_tool_calls=False)
    message = first.choices[0].message
    (call,) = message.tool_calls or []
    history: list[Any] = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": call.function.arguments},
                }
            ],
        },
    ]
    result = {"role": "tool", "tool_call_id": call.id, "content": "12:00"}
    without = oai.chat.completions.create(
        model=HERMES, messages=history, tools=TOOLS, max_tokens=3, temperature=0
    )
    answer = oai.chat.completions.create(
        model=HERMES, messages=[*history, result], tools=TOOLS, max_tokens=3, temperature=0
    )
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # the template rendered the result: the prompt grew by its turn
    assert answer.usage is not None and without.usage is not None
    assert answer.usage.prompt_tokens > without.usage.prompt_tokens + 5


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
        ({"tools": [ZONE, ZONE]}, "tools[1].function.name"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]},
            "tools[0].function.parameters",
        ),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        (
            {"tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice.function.name",
        ),
        ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
        (
            {
                "messages": [
                    *ASK,
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "id": "x",
                                "type": "function",
                                "function": {"name": "get_time", "arguments": "{oops"},
                            }
                        ],
                    },
                ]
            },
            "messages[1].tool_calls[0].function.arguments",
        ),
    ],
)
def test_openai_bad_tool_requests_name_the_field(
    http: httpx.Client, change: dict[str, Any], param: str
) -> None:
    body = {"model": HERMES, "messages": ASK, "tools": TOOLS, "max_tokens": 2, **change}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


# --- Ollama ------------------------------------------------------------------------------------


def get_time(zone: str) -> str:
    """The time in a time zone.

    Args:
      zone: The zone's name, UTC or CET
    """
    return "12:00"


# Ollama has no tool_choice: a JSON-schema format makes the tiny model write a call object,
# which the generic family's parser reads back as a call.
CALL_FORMAT = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "enum": ["get_time"]},
        "arguments": {
            "type": "object",
            "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
            "required": ["zone"],
        },
    },
    "required": ["name", "arguments"],
}


def test_ollama_python_function_tool_streamed_and_not(oll: ollama.Client) -> None:
    options = {"temperature": 0, "num_predict": 80}
    whole = oll.chat(
        model=JSONTOOLS, messages=ASK, tools=[get_time], format=CALL_FORMAT, options=options
    )
    calls = whole.message.tool_calls or []
    assert len(calls) == 1
    assert calls[0].function.name == "get_time"
    assert _valid("get_time", dict(calls[0].function.arguments))
    assert not whole.message.content
    streamed = []
    contents = []
    for chunk in oll.chat(
        model=JSONTOOLS,
        messages=ASK,
        tools=[get_time],
        format=CALL_FORMAT,
        options=options,
        stream=True,
    ):
        streamed += chunk.message.tool_calls or []
        contents.append(chunk.message.content or "")
    assert [(c.function.name, dict(c.function.arguments)) for c in streamed] == [
        (c.function.name, dict(c.function.arguments)) for c in calls
    ]
    assert "".join(contents) == ""  # the call's JSON never streamed as text


def test_ollama_raw_shape_and_history(http: httpx.Client) -> None:
    body = {
        "model": JSONTOOLS,
        "messages": ASK,
        "tools": TOOLS,
        "format": CALL_FORMAT,
        "options": {"temperature": 0, "num_predict": 80},
        "stream": False,
    }
    reply = http.post("/api/chat", json=body).json()
    (call,) = reply["message"]["tool_calls"]
    assert call["id"].startswith("call_") and len(call["id"]) == 13
    assert call["function"]["index"] == 0
    assert isinstance(call["function"]["arguments"], dict)
    history = [
        *ASK,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_name": "get_time", "content": "12:00"},
    ]
    follow = http.post(
        "/api/chat",
        json={**body, "messages": history, "format": None, "options": {"num_predict": 2}},
    )
    assert follow.status_code == 200, follow.text
    assert follow.json()["done"] is True


MARKUP = ("<tool_call", "</tool_call", '{"name"', "<tool")


def test_a_forced_call_cut_by_max_tokens_is_the_limit_never_text(
    oai: openai.OpenAI, http: httpx.Client
) -> None:
    """Wherever max_tokens cuts a forced call (a first one, or a parallel second one), the
    answer says the limit (finish_reason length, stop_reason max_tokens), holds only whole
    calls valid for their schemas, and no call markup shows as content or text."""
    one = _non_streamed(oai, tool_choice="required", parallel_tool_calls=False)
    assert one.choices[0].finish_reason == "tool_calls"
    # the whole call's tokens (completion_tokens counts the end-of-generation token too)
    needed = one.usage.completion_tokens - 1
    assert needed > 3
    for limit in sorted({1, 2, needed // 2, needed - 1, needed, needed * 2}):
        whole = oai.chat.completions.create(
            model=HERMES,
            messages=ASK,
            tools=TOOLS,
            tool_choice="required",
            temperature=0,
            max_tokens=limit,
        )
        choice = whole.choices[0]
        content = choice.message.content or ""
        assert not any(marker in content for marker in MARKUP), (limit, content)
        calls = choice.message.tool_calls or []
        for call in calls:
            assert _valid(call.function.name, json.loads(call.function.arguments))
        if limit <= needed // 2:  # cut inside the call's JSON
            assert choice.finish_reason == "length" and not calls, limit
        elif limit < needed:  # maybe only its closing tag was cut: the call is whole
            assert (choice.finish_reason, bool(calls)) in (("length", False), ("tool_calls", True))
        else:
            assert calls and choice.finish_reason in ("tool_calls", "length"), limit
        streamed, finish = _streamed_calls(oai, tool_choice="required", max_tokens=limit)
        assert finish == choice.finish_reason
        assert [c["name"] for c in streamed] == [c.function.name for c in calls]
        # Anthropic's shape of the same answer
        body = {
            "model": HERMES,
            "max_tokens": limit,
            "messages": ASK,
            "temperature": 0,
            "tools": [
                {"name": t["function"]["name"], "input_schema": t["function"]["parameters"]}
                for t in TOOLS
            ],
            "tool_choice": {"type": "any"},
        }
        message = http.post("/v1/messages", json=body).json()
        kinds = [block["type"] for block in message["content"]]
        texts = "".join(block.get("text", "") for block in message["content"])
        assert not any(marker in texts for marker in MARKUP), (limit, message)
        assert kinds.count("tool_use") == len(calls), (limit, message)
        expected = "max_tokens" if choice.finish_reason == "length" else "tool_use"
        assert message["stop_reason"] == expected, (limit, message)
