"""The runner protocol's one encode/decode pair: round trips, ids, and malformed lines."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from localllm.daemon.runner import protocol

MESSAGES = [
    protocol.GenerateOp(
        id="g1",
        request=protocol.GenerationRequest(
            id="g1",
            messages=[{"role": "user", "content": "hi \ud800"}],
            options=protocol.SamplingOptions(
                temperature=0, stop=["\n"], json_schema={"type": "object"}
            ),
            tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
            template_kwargs={"enable_thinking": False},
        ),
    ),
    protocol.EmbedOp(
        id="e1", request=protocol.EmbeddingRequest(id="e1", inputs=["a", "b"], truncate=False)
    ),
    protocol.CancelOp(id="g1"),
    protocol.HealthOp(id="h1"),
    protocol.StatsOp(id="s1"),
    protocol.TokenizeOp(id="t1", text="<|im_start|>", add_special=True, parse_special=True),
    protocol.DetokenizeOp(id="d1", tokens=[1, 2, 3]),
    protocol.PromptReadyEvent(id="g1", prompt_tokens=12),
    protocol.PromptReadyEvent(
        id="g1",
        prompt_tokens=12,
        prompt_tail='<|im_start|>assistant\n"é" \ud800',  # a lone surrogate: escaped
        dropped_messages=2,
        dropped_tokens=30,
        template_ms=0.125,
        tokenize_ms=1e-05,
        read_at=123_456_789_012,
        ready_at=123_456_789_999,
    ),
    protocol.TokenEvent(id="g1", text="héllo"),
    protocol.DoneEvent(
        id="g1",
        result=protocol.GenerationResult(
            id="g1",
            text="x",
            done_reason="length",
            timings=protocol.Timings(ttft_ms=1.5, prompt_tokens=3),
        ),
    ),
    protocol.EmbeddingEvent(
        id="e1",
        result=protocol.EmbeddingResult(id="e1", embeddings=[[0.5]], prompt_tokens=1, total_ms=2),
    ),
    protocol.ErrorEvent(id="g1", message="no", code="context_overflow"),
    protocol.ErrorEvent(id=None, message="unreadable", code="bad_request"),
    protocol.HealthEvent(id="h1", health={"status": "ok"}),
    protocol.StatsEvent(
        id="s1",
        stats=protocol.Stats(
            slots=[protocol.SlotStats(id=0, state="decode", request_id="g1")],
            waiting=0,
            kv_cells_used=1,
            kv_cells_total=2,
            decode_tokens_per_s=1.0,
            prefill_tokens_per_s=2.0,
        ),
    ),
    protocol.TokensEvent(id="t1", tokens=[5]),
    protocol.TextEvent(id="d1", text="abc"),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips_with_its_id_at_the_top(message: object) -> None:
    line = protocol.encode(message)  # type: ignore[arg-type]
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    data = json.loads(line)
    assert "id" in data and data["id"] == message.id  # type: ignore[attr-defined]
    assert protocol.decode(line) == message


def test_the_acceptance_is_the_line_of_its_fields() -> None:
    # written by orjson (the line every generation's acceptance is), read as any other
    ready = protocol.PromptReadyEvent(
        id="g1", prompt_tokens=3, prompt_tail="tail\n", template_ms=0.5, ready_at=7
    )
    line = protocol.encode(ready)
    assert json.loads(line) == {"event": "prompt_ready", **dataclasses.asdict(ready)}
    assert line.startswith(b'{"event":"prompt_ready","id":"g1",')


def _generation(**fields: object) -> protocol.GenerateOp:
    request = protocol.GenerationRequest(id="g1", messages=[{"role": "user", "content": "hi"}])
    options = {k: v for k, v in fields.items() if k in _OPTIONS}
    request.options = protocol.SamplingOptions(**options)  # type: ignore[arg-type]
    for name, value in fields.items():
        if name not in _OPTIONS:
            setattr(request, name, value)
    return protocol.GenerateOp(id="g1", request=request)


_OPTIONS = {f.name for f in dataclasses.fields(protocol.SamplingOptions)}
INF, NAN = float("inf"), float("nan")


def test_a_plain_generation_is_the_line_of_its_fields() -> None:
    op = _generation(temperature=0.0, stop=["<|im_end|>"], adapters=[protocol.AdapterUse("d")])
    line = protocol.encode(op)
    assert line.startswith(b'{"op":"generate","id":"g1","request":{"id":"g1",')
    assert json.loads(line) == {"op": "generate", **dataclasses.asdict(op)}
    assert protocol.decode(line) == op


@pytest.mark.parametrize(
    "fields",
    [
        {"temperature": INF},
        {"mirostat_tau": NAN},
        {"logit_bias": {"5": -INF}},
        {"adapters": [protocol.AdapterUse("d", INF)]},
        {"json_schema": {"type": "number", "maximum": INF}},
        {"tools": [{"type": "function", "function": {"name": "f", "x": NAN}}]},
        {"template_kwargs": {"budget": INF}},
        {"messages": [{"role": "assistant", "tool_calls": [{"arguments": {"x": -INF}}]}]},
    ],
    ids=lambda fields: next(iter(fields)),
)
def test_numbers_that_are_not_finite_cross_the_wire_as_they_are(fields: dict[str, object]) -> None:
    line = protocol.encode(_generation(**fields))
    # the line keeps it (the standard library writes and reads NaN and Infinity; orjson would
    # have written null), and the runner reads the request back with it
    assert _not_finite(json.loads(line)) == 1
    assert _not_finite(dataclasses.asdict(protocol.decode(line))) == 1


def _not_finite(value: object) -> int:
    """How many floats in ``value`` (nested dicts and lists) are NaN or infinite."""
    if isinstance(value, float):
        return 0 if math.isfinite(value) else 1
    if isinstance(value, dict):
        return sum(_not_finite(v) for v in value.values())
    if isinstance(value, list):
        return sum(_not_finite(v) for v in value)
    return 0


def test_nested_dataclasses_are_rebuilt() -> None:
    op = protocol.decode(protocol.encode(MESSAGES[0]))
    assert isinstance(op, protocol.GenerateOp)
    assert isinstance(op.request, protocol.GenerationRequest)
    assert isinstance(op.request.options, protocol.SamplingOptions)
    assert op.request.options.stop == ["\n"]
    stats = protocol.decode(protocol.encode(MESSAGES[-3]))
    assert isinstance(stats, protocol.StatsEvent)
    assert isinstance(stats.stats.slots[0], protocol.SlotStats)


@pytest.mark.parametrize(
    ("line", "request_id", "reason"),
    [
        (b"not json\n", None, "not JSON"),
        (b"[1, 2]\n", None, "not an object"),
        (b'{"op": "explode", "id": "x1"}\n', "x1", "unknown op"),
        (b'{"op": "generate", "request": {"id": "g"}}\n', None, "without a string id"),
        (b'{"op": "generate", "id": "g2"}\n', "g2", "malformed op"),
        (b'{"op": "generate", "id": "g3", "request": "text"}\n', "g3", "malformed op"),
        (b'{"op": "tokenize", "id": "t2"}\n', "t2", "malformed op"),
        (b'{"event": "done", "id": "g4", "result": {"text": "x"}}\n', "g4", "malformed event"),
    ],
)
def test_malformed_lines_raise_with_the_id_when_readable(
    line: bytes, request_id: str | None, reason: str
) -> None:
    with pytest.raises(protocol.ProtocolError, match=reason) as caught:
        protocol.decode(line)
    assert caught.value.id == request_id


def test_unknown_fields_are_ignored_for_forward_compatibility() -> None:
    line = b'{"event": "token", "id": "g1", "text": "a", "logprob": -0.5}\n'
    assert protocol.decode(line) == protocol.TokenEvent(id="g1", text="a")
