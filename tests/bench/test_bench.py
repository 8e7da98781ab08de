"""``localllm bench`` against real daemons on loopback with the tiny model: a short sweep makes a
table, a JSON document valid against its published schema, terminal charts and SVG/PNG/HTML
reports; ``--against`` a second daemon gives ratios; ``--compare`` request options and daemon
settings (a private daemon per value, KV bytes from each); a server that refuses is reported,
not a traceback. Behaviour only: no timing is asserted, no model text either."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from loopback import serving
from test_daemon_support import Daemon, running_daemon

from localllm.bench import (
    JSON_SCHEMA,
    BenchError,
    LocalllmDriver,
    Point,
    PromptMaker,
    Sample,
    Target,
    Workload,
    compare_plan,
    percentile,
    run_bench,
    summarize,
)
from localllm.bench.report import terminal_plot, write_report
from localllm.client import AsyncClient

MODEL = "tiny:bench"
# Short everything: 1 and 2 clients, a few tokens, two short prompts.
SHORT = [
    "--levels", "1,2", "--answer-tokens", "4", "--prompt-tokens", "16",
    "--prompt-lengths", "16,32",
]  # fmt: skip

pytestmark = pytest.mark.slow


def _daemon_with_tiny(home: Path, tiny_gguf: Path) -> Iterator[Daemon]:
    with running_daemon(home, num_parallel=2, num_threads=1, context_length=512) as daemon:
        with daemon.client() as client:
            for _ in client.create(MODEL, from_=str(tiny_gguf)):
                pass
        yield daemon


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Daemon]:
    """The daemon under test, with the tiny model."""
    yield from _daemon_with_tiny(tmp_path_factory.mktemp("bench") / "home", tiny_gguf)


@pytest.fixture(scope="module")
def peer(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Daemon]:
    """A second localllm daemon on another port: the server ``--against`` compares with."""
    yield from _daemon_with_tiny(tmp_path_factory.mktemp("bench-peer") / "home", tiny_gguf)


def bench(daemon: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    """``localllm bench MODEL ARGS`` as a user runs it, on ``daemon``'s home."""
    return subprocess.run(
        [sys.executable, "-m", "localllm", "bench", MODEL, *args],
        env={**daemon.env, "COLUMNS": "140"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


# -- the command ------------------------------------------------------------------------------


def test_short_sweep_prints_a_table_and_charts_and_writes_json_and_svg(
    daemon: Daemon, tmp_path: Path
) -> None:
    out, svg = tmp_path / "bench.json", tmp_path / "bench.svg"
    result = bench(daemon, *SHORT, "--json", str(out), "--report", str(svg))
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    text = result.stdout
    assert "Concurrency" in text and "Prompt length" in text and "Memory" in text
    lines = text.splitlines()
    # one row per level, each with all its requests answered
    assert any(line.split()[:3] == ["localllm", "1", "1/1"] for line in lines), text
    assert any(line.split()[:3] == ["localllm", "2", "2/2"] for line in lines), text
    for cache in ("cold", "warm"):
        assert any(line.split()[:3] == ["localllm", "16", cache] for line in lines), text
    # the charts, drawn in text
    assert "throughput vs latency" in text and "TTFT vs prompt length" in text
    assert "┤" in text and "•" in text

    document = json.loads(out.read_text())
    jsonschema.validate(document, JSON_SCHEMA)
    assert document["model"] == MODEL
    samples = document["samples"]
    # 1 + 2 concurrent requests, then each prompt length cold and cached
    assert len(samples) == 3 + 2 * 2
    assert all(s["ok"] and s["tokens"] >= 1 for s in samples)
    points = {
        (p["sweep"], p["clients"], p["prompt_tokens"], p["cache"]) for p in document["points"]
    }
    assert ("concurrency", 2, 16, "cold") in points and ("prompt", 1, 32, "warm") in points
    by_cache = {s["cache"]: s for s in samples if s["prompt_tokens_target"] == 32}
    # the cached run reuses the prompt it repeats
    assert by_cache["warm"]["cached_tokens"] > by_cache["cold"]["cached_tokens"]
    memory = document["targets"][0]["memory"]
    assert memory["kv_cells"] > 0 and memory["kv_bytes"] > 0
    assert svg.read_text().lstrip().startswith("<?xml") and "<svg" in svg.read_text()


def test_against_a_second_daemon_gives_ratios(daemon: Daemon, peer: Daemon, tmp_path: Path) -> None:
    out = tmp_path / "against.json"
    result = bench(
        daemon, "--levels", "1,2", "--answer-tokens", "4", "--prompt-tokens", "16",
        "--prompt-lengths", "none", "--against", peer.url, "--json", str(out), "--no-plot",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    document = json.loads(out.read_text())
    jsonschema.validate(document, JSON_SCHEMA)
    peer_label = peer.url.removeprefix("http://")
    assert [t["label"] for t in document["targets"]] == ["localllm", peer_label]
    assert document["targets"][1]["kind"] == "localllm"
    ratios = document["ratios"]
    assert {r["clients"] for r in ratios} == {1, 2}
    assert all(r["target"] == peer_label and r["aggregate_tps"] > 0 for r in ratios)
    # interleaved: each level ran on both before the next level began
    order = [(s["clients"], s["target"]) for s in document["samples"]]
    assert [c for c, _ in order] == sorted(c for c, _ in order)
    assert "vs ref" in result.stdout and peer_label in result.stdout
    assert "×" in result.stdout


class _Refuser(BaseHTTPRequestHandler):
    """Answers every request 503, as a server that is full or shutting down does."""

    def _refuse(self) -> None:
        body = b'{"error": {"message": "server is overloaded"}}'
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Retry-After", "1")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _refuse

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


@pytest.fixture
def refusing_url() -> Iterator[str]:
    """A loopback server that refuses every request."""
    with serving(_Refuser) as url:
        yield url


def test_a_refusing_server_is_reported_not_a_traceback(
    daemon: Daemon, refusing_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "refused.json"
    result = bench(
        daemon, "--levels", "1,2", "--answer-tokens", "4", "--prompt-tokens", "16",
        "--prompt-lengths", "none", "--against", refusing_url, "--json", str(out),
    )  # fmt: skip
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert "Error: 3 of 6 requests failed" in result.stderr
    label = refusing_url.removeprefix("http://")
    rows = [line.split() for line in result.stdout.splitlines()]
    assert [label, "1", "0/1"] in [row[:3] for row in rows]
    assert [label, "2", "0/2"] in [row[:3] for row in rows]
    assert "HTTP 503" in result.stdout and "server is overloaded" in result.stdout
    # the working server's levels are still measured, and everything is in the document
    assert ["localllm", "2", "2/2"] in [row[:3] for row in rows]
    document = json.loads(out.read_text())
    jsonschema.validate(document, JSON_SCHEMA)
    failed = [s for s in document["samples"] if not s["ok"]]
    assert len(failed) == 3 and all(s["status"] == 503 for s in failed)


def compare(daemon: Daemon, spec: str, out: Path) -> tuple[str, dict[str, Any]]:
    """``localllm bench --compare SPEC`` at one short level: its output and JSON document."""
    result = bench(
        daemon, "--levels", "1", "--answer-tokens", "4", "--prompt-tokens", "16",
        "--prompt-lengths", "none", "--compare", spec, "--json", str(out), "--no-plot",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout, dict(json.loads(out.read_text()))


def test_compare_a_request_option(daemon: Daemon, tmp_path: Path) -> None:
    _, document = compare(daemon, "num_draft=0,4", tmp_path / "options.json")
    assert [t["label"] for t in document["targets"]] == ["num_draft=0", "num_draft=4"]
    assert [t["options"] for t in document["targets"]] == [{"num_draft": 0}, {"num_draft": 4}]
    assert len(document["ratios"]) == 1


def test_compare_kv_cache_types_starts_a_daemon_each_and_shows_kv_bytes(
    daemon: Daemon, tmp_path: Path
) -> None:
    stdout, document = compare(daemon, "kv_cache_type=f16,q8_0", tmp_path / "kv.json")
    targets = {t["label"]: t for t in document["targets"]}
    f16, q8 = targets["kv_cache_type=f16"], targets["kv_cache_type=q8_0"]
    # each ran on its own daemon (not the one under test), which is gone now
    assert f16["url"] != q8["url"] and daemon.url not in (f16["url"], q8["url"])
    assert f16["memory"]["kv_cache_type"] == "f16" and q8["memory"]["kv_cache_type"] == "q8_0"
    assert not f16["memory"]["kv_cache_type_assumed"]
    assert q8["memory"]["kv_bytes"] < f16["memory"]["kv_bytes"]
    assert "Memory" in stdout and "q8_0" in stdout
    assert all(s["ok"] for s in document["samples"])


def test_bad_arguments_are_one_line_errors(daemon: Daemon) -> None:
    for args, message in (
        (["--levels", "1,x"], "--levels wants comma-separated whole numbers"),
        (["--compare", "kv_cache_type=f16"], "--compare wants KEY=VALUE1,VALUE2"),
        (["--compare", "colour=red,blue"], "cannot compare 'colour'"),
        (["--report", "out.pdf"], "--report wants a .svg, .png or .html file"),
    ):
        result = bench(daemon, *args)
        assert result.returncode == 1, (args, result.stderr)
        assert message in result.stderr and "Traceback" not in result.stderr


# -- the library --------------------------------------------------------------------------------


def test_api_run_plots_and_writes_png_and_html(daemon: Daemon, tmp_path: Path) -> None:
    seen: list[Point] = []

    async def measure() -> Any:
        client = AsyncClient(daemon.settings)
        try:
            target = Target(label="tiny", driver=LocalllmDriver(client), model=MODEL)
            workload = Workload(levels=[1, 2], answer_tokens=3, prompt_tokens=12,
                                prompt_lengths=[])  # fmt: skip
            return await run_bench([target], workload, on_point=seen.append)
        finally:
            await client.close()

    result = asyncio.run(measure())
    assert [p.clients for p in seen] == [1, 2]  # told as each level finished
    assert result.failed == 0
    plot = terminal_plot(result, width=80)
    assert "throughput vs latency" in plot and "\x1b[" not in plot  # no colour codes
    assert max(len(line) for line in plot.splitlines()) <= 80
    png = write_report(result, tmp_path / "report.png")
    assert png.read_bytes().startswith(b"\x89PNG")
    page = write_report(result, tmp_path / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page and "<table>" in page


def test_compare_plan_names_what_is_a_request_option_and_what_needs_a_daemon() -> None:
    assert compare_plan("num_ctx=512,1024") == ("num_ctx", "option", ["512", "1024"])
    assert compare_plan("num_draft=0,8") == ("num_draft", "option", ["0", "8"])
    assert compare_plan("kv_cache_type=f16,q8_0,q4_0")[1] == "setting"
    # A per-model load option (PARAMETER num_parallel), sent with each request.
    assert compare_plan("num_parallel=1,4")[1] == "option"
    assert compare_plan("speculation=auto,off")[:2] == ("speculative", "setting")
    for bad in ("kv_cache_type", "num_ctx=512", "home=/a,/b", "api_key=a,b"):
        with pytest.raises(BenchError):
            compare_plan(bad)


def test_summaries_count_failures_and_leave_unmeasured_figures_empty() -> None:
    good = Sample("t", "concurrency", 3, 16, ok=True, ttft_ms=10.0, tokens=5, stream_tps=50.0)
    other = Sample("t", "concurrency", 3, 16, ok=True, ttft_ms=30.0, tokens=5, stream_tps=40.0)
    bad = Sample("t", "concurrency", 3, 16, error="HTTP 503: full", status=503)
    point = summarize([good, other, bad], 0.5, Point("t", "concurrency", 3, 16, "cold"))
    assert (point.requests, point.failed, point.errors) == (3, 1, ["HTTP 503: full"])
    assert point.ttft_p50_ms == 20.0 and point.ttft_p95_ms == 30.0
    assert point.aggregate_tps == 20.0 and point.queue_ms_p50 is None
    empty = summarize([bad], 0.1, Point("t", "concurrency", 1, 16, "cold"))
    assert empty.failed == 1 and empty.ttft_p50_ms is None and empty.aggregate_tps is None
    assert percentile([], 0.5) is None and percentile([3, 1, 2], 0.95) == 3


def test_prompts_are_unique_and_about_the_length_asked() -> None:
    maker = PromptMaker(chars_per_token=2.0, nonce="abc")
    first, second = maker.make(100, "a"), maker.make(100, "b")
    assert first != second and first.startswith("[a abc] ") and first.endswith(", ")
    assert 150 <= len(first) <= 200
    assert len(maker.make(3000, "long")) > 5000
