"""Where the first token's time goes: the ``Server-Timing`` header on every API family's reply,
the breakdown in the final chunk, the phase histograms on ``/metrics``, against a real daemon
serving the starter (SmolLM2-135M). Behaviour only: which phases are there, that they are
numbers that add up, never how long they took."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_daemon_support import Daemon, running_daemon

from localllm.daemon.firsttoken import ENGINE_PHASES, PHASES, FirstToken, server_timing
from localllm.daemon.runner.protocol import Timings
from localllm.run_stats import format_timings

SMOL = "smollm2:135m"
_ITEM = re.compile(r"^([a-z_]+);dur=(\d+\.\d{3})$")

pytestmark = pytest.mark.slow


def parse_server_timing(value: str) -> dict[str, float]:
    """The phases of a ``Server-Timing`` value; fails on anything malformed."""
    phases: dict[str, float] = {}
    for item in value.split(", "):
        match = _ITEM.match(item)
        assert match, f"malformed Server-Timing item {item!r} in {value!r}"
        assert match.group(1) not in phases, f"{match.group(1)} twice in {value!r}"
        phases[match.group(1)] = float(match.group(2))
    return phases


def _check_phases(phases: dict[str, float], streamed: bool) -> None:
    before = ["parse", "plan", "queue", "load", "handover", "template", "tokenize"]
    engine = ["engine"] if streamed else list(ENGINE_PHASES)
    assert list(phases) == [*before, *engine, "out", "ttft"], phases
    assert all(ms >= 0 for ms in phases.values()), phases
    # the total is the phases' sum (each rounded to a microsecond)
    assert phases["ttft"] == pytest.approx(sum(phases.values()) - phases["ttft"], abs=0.02)
    assert phases["tokenize"] > 0 and phases["ttft"] > 0


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Daemon]:
    home = tmp_path_factory.mktemp("first-token") / "home"
    with running_daemon(home, num_parallel=1, num_threads=1) as d:
        d.create("tiny:fim", tiny_gguf)  # llama-server's /infill wants a model with FIM tokens
        yield d


@pytest.fixture(scope="module")
def http(daemon: Daemon) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=daemon.url, timeout=300) as client:
        yield client


_CHAT = [{"role": "user", "content": "Name a planet."}]

# (path, body without "stream", extra headers)
FAMILIES: list[tuple[str, dict[str, Any], dict[str, str]]] = [
    ("/api/chat", {"model": SMOL, "messages": _CHAT, "options": {"num_predict": 3}}, {}),
    ("/api/generate", {"model": SMOL, "prompt": "Hi", "options": {"num_predict": 3}}, {}),
    ("/v1/chat/completions", {"model": SMOL, "messages": _CHAT, "max_tokens": 3}, {}),
    ("/v1/completions", {"model": SMOL, "prompt": "1, 2, 3,", "max_tokens": 3}, {}),
    (
        "/v1/messages",
        {"model": SMOL, "messages": _CHAT, "max_tokens": 3},
        {"anthropic-version": "2023-06-01"},
    ),
    ("/v1/responses", {"model": SMOL, "input": "Name a planet.", "max_output_tokens": 16}, {}),
    (
        "/infill",
        {"model": "tiny:fim", "input_prefix": "def f(x):\n", "input_suffix": "\n", "n_predict": 3},
        {},
    ),
]


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "whole"])
@pytest.mark.parametrize(("path", "body", "headers"), FAMILIES, ids=[f[0] for f in FAMILIES])
def test_server_timing_on_every_family(
    http: httpx.Client, path: str, body: dict[str, Any], headers: dict[str, str], streamed: bool
) -> None:
    with http.stream("POST", path, json={**body, "stream": streamed}, headers=headers) as reply:
        assert reply.status_code == 200, reply.read()
        value = reply.headers.get("server-timing")
        reply.read()
    assert value, f"no Server-Timing on {path}"
    # a streamed reply's header left with the first token: the engine's split came later
    _check_phases(parse_server_timing(value), streamed)


def test_final_chunk_has_the_whole_breakdown(http: httpx.Client) -> None:
    body = {"model": SMOL, "messages": _CHAT, "options": {"num_predict": 3}, "stream": True}
    with http.stream("POST", "/api/chat", json=body) as reply:
        lines = [json.loads(line) for line in reply.iter_lines() if line]
        header = parse_server_timing(reply.headers["server-timing"])
    final = lines[-1]
    assert final["done"] is True
    breakdown = final["ttft_breakdown"]
    assert list(breakdown) == [*PHASES, "ttft"]
    assert all(isinstance(ns, int) and ns >= 0 for ns in breakdown.values())
    # the phases before the engine are the header's, in nanoseconds
    for phase in ("parse", "plan", "queue", "handover", "template", "tokenize"):
        assert breakdown[phase] == pytest.approx(header[phase] * 1e6, abs=1000)
    assert sum(breakdown[p] for p in ENGINE_PHASES) == pytest.approx(
        header["engine"] * 1e6, abs=max(0.02 * header["engine"] * 1e6, 5000)
    )

    oai = http.post(
        "/v1/chat/completions",
        json={
            "model": SMOL,
            "messages": _CHAT,
            "max_tokens": 3,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    events = [json.loads(x[6:]) for x in oai.text.split("\n\n") if x.startswith("data: {")]
    first_token = events[-1]["usage"]["timings"]["first_token_ms"]
    assert list(first_token) == [*PHASES, "ttft"]


def test_metrics_have_the_phase_histograms(http: httpx.Client) -> None:
    body = {"model": SMOL, "prompt": "Hi", "options": {"num_predict": 2}, "stream": False}
    assert http.post("/api/generate", json=body).status_code == 200
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(http.get("/metrics").text):
        if family.name == "localllm_first_token_phase_seconds":
            for sample in family.samples:
                if sample.name.endswith("_count") and sample.labels["model"] == SMOL:
                    counts[sample.labels["phase"]] = sample.value
    assert set(counts) == set(PHASES), counts
    assert all(count >= 1 for count in counts.values()), counts


def test_breakdown_from_stamps() -> None:
    clock = FirstToken(received=1_000_000)
    ms = 1_000_000
    clock.planning, clock.planned = 2 * ms, 3 * ms
    clock.acquired, clock.load_ms = 10 * ms, 5.0
    clock.sent, clock.accepted = 11 * ms, 15 * ms
    clock.template_ms, clock.tokenize_ms = 1.0, 2.0
    clock.first_chunk, clock.out_at = 35 * ms, 36 * ms
    early = clock.durations()
    assert early == {
        "parse": 1.0,
        "plan": 1.0,
        "queue": 2.0,
        "load": 5.0,
        "handover": 2.0,  # 1 ms before sending, 1 of the 4 ms round trip
        "template": 1.0,
        "tokenize": 2.0,
        "engine": 20.0,
        "out": 1.0,
        "ttft": 35.0,
    }
    # with the runner's stamps, its acceptance read late by the daemon is the engine's time
    stamped = FirstToken(received=1_000_000)
    for name in ("planning", "planned", "acquired", "load_ms", "sent", "accepted"):
        setattr(stamped, name, getattr(clock, name))
    stamped.template_ms, stamped.tokenize_ms = 1.0, 2.0
    stamped.runner_read, stamped.runner_ready = 12 * ms, 15 * ms
    stamped.accepted = 30 * ms
    stamped.first_chunk, stamped.out_at = 35 * ms, 36 * ms
    with_stamps = stamped.durations()
    assert with_stamps["handover"] == 1.0 + 1.0 + 0.0  # held → sent, the wire, the runner's rest
    assert with_stamps["engine"] == 20.0
    assert with_stamps["ttft"] == 35.0
    timings = Timings(ttft_ms=18.0, queued_ms=1.0, prompt_ms=15.0, sample_ms=1.5, detokenize_ms=0.5)
    full = clock.durations(timings)
    assert [full[p] for p in ENGINE_PHASES] == [1.0, 15.0, 1.5, 0.5, 2.0]
    assert full["ttft"] == pytest.approx(35.0)
    # the final timings' queued_ms counts the daemon's wait too: the engine waited what the
    # runner measured, and the rest of the engine's share is the way back
    clock.runner_wait_ms = 0.25
    split = clock.durations(timings)
    assert [split[p] for p in ENGINE_PHASES] == [0.25, 15.0, 1.5, 0.5, 2.75]
    assert split["ttft"] == pytest.approx(35.0)
    assert server_timing({"parse": 0.4, "ttft": 1.25}) == "parse;dur=0.400, ttft;dur=1.250"


def test_verbose_block_lists_the_phases() -> None:
    final = {
        "total_duration": 50_000_000,
        "ttft_duration": 30_000_000,
        "ttft_breakdown": {"parse": 400_000, "load": 0, "prefill": 20_000_000, "ttft": 20_400_000},
    }
    text = format_timings(final)
    line = next(x for x in text.splitlines() if x.startswith("first token phases:"))
    assert "parse 400µs" in line and "prefill 20.00ms" in line
    assert "load" not in line and "ttft" not in line  # nothing measured, and the total
    assert "first token phases" not in format_timings({"total_duration": 1})


def test_short_text_prompts_are_prepared_without_a_thread() -> None:
    from localllm.daemon.runner.protocol import GenerationRequest, SamplingOptions
    from localllm.daemon.runner.server import _light

    def ask(**fields: Any) -> GenerationRequest:
        return GenerationRequest(id="x", options=fields.pop("options", SamplingOptions()), **fields)

    assert _light(ask(messages=[{"role": "user", "content": "Hi"}]))
    assert _light(ask(prompt="1, 2, 3,"))
    # long text, images, a schema's grammar, parts instead of text: a thread of their own
    assert not _light(ask(messages=[{"role": "user", "content": "x" * 9000}]))
    assert not _light(ask(prompt="Hi", images=["aGk="]))
    assert not _light(ask(prompt="Hi", options=SamplingOptions(json_schema={"type": "object"})))
    assert not _light(ask(messages=[{"role": "user", "content": [{"type": "text"}]}]))


def test_a_templates_compile_does_not_send_its_later_prompts_to_a_thread() -> None:
    from localllm.daemon.runner.server import TemplateRenders

    renders = TemplateRenders(limit=2)
    assert not renders.quick("t")  # never rendered: prepared in a thread, where it compiles
    renders.record("t", 0.2)  # the first render's time, its compile left out
    assert renders.quick("t")
    renders.record("t", 5.0)  # once slow, a thread again, whatever follows
    renders.record("t", 0.1)
    assert not renders.quick("t")
    renders.record("u", 0.1)
    renders.record("v", 0.1)
    assert not renders.quick("t") and renders.quick("u") and renders.quick("v")  # bounded
