"""Every reply of every OpenAI, Anthropic and Ollama route, streamed events included, validated
against the official OpenAPI documents (vendored in ``tests/api/openapi/``, see its README:
OpenAI's of 2026-08-21, Anthropic's of 2026-05-06 with what its spec of 2026-08-19 changes,
Open Responses' release 2026-04-24, Ollama's of 2026-07-20): a real daemon, tiny models with
a tool-calling and a reasoning template, real HTTP.

The weights are random: nothing here asserts what a model says, only that each reply (whole,
each stream chunk or event, each error) is a valid instance of the schema the document gives
for that route, and that the official clients read them.
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from openapi_specs import ANTHROPIC, OLLAMA, OPENAI, OPENRESPONSES, check, check_event
from test_api_anthropic import THINK_TEMPLATE
from test_api_tools import HERMES_TEMPLATE, TOOLS
from test_daemon_support import Daemon, running_daemon
from tiny_gguf import write_tiny_gguf

pytestmark = pytest.mark.slow

HERMES = "tiny:hermes"
THINK = "tiny:think"
HI = [{"role": "user", "content": "Hello there"}]
GREEDY = {"temperature": 0, "seed": 1}
ANTHROPIC_TOOLS = [
    {"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS
]
RESPONSES_TOOLS = [
    {"type": "function", "name": t["function"]["name"], "parameters": t["function"]["parameters"]}
    for t in TOOLS
]
ANTHROPIC_HEADERS = {"anthropic-version": "2023-06-01"}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    models = tmp_path_factory.mktemp("models")
    hermes = write_tiny_gguf(models / "hermes.gguf", chat_template=HERMES_TEMPLATE)
    think = write_tiny_gguf(models / "think.gguf", chat_template=THINK_TEMPLATE)
    with running_daemon(tmp_path_factory.mktemp("schemas") / "home", num_parallel=2) as d:
        d.create(HERMES, hermes)
        d.create(THINK, think)
        yield d


def sse(http: httpx.Client, path: str, body: dict[str, Any], **kwargs: Any) -> list[Any]:
    """The data of every server-sent event of a streamed answer (``[DONE]`` as a string)."""
    out: list[Any] = []
    with http.stream("POST", path, json={**body, "stream": True}, **kwargs) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: "):
                data = line[len("data: ") :]
                out.append(data if data == "[DONE]" else json.loads(data))
    return out


def post(http: httpx.Client, path: str, body: dict[str, Any], **kwargs: Any) -> Any:
    response = http.post(path, json=body, **kwargs)
    assert response.status_code == 200, response.text
    return response.json()


# --- OpenAI chat completions --------------------------------------------------------------

CHAT_CASES = {
    "plain": {"model": HERMES, "messages": HI, "max_tokens": 8, **GREEDY},
    "logprobs and n": {
        "model": HERMES,
        "messages": HI,
        "max_tokens": 6,
        "n": 2,
        "logprobs": True,
        "top_logprobs": 2,
        **GREEDY,
    },
    "required call": {
        "model": HERMES,
        "messages": HI,
        "max_tokens": 64,
        "tools": TOOLS,
        "tool_choice": "required",
        **GREEDY,
    },
    "reasoning": {"model": THINK, "messages": HI, "max_tokens": 12, **GREEDY},
    "json format": {
        "model": HERMES,
        "messages": HI,
        "max_tokens": 16,
        "response_format": {"type": "json_object"},
        **GREEDY,
    },
}


@pytest.mark.parametrize("case", sorted(CHAT_CASES))
def test_chat_completions_whole_and_streamed(http: httpx.Client, case: str) -> None:
    body = CHAT_CASES[case]
    whole = post(http, "/v1/chat/completions", body)
    check(OPENAI, "CreateChatCompletionResponse", whole)
    assert whole["choices"][0]["message"]["refusal"] is None
    chunks = sse(http, "/v1/chat/completions", {**body, "stream_options": {"include_usage": True}})
    assert chunks[-1] == "[DONE]"
    for chunk in chunks[:-1]:
        check(OPENAI, "CreateChatCompletionStreamResponse", chunk)
    assert chunks[-2]["choices"] == [] and chunks[-2]["usage"]["total_tokens"] > 0


def test_chat_completions_through_the_official_client(daemon: Daemon) -> None:
    client = openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="unused", max_retries=0)
    answer = client.chat.completions.create(**CHAT_CASES["required call"])  # type: ignore[call-overload]
    assert answer.choices[0].message.tool_calls
    assert answer.choices[0].finish_reason in ("tool_calls", "length")


# --- OpenAI completions, embeddings, models ----------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "Once upon", "max_tokens": 6},
        {"prompt": "Once upon", "max_tokens": 6, "logprobs": 2, "n": 2},
        {"prompt": "Once upon", "max_tokens": 4, "echo": True},
    ],
)
def test_completions_whole_and_streamed(http: httpx.Client, body: dict[str, Any]) -> None:
    body = {"model": HERMES, **GREEDY, **body}
    check(OPENAI, "CreateCompletionResponse", post(http, "/v1/completions", body))
    chunks = sse(http, "/v1/completions", body)
    assert chunks[-1] == "[DONE]"
    for chunk in chunks[:-1]:
        # The streamed and the whole object share one schema (the document says so), whose
        # finish_reason is a string; the document's own streaming example (x-oaiMeta of
        # POST /completions) and OpenAI's API send null until the last chunk, as here.
        if all(choice["finish_reason"] is None for choice in chunk["choices"]):
            shown = [{**choice, "finish_reason": "stop"} for choice in chunk["choices"]]
            chunk = {**chunk, "choices": shown}
        check(OPENAI, "CreateCompletionResponse", chunk)
    assert chunks[-2]["choices"][-1]["finish_reason"] in ("stop", "length")


def test_embeddings_and_models(http: httpx.Client) -> None:
    body = {"model": HERMES, "input": ["a", "b"]}
    floats = post(http, "/v1/embeddings", body)
    check(OPENAI, "CreateEmbeddingResponse", floats)
    # The document types embedding as numbers only; with encoding_format base64 (what the
    # official SDK asks for) OpenAI sends the little-endian float32 bytes in base64, as here.
    packed = post(http, "/v1/embeddings", {**body, "encoding_format": "base64"})
    for item, plain in zip(packed["data"], floats["data"], strict=True):
        raw = base64.b64decode(item["embedding"])
        values = struct.unpack(f"<{len(raw) // 4}f", raw)
        assert values == pytest.approx(plain["embedding"], abs=1e-6)
        check(OPENAI, "Embedding", {**item, "embedding": list(values)})
    listed = http.get("/v1/models").json()
    check(OPENAI, "ListModelsResponse", listed)
    assert {m["id"] for m in listed["data"]} >= {HERMES, THINK}
    check(OPENAI, "Model", http.get(f"/v1/models/{HERMES}").json())


def test_openai_errors(http: httpx.Client) -> None:
    for path, body, status in (
        ("/v1/chat/completions", {"model": "nope:1", "messages": HI}, 404),
        ("/v1/chat/completions", {"model": HERMES, "messages": []}, 400),
        ("/v1/completions", {"model": HERMES, "prompt": "x", "max_tokens": -3}, 400),
        ("/v1/embeddings", {"model": HERMES, "input": ""}, 400),
        ("/v1/responses", {"model": HERMES, "input": "x", "previous_response_id": "r"}, 400),
    ):
        response = http.post(path, json=body)
        assert response.status_code == status, response.text
        check(OPENAI, "ErrorResponse", response.json())
    missing = http.get("/v1/models/nope:1")
    assert missing.status_code == 404
    check(OPENAI, "ErrorResponse", missing.json())


# --- OpenAI Responses ---------------------------------------------------------------------

RESPONSES_CASES = {
    "plain": {"model": HERMES, "input": "Hello", "max_output_tokens": 8, "temperature": 0},
    "required call": {
        "model": HERMES,
        "input": "Hello",
        "max_output_tokens": 64,
        "tools": RESPONSES_TOOLS,
        "tool_choice": "required",
        "temperature": 0,
    },
    "reasoning": {
        "model": THINK,
        "input": "Hello",
        "max_output_tokens": 12,
        "reasoning": {"effort": "low", "summary": "auto"},
        "temperature": 0,
    },
}


# Where OpenAI's document and Open Responses' name one event differently, the daemon sends
# OpenAI's name, which Codex reads (codex-rs/codex-api/src/sse/responses.rs): the raw reasoning
# text streams as response.reasoning_text.*, which Open Responses calls response.reasoning.*
# with the same fields. Checked against Open Responses under its name there.
OPEN_RESPONSES_NAMES = {
    "response.reasoning_text.delta": "response.reasoning.delta",
    "response.reasoning_text.done": "response.reasoning.done",
}


def _openai_response(response: dict[str, Any]) -> dict[str, Any]:
    """A response object as OpenAI's document can check it: ``usage`` is null until the
    answer is done (OpenAI's own ``response.created`` example in the document sends null,
    and Open Responses requires the field), while the document's schema types it as an
    object only."""
    return {k: v for k, v in response.items() if not (k == "usage" and v is None)}


def _check_responses_event(event: dict[str, Any]) -> None:
    openai_event = event
    if isinstance(event.get("response"), dict):
        openai_event = {**event, "response": _openai_response(event["response"])}
    check_event(OPENAI, "ResponseStreamEvent", openai_event)
    renamed = OPEN_RESPONSES_NAMES.get(event["type"])
    check_event(OPENRESPONSES, "POST /responses", {**event, "type": renamed or event["type"]})


@pytest.mark.parametrize("case", sorted(RESPONSES_CASES))
def test_responses_whole_and_streamed(http: httpx.Client, case: str) -> None:
    body = RESPONSES_CASES[case]
    whole = post(http, "/v1/responses", body)
    check(OPENAI, "Response", whole)
    check(OPENRESPONSES, "ResponseResource", whole)
    # the fields Open Responses requires, present even when null
    assert {"service_tier", "safety_identifier", "prompt_cache_key", "completed_at"} <= set(whole)
    events = sse(http, "/v1/responses", body)
    assert events[-1]["type"] in ("response.completed", "response.incomplete")
    assert events[0]["response"]["usage"] is None
    for event in events:
        _check_responses_event(event)


# --- Anthropic ---------------------------------------------------------------------------

MESSAGES_CASES = {
    "plain": {"model": HERMES, "max_tokens": 8, "messages": HI, "temperature": 0},
    "stop sequence": {
        "model": HERMES,
        "max_tokens": 8,
        "messages": HI,
        "temperature": 0,
        "stop_sequences": ["a", "e", "o"],
    },
    "forced tool": {
        "model": HERMES,
        "max_tokens": 64,
        "messages": HI,
        "temperature": 0,
        "tools": ANTHROPIC_TOOLS,
        "tool_choice": {"type": "any"},
    },
    "thinking": {
        "model": THINK,
        "max_tokens": 1500,
        "messages": HI,
        "temperature": 0,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
    },
}


@pytest.mark.parametrize("case", sorted(MESSAGES_CASES))
def test_messages_whole_and_streamed(http: httpx.Client, case: str) -> None:
    body = MESSAGES_CASES[case]
    whole = post(http, "/v1/messages", body, headers=ANTHROPIC_HEADERS)
    check(ANTHROPIC, "Message", whole)
    events = sse(http, "/v1/messages", body, headers=ANTHROPIC_HEADERS)
    assert [e["type"] for e in events[:1]] == ["message_start"]
    assert events[-1]["type"] == "message_stop"
    for event in events:
        check_event(ANTHROPIC, "MessageStreamEvent", event)


def test_count_tokens_and_models(http: httpx.Client, daemon: Daemon) -> None:
    counted = post(
        http,
        "/v1/messages/count_tokens",
        {"model": HERMES, "messages": HI},
        headers=ANTHROPIC_HEADERS,
    )
    check(ANTHROPIC, "CountMessageTokensResponse", counted)
    listed = http.get("/v1/models", headers=ANTHROPIC_HEADERS).json()
    check(ANTHROPIC, "ListResponse_ModelInfo_", listed)
    assert {m["id"] for m in listed["data"]} >= {HERMES, THINK}
    one = http.get(f"/v1/models/{HERMES}", headers=ANTHROPIC_HEADERS).json()
    check(ANTHROPIC, "ModelInfo", one)
    # the official client lists and retrieves them (it sends anthropic-version)
    client = anthropic.Anthropic(base_url=daemon.url, api_key="unused", max_retries=0)
    assert HERMES in [model.id for model in client.models.list()]
    assert client.models.retrieve(HERMES).id == HERMES
    missing = http.get("/v1/models/nope:1", headers=ANTHROPIC_HEADERS)
    assert missing.status_code == 404
    check(ANTHROPIC, "ErrorResponse", missing.json())


def test_anthropic_errors(http: httpx.Client) -> None:
    for body, status in (
        ({"model": "nope:1", "max_tokens": 8, "messages": HI}, 404),
        ({"model": HERMES, "messages": HI}, 400),
        ({"model": HERMES, "max_tokens": 8, "messages": HI, "bogus": 1}, 400),
    ):
        response = http.post("/v1/messages", json=body, headers=ANTHROPIC_HEADERS)
        assert response.status_code == status, response.text
        check(ANTHROPIC, "ErrorResponse", response.json())


# --- Ollama --------------------------------------------------------------------------------


def ndjson(http: httpx.Client, path: str, body: dict[str, Any]) -> list[Any]:
    """Every line of a streamed Ollama answer."""
    with http.stream("POST", path, json={**body, "stream": True}) as response:
        assert response.status_code == 200, response.read()
        return [json.loads(line) for line in response.iter_lines() if line]


OLLAMA_CASES = {
    "chat": ("/api/chat", {"model": HERMES, "messages": HI}, "ChatResponse", "ChatStreamEvent"),
    "chat, a call": (
        "/api/chat",
        {"model": HERMES, "messages": HI, "tools": TOOLS, "format": "json"},
        "ChatResponse",
        "ChatStreamEvent",
    ),
    "chat, thinking": (
        "/api/chat",
        {"model": THINK, "messages": HI, "think": True},
        "ChatResponse",
        "ChatStreamEvent",
    ),
    "generate": (
        "/api/generate",
        {"model": HERMES, "prompt": "Once upon", "logprobs": True, "top_logprobs": 2},
        "GenerateResponse",
        "GenerateStreamEvent",
    ),
}


@pytest.mark.parametrize("case", sorted(OLLAMA_CASES))
def test_ollama_whole_and_streamed(http: httpx.Client, case: str) -> None:
    path, body, whole_schema, event_schema = OLLAMA_CASES[case]
    body = {**body, "options": {"num_predict": 8, "temperature": 0, "seed": 1}}
    whole = post(http, path, {**body, "stream": False})
    check(OLLAMA, whole_schema, whole)
    lines = ndjson(http, path, body)
    assert lines[-1]["done"] is True
    for line in lines:
        check(OLLAMA, event_schema, line)
    # Ollama's document requires no field of an answer; these Ollama always sends
    final = {"model", "created_at", "done", "done_reason", "eval_count", "total_duration"}
    assert final <= set(whole) and final <= set(lines[-1])
    assert all({"model", "created_at", "done"} <= set(line) for line in lines)


def test_ollama_models_and_errors(http: httpx.Client) -> None:
    check(OLLAMA, "ListResponse", http.get("/api/tags").json())
    check(OLLAMA, "ShowResponse", post(http, "/api/show", {"model": HERMES}))
    check(OLLAMA, "PsResponse", http.get("/api/ps").json())
    check(OLLAMA, "VersionResponse", http.get("/api/version").json())
    check(OLLAMA, "EmbedResponse", post(http, "/api/embed", {"model": HERMES, "input": ["a"]}))
    missing = http.post("/api/chat", json={"model": "nope:1", "messages": HI})
    assert missing.status_code == 404
    check(OLLAMA, "ErrorResponse", missing.json())
