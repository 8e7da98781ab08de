"""Load generation and measurement for ``localllm bench``: the throughput-vs-latency curve of
this machine, measured through the public HTTP API the way users meet it.

The pieces, from the bottom up:

* a :class:`Driver` sends one streamed completion and reports what came back, for three
  server kinds: ``localllm`` (:class:`LocalllmDriver`, through
  :class:`~localllm.client.AsyncClient`), ``ollama`` (:class:`OllamaDriver`,
  ``/api/generate`` over httpx) and ``openai`` (:class:`OpenAIDriver`, ``/v1/completions``
  with SSE: llama-server, vLLM, LM Studio...);
* :func:`run_level` starts N such requests at once and returns one :class:`Sample` per request
  plus the level's wall time (``benchmarks/serve.py`` drives its servers with it too);
* :class:`Bench` runs a :class:`Workload` (a concurrency sweep, then a prompt-length sweep cold
  and cached) against one or more :class:`Target` s, interleaved level by level so that machine
  noise hits every target alike, and summarizes each level as a :class:`Point`;
* :class:`SpawnedDaemon` starts a private daemon for one ``--compare`` setting that only a daemon
  restart can change (``kv_cache_type``, ``num_parallel``, ``flash_attention``...), sharing the
  user's model files through a temporary home (hard links, else symbolic links).

The workload is a greedy raw completion of a counting prompt ("1, 2, 3, ...") with a unique tag
in front of every request, so answers rarely stop early and no request reuses another's prefix
unless the prompt sweep's cached run asks for exactly that. Prompt lengths are hit by measuring
the server's characters per token once (a one-token request) and cutting the text to length;
the samples keep the token counts the server reported.

The JSON document (:meth:`BenchResult.to_json`, ``--json FILE``) has the shape that
:data:`JSON_SCHEMA` describes (JSON Schema, draft 2020-12)::

    {"schema": "localllm-bench/1", "created_at": ISO time, "localllm_version": str,
     "host": {"platform", "python", "cpus"}, "model": str,
     "workload": {"levels", "prompt_tokens", "answer_tokens", "prompt_lengths",
                  "prefill_answer_tokens", "rounds", "options"},
     "targets": [{"label", "kind", "url", "model", "options", "setting", "error",
                  "memory": {"kv_cache_type", "kv_cache_type_assumed", "kv_cells",
                             "kv_bytes", "size", "runner_rss"} | null}],
     "points":  [{"target", "sweep", "clients", "prompt_tokens", "cache", "requests", "failed",
                  "errors", "ttft_p50_ms", "ttft_p95_ms", "stream_tps_p50", "aggregate_tps",
                  "queue_ms_p50", "prefill_tps_p50", "cached_tokens_mean",
                  "prompt_tokens_mean", "wall_s"}],
     "ratios":  [{"target", "reference", "sweep", "clients", "prompt_tokens", "cache",
                  "aggregate_tps", "stream_tps_p50", "ttft_p50_ms", "prefill_tps_p50"}],
     "samples": [{"target", "sweep", "clients", "prompt_tokens_target", "cache", "round",
                  "client", "start_s", "ok", "error", "status", "ttft_ms", "duration_s",
                  "tokens", "chunks", "stream_tps", "prompt_tokens", "cached_tokens",
                  "server_ttft_ms", "queue_ms", "load_ms", "prefill_tps",
                  "server_decode_tps", "draft_tokens", "draft_accepted"}]}

Times are milliseconds (``_ms``) or seconds (``_s``); rates are tokens per second. A ratio is
the target's figure divided by the reference's (the first target) at the same level. A figure
that could not be measured (every request of a level failed, a server that does not report
it) is ``null``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import os
import platform
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from ._exceptions import APIError, DaemonError, LocalLLMError
from .client import AsyncClient
from .client._async_transport import async_transport
from .models import LOAD_OPTIONS
from .settings import Settings

__all__ = [
    "DEFAULT_LEVELS",
    "DEFAULT_PROMPT_LENGTHS",
    "JSON_SCHEMA",
    "SCHEMA_ID",
    "Bench",
    "BenchError",
    "BenchResult",
    "Driver",
    "LocalllmDriver",
    "OllamaDriver",
    "OpenAIDriver",
    "Point",
    "PromptMaker",
    "Sample",
    "SpawnedDaemon",
    "Target",
    "Workload",
    "compare_plan",
    "compare_targets",
    "detect_driver",
    "marker",
    "percentile",
    "point_rows",
    "run_bench",
    "run_level",
    "summarize",
]

SCHEMA_ID = "localllm-bench/1"
"""The ``schema`` field of the JSON document; bumped when its shape changes incompatibly."""
DEFAULT_LEVELS = (1, 2, 4, 8, 16)
"""Concurrent clients of the default sweep (capped at twice the model's slots)."""
DEFAULT_PROMPT_LENGTHS = (128, 512, 1024, 2048, 4096)
"""Prompt tokens of the default prompt-length sweep (capped by the context of a slot)."""

# Settings that only a daemon restart changes and that --compare may not touch.
_NOT_COMPARABLE = frozenset({"home", "host", "api_key", "origins", "registry", "hf_endpoint"})
_MARKERS = ("•", "x", "+", "o", "*", "#", "@", "%")
_ERRORS_KEPT = 3
# Short enough for any context (at most about 150 tokens), long enough for a stable ratio.
_CALIBRATION_CHARS = 120
_SPAWN_TIMEOUT = 120.0


class BenchError(LocalLLMError):
    """A benchmark that cannot run as asked (a bad option, an unknown compare key...)."""


# -- measurements ------------------------------------------------------------------------------


@dataclass
class Sample:
    """What one request saw: client-side times and the server's own timings when it sends
    them. Times in ms or s as the field names say; rates in tokens/s."""

    target: str
    """Label of the target (server and setting) that answered."""
    sweep: str
    """``concurrency`` or ``prompt``."""
    clients: int
    """Requests in flight together at this level."""
    prompt_tokens_target: int
    """Prompt length asked for."""
    cache: str = "cold"
    """``cold`` (a prompt nobody sent before) or ``warm`` (the same prompt again)."""
    round: int = 0
    """Round of the level (``--rounds``)."""
    client: int = 0
    """Index of the client in its level."""
    start_s: float = 0.0
    """When the request was sent, seconds since the benchmark began."""
    ok: bool = False
    """True when the answer arrived whole."""
    error: str | None = None
    """Why it failed."""
    status: int | None = None
    """HTTP status of a refused request."""
    ttft_ms: float | None = None
    """Request sent → first text, measured here."""
    duration_s: float | None = None
    """Request sent → answer complete."""
    tokens: int = 0
    """Tokens generated (the server's count when it gives one, else text chunks)."""
    chunks: int = 0
    """Text chunks received."""
    stream_tps: float | None = None
    """Per-stream decode rate here: tokens after the first over first → last text."""
    prompt_tokens: int | None = None
    """Prompt tokens as the server counted them (evaluated plus cached)."""
    cached_tokens: int | None = None
    """Prompt tokens the server reused from its cache."""
    server_ttft_ms: float | None = None
    """TTFT as the server measured it (localllm)."""
    queue_ms: float | None = None
    """Time the request waited for a slot (localllm)."""
    load_ms: float | None = None
    """Time spent loading the model for this request."""
    prefill_tps: float | None = None
    """Prompt evaluation rate reported by the server."""
    server_decode_tps: float | None = None
    """Decode rate reported by the server."""
    draft_tokens: int | None = None
    """Speculative draft tokens proposed (localllm)."""
    draft_accepted: int | None = None
    """Draft tokens accepted."""

    def to_json(self) -> dict[str, Any]:
        """The sample as a JSON object (every field)."""
        return dataclasses.asdict(self)


@dataclass
class Point:
    """One level of a sweep for one target, summarized over its samples (all rounds)."""

    target: str
    """Label of the target."""
    sweep: str
    """``concurrency`` or ``prompt``."""
    clients: int
    """Concurrent requests."""
    prompt_tokens: int
    """Prompt length asked for."""
    cache: str
    """``cold`` or ``warm``."""
    requests: int = 0
    """Requests sent."""
    failed: int = 0
    """Requests that failed."""
    errors: list[str] = field(default_factory=list)
    """The first few distinct failure messages."""
    ttft_p50_ms: float | None = None
    """Median client-side TTFT."""
    ttft_p95_ms: float | None = None
    """95th-percentile client-side TTFT (nearest rank)."""
    stream_tps_p50: float | None = None
    """Median per-stream decode rate."""
    aggregate_tps: float | None = None
    """Tokens of all streams over the level's wall time."""
    queue_ms_p50: float | None = None
    """Median wait for a slot (servers that report it)."""
    prefill_tps_p50: float | None = None
    """Median prompt evaluation rate (servers that report it)."""
    cached_tokens_mean: float | None = None
    """Mean prompt tokens reused from the cache."""
    prompt_tokens_mean: float | None = None
    """Mean prompt tokens as the server counted them."""
    wall_s: float = 0.0
    """Wall time of the level, summed over its rounds."""

    @property
    def key(self) -> tuple[str, str, int, int, str]:
        """What identifies the point: target, sweep, clients, prompt length, cache."""
        return (self.target, self.sweep, self.clients, self.prompt_tokens, self.cache)

    def to_json(self) -> dict[str, Any]:
        """The point as a JSON object (every field)."""
        return dataclasses.asdict(self)


def percentile(values: Sequence[float], share: float) -> float | None:
    """Nearest-rank percentile (``share`` in 0..1) of ``values``; ``None`` when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(share * len(ordered)) - 1))]


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def summarize(samples: Sequence[Sample], wall_s: float, point: Point) -> Point:
    """Fill ``point`` from ``samples`` (the level's requests, all rounds) and its wall time."""
    good = [s for s in samples if s.ok]
    point.requests = len(samples)
    point.failed = len(samples) - len(good)
    errors: list[str] = []
    for sample in samples:
        if sample.error and sample.error not in errors and len(errors) < _ERRORS_KEPT:
            errors.append(sample.error)
    point.errors = errors
    point.wall_s = wall_s
    ttfts = [s.ttft_ms for s in good if s.ttft_ms is not None]
    point.ttft_p50_ms = _median(ttfts)
    point.ttft_p95_ms = percentile(ttfts, 0.95)
    point.stream_tps_p50 = _median([s.stream_tps for s in good if s.stream_tps is not None])
    tokens = sum(s.tokens for s in good)
    point.aggregate_tps = tokens / wall_s if good and wall_s > 0 else None
    point.queue_ms_p50 = _median([s.queue_ms for s in good if s.queue_ms is not None])
    point.prefill_tps_p50 = _median([s.prefill_tps for s in good if s.prefill_tps is not None])
    point.cached_tokens_mean = _mean(
        [float(s.cached_tokens) for s in good if s.cached_tokens is not None]
    )
    point.prompt_tokens_mean = _mean(
        [float(s.prompt_tokens) for s in good if s.prompt_tokens is not None]
    )
    return point


# -- drivers -----------------------------------------------------------------------------------


@dataclass
class _Final:
    """The server's own figures for one request, in bench units (normalized per API)."""

    tokens: int | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    ttft_ms: float | None = None
    queue_ms: float | None = None
    load_ms: float | None = None
    prefill_tps: float | None = None
    decode_tps: float | None = None
    draft_tokens: int | None = None
    draft_accepted: int | None = None


def _ns_to_ms(value: Any) -> float | None:
    return value / 1e6 if isinstance(value, int | float) else None


def _rate(count: Any, nanoseconds: Any) -> float | None:
    if isinstance(count, int | float) and isinstance(nanoseconds, int | float) and nanoseconds:
        return count / (nanoseconds / 1e9)
    return None


def _ollama_final(chunk: Mapping[str, Any]) -> _Final:
    """Figures from the last chunk of ``/api/generate`` (localllm's extras when present; plain
    Ollama counts only the evaluated prompt tokens and has no rates, so they are derived)."""
    cached = chunk.get("prompt_cached_count")
    evaluated = chunk.get("prompt_eval_count")
    return _Final(
        tokens=chunk.get("eval_count"),
        prompt_tokens=evaluated,
        cached_tokens=cached,
        ttft_ms=_ns_to_ms(chunk.get("ttft_duration")),
        queue_ms=_ns_to_ms(chunk.get("queue_duration")),
        load_ms=_ns_to_ms(chunk.get("load_duration")),
        prefill_tps=chunk.get("prompt_eval_rate")
        or _rate(chunk.get("prompt_evaluated_count", evaluated), chunk.get("prompt_eval_duration")),
        decode_tps=chunk.get("eval_rate")
        or _rate(chunk.get("eval_count"), chunk.get("eval_duration")),
        draft_tokens=chunk.get("draft_count"),
        draft_accepted=chunk.get("draft_accepted_count"),
    )


def _openai_final(data: Mapping[str, Any], final: _Final) -> None:
    """Figures from an OpenAI stream's ``usage`` and llama-server's ``timings``."""
    usage = data.get("usage")
    if isinstance(usage, Mapping):
        final.tokens = usage.get("completion_tokens", final.tokens)
        final.prompt_tokens = usage.get("prompt_tokens", final.prompt_tokens)
        details = usage.get("prompt_tokens_details")
        if isinstance(details, Mapping) and details.get("cached_tokens") is not None:
            final.cached_tokens = details.get("cached_tokens")
    timings = data.get("timings")
    if isinstance(timings, Mapping):  # llama-server
        final.prefill_tps = timings.get("prompt_per_second", final.prefill_tps)
        final.decode_tps = timings.get("predicted_per_second", final.decode_tps)
        if timings.get("cache_n") is not None:
            final.cached_tokens = timings.get("cache_n")
        if final.prompt_tokens is None and timings.get("prompt_n") is not None:
            final.prompt_tokens = int(timings["prompt_n"]) + int(timings.get("cache_n") or 0)
        if final.tokens is None and timings.get("predicted_n") is not None:
            final.tokens = timings.get("predicted_n")


class Driver:
    """Sends one streamed completion to one server and reports what came back.

    Subclasses implement :meth:`complete`; ``kind`` names the API family and ``url`` where the
    server is (for the report).
    """

    kind = "server"
    """``localllm``, ``ollama`` or ``openai``."""

    def __init__(self, url: str) -> None:
        self.url = url
        """Where the server is (a URL or a socket path)."""

    async def complete(
        self,
        model: str,
        prompt: str,
        max_tokens: int,
        options: Mapping[str, Any],
        on_text: Callable[[str], None],
    ) -> _Final:
        """Stream a greedy raw completion of ``prompt``; ``on_text`` gets each piece of text
        as it arrives; returns the server's figures. Raises on any failure."""
        raise NotImplementedError

    async def close(self) -> None:
        """Release connections."""

    async def describe_model(self, model: str) -> dict[str, Any]:
        """What the server says about the model loaded for ``model``: ``slots``,
        ``context_length``, ``memory`` facts; empty when it does not say."""
        return {}


class LocalllmDriver(Driver):
    """A localllm daemon, through :class:`~localllm.client.AsyncClient` (Unix socket or TCP)."""

    kind = "localllm"

    def __init__(self, client: AsyncClient, *, kv_cache_type: str | None = None) -> None:
        super().__init__(client.address)
        self.client = client
        """The client (the caller's: closed by :meth:`close` only when ``owns_client``)."""
        self.owns_client = False
        """Close the client with the driver."""
        self.kv_cache_type = kv_cache_type
        """The daemon's KV cache type when known (it is a daemon setting, not in its API)."""

    async def complete(
        self,
        model: str,
        prompt: str,
        max_tokens: int,
        options: Mapping[str, Any],
        on_text: Callable[[str], None],
    ) -> _Final:
        """See :meth:`Driver.complete` (``/api/generate``, raw, streamed)."""
        final = _Final()
        body = {"temperature": 0, **options, "num_predict": max_tokens}
        async for chunk in self.client.generate_stream(model, prompt, raw=True, options=body):
            if chunk.get("response"):
                on_text(chunk["response"])
            if chunk.get("done"):
                final = _ollama_final(chunk)
        return final

    async def close(self) -> None:
        """Close the client when the driver owns it."""
        if self.owns_client:
            await self.client.close()

    async def describe_model(self, model: str) -> dict[str, Any]:
        """Slots, context and memory of ``model`` from ``/api/ps``, ``/api/stats`` and
        ``/api/show``: KV bytes are the runner's cells times the model's bytes per cell for
        the KV cache type; the runner's resident memory when it runs on this machine."""
        from .names import parse_name

        try:
            wanted = parse_name(model).short
        except LocalLLMError:
            wanted = model
        loaded = [m for m in await self.client.ps() if m.get("name") in (model, wanted)]
        if not loaded:
            return {}
        entry = loaded[0]
        facts: dict[str, Any] = {
            "slots": entry.get("slots"),
            "context_length": entry.get("context_length"),
        }
        # The daemon says its KV type in /api/ps; older ones do not, then it is assumed.
        reported = entry.get("kv_cache_type")
        known = self.kv_cache_type or reported
        memory: dict[str, Any] = {
            "kv_cache_type": known or Settings.from_env().kv_cache_type,
            "kv_cache_type_assumed": known is None,
            "kv_cells": None,
            "kv_bytes": None,
            "size": entry.get("size"),
            "runner_rss": _rss(entry.get("runner_pid")),
        }
        with contextlib.suppress(DaemonError):
            stats = await self.client.stats()
            for live in stats.get("models", []):
                if live.get("name") == entry.get("name") and live.get("kv_cells_total"):
                    memory["kv_cells"] = int(live["kv_cells_total"])
        if memory["kv_cells"]:
            with contextlib.suppress(DaemonError, LocalLLMError, KeyError, TypeError):
                show = await self.client.show(model)
                memory["kv_bytes"] = _kv_bytes(
                    show.get("model_info") or {}, memory["kv_cells"], memory["kv_cache_type"]
                )
        facts["memory"] = memory
        return facts


def _kv_bytes(model_info: Mapping[str, Any], cells: int, kv_cache_type: str) -> int | None:
    """Bytes of K and V for ``cells`` cells, from the model's metadata (GGUF keys)."""
    from .gguf_info import KV_BYTES_PER_ELEMENT, GGUFInfo

    if kv_cache_type not in KV_BYTES_PER_ELEMENT:
        return None
    info = GGUFInfo(path=Path(), file_size=0, version=3, metadata=dict(model_info), tensors=())
    size = info.kv_cache_bytes(cells, kv_cache_type)
    return size or None


def _rss(pid: Any) -> int | None:
    """Resident bytes of a process on this machine (Linux), ``None`` when unknown."""
    if not isinstance(pid, int):
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


class _HttpDriver(Driver):
    """Shared httpx plumbing of the Ollama and OpenAI drivers."""

    def __init__(self, url: str, *, api_key: str | None = None) -> None:
        super().__init__(url.rstrip("/"))
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # No read timeout: a loaded server may take long to start answering under load.
        self.http = httpx.AsyncClient(
            base_url=self.url,
            headers=headers,
            timeout=httpx.Timeout(None, connect=10.0),
            transport=async_transport(
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=64)
            ),
        )
        """The connection pool."""

    async def close(self) -> None:
        """Close the connection pool."""
        await self.http.aclose()

    @staticmethod
    async def _check(response: httpx.Response) -> None:
        if response.status_code >= 400:
            await response.aread()
            try:
                data = response.json()
                error = data.get("error")
                message = error.get("message") if isinstance(error, Mapping) else error
            except (ValueError, AttributeError):
                message = None
            raise APIError(response.status_code, str(message or response.text[:200]).strip())


class OllamaDriver(_HttpDriver):
    """An Ollama-compatible server: ``/api/generate`` (raw, streamed NDJSON)."""

    kind = "ollama"

    async def complete(
        self,
        model: str,
        prompt: str,
        max_tokens: int,
        options: Mapping[str, Any],
        on_text: Callable[[str], None],
    ) -> _Final:
        """See :meth:`Driver.complete`."""
        body = {
            "model": model,
            "prompt": prompt,
            "raw": True,
            "stream": True,
            "options": {"temperature": 0, **options, "num_predict": max_tokens},
        }
        final = _Final()
        async with self.http.stream("POST", "/api/generate", json=body) as response:
            await self._check(response)
            async for line in response.aiter_lines():
                if not line.strip():
                    continue
                chunk = json.loads(line)
                if chunk.get("error"):
                    raise APIError(500, str(chunk["error"]))
                if chunk.get("response"):
                    on_text(chunk["response"])
                if chunk.get("done"):
                    final = _ollama_final(chunk)
        return final


class OpenAIDriver(_HttpDriver):
    """An OpenAI-compatible server: ``/v1/completions`` streamed as SSE, with usage."""

    kind = "openai"

    async def complete(
        self,
        model: str,
        prompt: str,
        max_tokens: int,
        options: Mapping[str, Any],
        on_text: Callable[[str], None],
    ) -> _Final:
        """See :meth:`Driver.complete`; ``options`` (Ollama's names) are not sent: the
        OpenAI API has no equivalent for most of them."""
        body: dict[str, Any] = {
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        final = _Final()
        async with self.http.stream("POST", "/v1/completions", json=body) as response:
            await self._check(response)
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                data = json.loads(payload)
                if data.get("error"):
                    error = data["error"]
                    raise APIError(
                        500,
                        str(error.get("message", error) if isinstance(error, Mapping) else error),
                    )
                for choice in data.get("choices") or []:
                    if choice.get("text"):
                        on_text(choice["text"])
                _openai_final(data, final)
        return final


async def detect_driver(url: str, *, api: str = "auto", api_key: str | None = None) -> Driver:
    """A driver for the server at ``url``: ``api`` ``localllm``, ``ollama`` or ``openai``, or
    ``auto`` to ask the server (localllm says so at ``/``; Ollama answers ``/api/version``;
    anything else is taken for OpenAI-compatible)."""
    if api not in ("auto", "localllm", "ollama", "openai"):
        raise BenchError(f"unknown API {api!r}: use auto, localllm, ollama or openai")
    url = url.rstrip("/")
    if "://" not in url:
        url = f"http://{url}"
    if api == "auto":
        api = "openai"
        async with httpx.AsyncClient(
            base_url=url, timeout=5.0, transport=async_transport()
        ) as http:
            with contextlib.suppress(httpx.HTTPError):
                root = await http.get("/")
                if root.status_code == 200 and "localllm" in root.text.lower():
                    api = "localllm"
                elif (await http.get("/api/version")).status_code == 200:
                    api = "ollama"
    if api == "localllm":
        client = AsyncClient(base_url=url, api_key=api_key)
        driver = LocalllmDriver(client)
        driver.owns_client = True
        return driver
    if api == "ollama":
        return OllamaDriver(url, api_key=api_key)
    return OpenAIDriver(url, api_key=api_key)


def _describe_error(exc: BaseException) -> tuple[str, int | None]:
    if isinstance(exc, APIError):
        return f"HTTP {exc.status_code}: {exc}", exc.status_code
    if isinstance(exc, httpx.HTTPError):
        return f"{type(exc).__name__}: {exc or 'connection failed'}", None
    return f"{type(exc).__name__}: {exc}", None


async def _one(
    driver: Driver,
    model: str,
    prompt: str,
    max_tokens: int,
    options: Mapping[str, Any],
    sample: Sample,
    origin: float,
) -> None:
    """Run one request into ``sample``; failures are recorded, never raised."""
    sent = time.perf_counter()
    first: float | None = None
    last: float | None = None
    chunks = 0

    def on_text(piece: str) -> None:
        nonlocal first, last, chunks
        now = time.perf_counter()
        first = first or now
        last = now
        chunks += 1

    sample.start_s = sent - origin
    try:
        final = await driver.complete(model, prompt, max_tokens, options, on_text)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # whatever the server or the network did: a failed sample
        sample.error, sample.status = _describe_error(exc)
        sample.chunks = chunks
        return
    done = time.perf_counter()
    sample.ok = True
    sample.chunks = chunks
    sample.duration_s = done - sent
    sample.tokens = final.tokens if final.tokens is not None else chunks
    if first is not None:
        sample.ttft_ms = (first - sent) * 1000
        if last is not None and last > first and sample.tokens >= 2:
            sample.stream_tps = (sample.tokens - 1) / (last - first)
    sample.prompt_tokens = final.prompt_tokens
    sample.cached_tokens = final.cached_tokens
    sample.server_ttft_ms = final.ttft_ms
    sample.queue_ms = final.queue_ms
    sample.load_ms = final.load_ms
    sample.prefill_tps = final.prefill_tps
    sample.server_decode_tps = final.decode_tps
    sample.draft_tokens = final.draft_tokens
    sample.draft_accepted = final.draft_accepted


async def run_level(
    driver: Driver,
    model: str,
    prompts: Sequence[str],
    max_tokens: int,
    *,
    options: Mapping[str, Any] | None = None,
    template: Sample | None = None,
    origin: float | None = None,
) -> tuple[list[Sample], float]:
    """Send one request per prompt, all at once; returns a :class:`Sample` each (copies of
    ``template`` with ``client`` set) and the wall time from the first send to the last
    answer. Failed requests are samples with ``ok`` false, never exceptions."""
    base = template or Sample(
        target=driver.url, sweep="concurrency", clients=len(prompts), prompt_tokens_target=0
    )
    origin = time.perf_counter() if origin is None else origin
    samples = [dataclasses.replace(base, client=i) for i in range(len(prompts))]
    start = time.perf_counter()
    await asyncio.gather(
        *(
            _one(driver, model, prompt, max_tokens, options or {}, sample, origin)
            for prompt, sample in zip(prompts, samples, strict=True)
        )
    )
    return samples, time.perf_counter() - start


# -- prompts -----------------------------------------------------------------------------------


def _counting_text(characters: int) -> str:
    """``1, 2, 3, ...`` at least ``characters`` long."""
    parts: list[str] = []
    total = 0
    number = 1
    while total < characters:
        piece = f"{number}, "
        parts.append(piece)
        total += len(piece)
        number += 1
    return "".join(parts)


class PromptMaker:
    """Prompts of about N tokens: a unique tag, then counting text cut to length.

    ``chars_per_token`` comes from :meth:`calibrate` (the server's own count for a known text)
    or a guess. ``nonce`` makes tags unique to this run, so that no prefix saved by an earlier
    run (the daemon keeps them on disk) turns a cold request into a cached one.
    """

    def __init__(self, chars_per_token: float = 2.0, nonce: str | None = None) -> None:
        self.chars_per_token = chars_per_token
        """Characters of counting text per token, for this server's tokenizer."""
        self.nonce = nonce or secrets.token_hex(3)
        """Part of every tag, unique to the run."""
        self._text = _counting_text(4096)

    def make(self, tokens: int, tag: str) -> str:
        """A prompt of about ``tokens`` tokens starting with ``tag`` (make tags unique)."""
        head = f"[{tag} {self.nonce}] "
        # The tag's own tokens count too (about as dense as the rest).
        chars = max(8, int((tokens - len(head) / self.chars_per_token) * self.chars_per_token))
        if len(self._text) < chars:
            self._text = _counting_text(chars * 2)
        body = self._text[:chars]
        # Cut after a comma: the model then keeps counting instead of finishing a number.
        cut = body.rfind(", ")
        return head + (body[: cut + 2] if cut > 0 else body)

    async def calibrate(self, driver: Driver, model: str, options: Mapping[str, Any]) -> bool:
        """Measure characters per token with one one-token request (which also loads the
        model); True when the server reported a prompt token count."""
        prompt = f"[calibrate {self.nonce}] " + self._text[:_CALIBRATION_CHARS]
        final = await driver.complete(model, prompt, 1, options, lambda piece: None)
        if final.prompt_tokens:
            self.chars_per_token = max(0.5, len(prompt) / final.prompt_tokens)
            return True
        return False


# -- targets and the workload ------------------------------------------------------------------


@dataclass
class Target:
    """One server, model and setting a workload runs against."""

    label: str
    """Name in tables and plots (``localllm``, ``kv_cache_type=q8_0``, the peer's URL)."""
    driver: Driver
    """How requests reach it."""
    model: str
    """The model name on that server."""
    options: dict[str, Any] = field(default_factory=dict)
    """Request options sent with every request (a ``--compare`` request option)."""
    setting: dict[str, Any] = field(default_factory=dict)
    """What ``--compare`` set for this target (request option or daemon setting)."""
    daemon: SpawnedDaemon | None = None
    """The private daemon started for a daemon setting, stopped by :meth:`Bench.close`."""
    error: str | None = None
    """Why it could not be warmed up (its levels are still run, and fail, reported)."""
    facts: dict[str, Any] = field(default_factory=dict)
    """What the server said about the model (slots, context, memory)."""

    def to_json(self) -> dict[str, Any]:
        """The target as the JSON document describes it."""
        return {
            "label": self.label,
            "kind": self.driver.kind,
            "url": self.driver.url,
            "model": self.model,
            "options": self.options,
            "setting": self.setting,
            "error": self.error,
            "memory": self.facts.get("memory"),
        }

    @property
    def load_key(self) -> tuple[Any, ...]:
        """Requests with the same key need no reload of the model between them (targets that
        differ in it are warmed up again before each level: a reload is not a TTFT)."""
        loads = tuple(sorted((k, v) for k, v in self.options.items() if k in LOAD_OPTIONS))
        return (id(self.driver), self.model, loads)


@dataclass
class Workload:
    """What to measure."""

    levels: list[int] = field(default_factory=lambda: list(DEFAULT_LEVELS))
    """Concurrent clients of the concurrency sweep (empty: no such sweep)."""
    prompt_tokens: int = 128
    """Prompt length of the concurrency sweep."""
    answer_tokens: int = 64
    """Tokens each request asks for (``num_predict`` / ``max_tokens``)."""
    prompt_lengths: list[int] = field(default_factory=lambda: list(DEFAULT_PROMPT_LENGTHS))
    """Prompt lengths of the prompt-length sweep (empty: no such sweep)."""
    prefill_answer_tokens: int = 4
    """Tokens asked for in the prompt-length sweep (it measures prefill and TTFT)."""
    rounds: int = 1
    """Times each level runs per target (targets take turns within a round)."""
    options: dict[str, Any] = field(default_factory=dict)
    """Request options for every target."""

    def to_json(self) -> dict[str, Any]:
        """The workload as a JSON object."""
        return dataclasses.asdict(self)

    def check(self) -> None:
        """Refuse values that cannot be measured."""
        if any(n < 1 for n in self.levels):
            raise BenchError("concurrency levels must be at least 1")
        if any(n < 1 for n in self.prompt_lengths) or self.prompt_tokens < 1:
            raise BenchError("prompt lengths must be at least 1 token")
        if self.answer_tokens < 1 or self.prefill_answer_tokens < 1:
            raise BenchError("answers must be at least 1 token")
        if self.rounds < 1:
            raise BenchError("rounds must be at least 1")
        if not self.levels and not self.prompt_lengths:
            raise BenchError("nothing to measure: no concurrency levels and no prompt lengths")


@dataclass
class BenchResult:
    """Everything one run measured."""

    model: str
    """The model benchmarked (on the reference target)."""
    workload: Workload
    """What was asked."""
    targets: list[Target]
    """Servers and settings, the reference first."""
    points: list[Point]
    """One per level, sweep and target."""
    samples: list[Sample]
    """Every request."""
    started_at: float = field(default_factory=time.time)
    """When the run began (seconds since the epoch)."""
    notes: list[str] = field(default_factory=list)
    """What was adjusted or skipped, for people (levels capped, prompts too long...)."""

    def ratios(self) -> list[dict[str, Any]]:
        """Each non-reference target's figures divided by the reference's, level by level."""
        if len(self.targets) < 2:
            return []
        reference = self.targets[0].label
        by_key = {p.key: p for p in self.points}
        rows = []
        for point in self.points:
            if point.target == reference:
                continue
            base = by_key.get((reference, *point.key[1:]))
            if base is None:
                continue

            def ratio(name: str, point: Point = point, base: Point = base) -> float | None:
                mine, theirs = getattr(point, name), getattr(base, name)
                if mine is None or not theirs:
                    return None
                return mine / theirs

            rows.append(
                {
                    "target": point.target,
                    "reference": reference,
                    "sweep": point.sweep,
                    "clients": point.clients,
                    "prompt_tokens": point.prompt_tokens,
                    "cache": point.cache,
                    "aggregate_tps": ratio("aggregate_tps"),
                    "stream_tps_p50": ratio("stream_tps_p50"),
                    "ttft_p50_ms": ratio("ttft_p50_ms"),
                    "prefill_tps_p50": ratio("prefill_tps_p50"),
                }
            )
        return rows

    @property
    def failed(self) -> int:
        """Requests that failed, over the whole run."""
        return sum(1 for s in self.samples if not s.ok)

    def to_json(self) -> dict[str, Any]:
        """The JSON document (see the module docstring and :data:`JSON_SCHEMA`)."""
        from . import __version__

        return {
            "schema": SCHEMA_ID,
            "created_at": datetime.fromtimestamp(self.started_at, UTC).isoformat(),
            "localllm_version": __version__,
            "host": {
                "platform": platform.platform(),
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
            },
            "model": self.model,
            "workload": self.workload.to_json(),
            "targets": [t.to_json() for t in self.targets],
            "notes": list(self.notes),
            "points": [p.to_json() for p in self.points],
            "ratios": self.ratios(),
            "samples": [s.to_json() for s in self.samples],
        }


ProgressCallback = Callable[[int, int, str], None]
"""``(steps done, steps in all, what runs now)``."""
PointCallback = Callable[[Point], None]
"""Called with a point each time one of its rounds ends (the same object, updated)."""


class Bench:
    """Runs a :class:`Workload` against :class:`Target` s (the first is the reference: its
    slots and context cap the default sweeps, and ratios are against it)."""

    def __init__(
        self,
        targets: Sequence[Target],
        workload: Workload,
        *,
        on_progress: ProgressCallback | None = None,
        on_point: PointCallback | None = None,
        cap_levels: bool = True,
    ) -> None:
        if not targets:
            raise BenchError("no target to benchmark")
        workload.check()
        self.targets = list(targets)
        """Servers and settings, the reference first."""
        self.workload = workload
        """What to measure."""
        self.on_progress = on_progress
        """Told before each step."""
        self.on_point = on_point
        """Told after each round of a level."""
        self.cap_levels = cap_levels
        """Cap the concurrency levels at twice the reference's slots."""
        self.points: dict[tuple[str, str, int, int, str], Point] = {}
        """Points by :attr:`Point.key`, in the order they appeared."""
        self.samples: list[Sample] = []
        """Every request so far."""
        self.notes: list[str] = []
        """Adjustments made, for people."""
        self.prompts = PromptMaker()
        """Prompt texts of the run."""
        self._origin = time.perf_counter()
        self._walls: dict[tuple[str, str, int, int, str], float] = {}
        self._loaded: tuple[Any, ...] | None = None
        self._step = 0
        self._steps = 0

    # -- steps ---------------------------------------------------------------------------

    def _progress(self, what: str) -> None:
        if self.on_progress is not None:
            self.on_progress(self._step, self._steps, what)
        self._step += 1

    async def _warm(self, target: Target) -> None:
        """Load ``target``'s model with its load options before anything is timed."""
        if self._loaded == target.load_key:
            return
        self._loaded = target.load_key
        options = {**self.workload.options, **target.options}
        try:
            await target.driver.complete(
                target.model,
                self.prompts.make(8, f"warm {target.label}"),
                1,
                options,
                lambda piece: None,
            )
        except Exception as exc:
            target.error = target.error or _describe_error(exc)[0]

    async def _level(
        self,
        target: Target,
        sweep: str,
        clients: int,
        prompt_tokens: int,
        cache: str,
        round_: int,
        prompts: Sequence[str],
        max_tokens: int,
    ) -> Point:
        await self._warm(target)
        template = Sample(
            target=target.label,
            sweep=sweep,
            clients=clients,
            prompt_tokens_target=prompt_tokens,
            cache=cache,
            round=round_,
        )
        options = {**self.workload.options, **target.options}
        samples, wall = await run_level(
            target.driver,
            target.model,
            prompts,
            max_tokens,
            options=options,
            template=template,
            origin=self._origin,
        )
        self.samples.extend(samples)
        key = (target.label, sweep, clients, prompt_tokens, cache)
        self._walls[key] = self._walls.get(key, 0.0) + wall
        point = self.points.get(key) or Point(target.label, sweep, clients, prompt_tokens, cache)
        self.points[key] = point
        mine = [
            s
            for s in self.samples
            if (s.target, s.sweep, s.clients, s.prompt_tokens_target, s.cache) == key
        ]
        summarize(mine, self._walls[key], point)
        if self.on_point is not None:
            self.on_point(point)
        return point

    # -- the run -------------------------------------------------------------------------

    async def _prepare(self) -> tuple[list[int], list[int]]:
        """Calibrate prompts and load models; returns the levels and prompt lengths to run."""
        reference = self.targets[0]
        options = {**self.workload.options, **reference.options}
        try:
            await self.prompts.calibrate(reference.driver, reference.model, options)
            self._loaded = reference.load_key
        except Exception as exc:
            reference.error = _describe_error(exc)[0]
        for target in self.targets:
            await self._warm(target)
            with contextlib.suppress(Exception):
                target.facts.update(await target.driver.describe_model(target.model))
        levels = list(self.workload.levels)
        slots = reference.facts.get("slots")
        if self.cap_levels and isinstance(slots, int) and slots > 0:
            capped = [n for n in levels if n <= 2 * slots]
            if capped != levels:
                self.notes.append(
                    f"concurrency capped at {2 * slots} (twice the {slots} slots of the "
                    f"reference); skipped {', '.join(str(n) for n in levels if n > 2 * slots)}"
                )
            levels = capped or levels[:1]
        lengths = list(self.workload.prompt_lengths)
        context = reference.facts.get("context_length")
        if isinstance(context, int) and context > 0:
            room = context - self.workload.prefill_answer_tokens - 16
            fitting = [n for n in lengths if n <= room]
            if fitting != lengths:
                self.notes.append(
                    f"prompt lengths over the {context}-token context of a slot skipped: "
                    + ", ".join(str(n) for n in lengths if n > room)
                )
            lengths = fitting
        return levels, lengths

    async def run(self) -> BenchResult:
        """Measure everything; returns the result (failed requests are in it, not raised)."""
        started = time.time()
        self._origin = time.perf_counter()
        self._progress("loading the model")
        levels, lengths = await self._prepare()
        work = self.workload
        self._steps = 1 + len(self.targets) * (work.rounds * len(levels) + 2 * len(lengths))
        for clients in levels:
            for round_ in range(work.rounds):
                for target in self.targets:
                    self._progress(f"{target.label}: {clients} client{'s' * (clients > 1)}")
                    prompts = [
                        self.prompts.make(
                            work.prompt_tokens, f"c{clients} r{round_} n{i} {target.label}"
                        )
                        for i in range(clients)
                    ]
                    await self._level(
                        target,
                        "concurrency",
                        clients,
                        work.prompt_tokens,
                        "cold",
                        round_,
                        prompts,
                        work.answer_tokens,
                    )
        for length in lengths:
            for target in self.targets:
                prompt = self.prompts.make(length, f"p{length} {target.label}")
                for cache in ("cold", "warm"):
                    self._progress(f"{target.label}: {length}-token prompt, {cache}")
                    await self._level(
                        target,
                        "prompt",
                        1,
                        length,
                        cache,
                        0,
                        [prompt],
                        work.prefill_answer_tokens,
                    )
        # Memory after the run: the KV cache has grown to what the workload needed.
        for target in self.targets:
            with contextlib.suppress(Exception):
                target.facts.update(await target.driver.describe_model(target.model))
        if self.on_progress is not None:
            self.on_progress(self._steps, self._steps, "done")
        return BenchResult(
            model=self.targets[0].model,
            workload=work,
            targets=self.targets,
            points=list(self.points.values()),
            samples=self.samples,
            started_at=started,
            notes=self.notes,
        )

    async def close(self) -> None:
        """Close the drivers and stop the daemons started for the targets."""
        for target in self.targets:
            with contextlib.suppress(Exception):
                await target.driver.close()
            if target.daemon is not None:
                await target.daemon.stop()


# -- --compare ---------------------------------------------------------------------------------


def _setting_fields() -> dict[str, dataclasses.Field[Any]]:
    return {
        f.name: f
        for f in dataclasses.fields(Settings)
        if f.metadata.get("env") and f.name not in _NOT_COMPARABLE
    }


def _option_value(text: str) -> Any:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        with contextlib.suppress(ValueError):
            return kind(text)
    return text


def compare_plan(spec: str) -> tuple[str, str, list[str]]:
    """Parse ``KEY=V1,V2,...``: returns the key, ``option`` (a request option: the same
    daemon, sent with each request) or ``setting`` (a daemon setting: a daemon per value),
    and the values. Raises :class:`BenchError` naming what is wrong."""
    from .models import OPTION_TYPES

    key, sep, values_text = spec.partition("=")
    key = key.strip().lower()
    values = [v.strip() for v in values_text.split(",") if v.strip()]
    if not sep or not key or len(values) < 2:
        raise BenchError(f"--compare wants KEY=VALUE1,VALUE2[,...], got {spec!r}")
    if key in ("speculation", "spec"):
        key = "speculative"
    settings = _setting_fields()
    if key in OPTION_TYPES:
        return key, "option", values
    if key in settings:
        return key, "setting", values
    options = ", ".join(sorted(k for k in OPTION_TYPES if k.startswith("num_")))
    daemon = ", ".join(sorted(settings))
    raise BenchError(
        f"cannot compare {key!r}: request options are {options} (and the sampling options); "
        f"daemon settings (a daemon per value) are {daemon}"
    )


class SpawnedDaemon:
    """A private localllm daemon for one daemon setting, sharing the user's model files.

    Its home is a temporary folder holding the model's manifest and links to its blobs (hard
    links when the temp dir is on the same file system, else symbolic ones), so nothing is
    copied and the user's daemon and store are left alone; it listens on a free loopback
    port. Other ``LOCALLLM_*`` variables of this process are passed on, the setting on top.
    """

    def __init__(self, settings: Settings, model: str, env: Mapping[str, str]) -> None:
        self.settings = settings
        """The user's settings (where the store is)."""
        self.model = model
        """The model to make available."""
        self.env = dict(env)
        """``LOCALLLM_*`` overrides for this daemon."""
        self.process: subprocess.Popen[bytes] | None = None
        """The daemon process once started."""
        self.home: Path | None = None
        """Its temporary home."""
        self.url = ""
        """Its base URL once started."""

    def _make_home(self) -> Path:
        from .names import parse_name
        from .starter import _MARKER
        from .store import Store

        store = Store(self.settings.data_dir)
        name = parse_name(self.model)
        entry = store.get(name)  # raises ModelNotFoundError with the pull hint
        home = Path(tempfile.mkdtemp(prefix="localllm-bench-"))
        shadow = Store(home)
        shadow.blobs_dir.mkdir(parents=True)
        for digest in entry.manifest.digests:
            source, target = store.blob_path(digest), shadow.blob_path(digest)
            try:
                os.link(source, target)
            except OSError:
                target.symlink_to(source.resolve())
        manifest = shadow.manifest_path(name)
        manifest.parent.mkdir(parents=True)
        shutil.copyfile(store.manifest_path(name), manifest)
        # The starter model would otherwise be imported (copied) into this home at start.
        (home / _MARKER).touch()
        return home

    async def start(self) -> AsyncClient:
        """Start the daemon and wait until it answers; returns a client for it."""
        from .autostart import _log_tail

        self.home = await asyncio.to_thread(self._make_home)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        env = {k: v for k, v in os.environ.items() if k not in ("LOCALLLM_HOME", "LOCALLLM_HOST")}
        env.update(self.env)
        env["LOCALLLM_HOME"] = str(self.home)
        env["LOCALLLM_HOST"] = f"127.0.0.1:{port}"
        log_path = self.home / "bench-daemon.log"
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "localllm.daemon"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.url = f"http://127.0.0.1:{port}"
        client = AsyncClient(Settings.from_env(env), use_tcp=True)
        deadline = time.monotonic() + _SPAWN_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                await client.close()
                tail = _log_tail(log_path, 0)
                await self.stop()
                raise BenchError(
                    f"the daemon for {self._describe()} exited with status "
                    f"{self.process.returncode}:\n{tail}"
                )
            if await client.is_running():
                return client
            await asyncio.sleep(0.1)
        await client.close()
        await self.stop()
        raise BenchError(f"the daemon for {self._describe()} did not answer in time")

    def _describe(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.env.items())

    async def stop(self) -> None:
        """Stop the daemon (SIGTERM, then SIGKILL) and remove its home."""
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(process.wait, 30)
            except subprocess.TimeoutExpired:
                process.kill()
                await asyncio.to_thread(process.wait)
        if self.home is not None:
            await asyncio.to_thread(shutil.rmtree, self.home, True)
            self.home = None


async def compare_targets(
    spec: str, settings: Settings, client: AsyncClient, model: str
) -> list[Target]:
    """One :class:`Target` per value of a ``--compare`` spec: request options on the daemon
    of ``client``, daemon settings on a :class:`SpawnedDaemon` each (the daemon must be on
    this machine, which holds the store they share)."""
    key, kind, values = compare_plan(spec)
    targets: list[Target] = []
    if kind == "option":
        for value in values:
            parsed = _option_value(value)
            targets.append(
                Target(
                    label=f"{key}={value}",
                    driver=LocalllmDriver(client),
                    model=model,
                    options={key: parsed},
                    setting={key: parsed},
                )
            )
        return targets
    env_name = _setting_fields()[key].metadata["env"]
    try:
        for value in values:
            daemon = SpawnedDaemon(settings, model, {env_name: value})
            spawned = await daemon.start()
            driver = LocalllmDriver(
                spawned, kv_cache_type=value.lower() if key == "kv_cache_type" else None
            )
            driver.owns_client = True
            if key != "kv_cache_type":
                driver.kv_cache_type = Settings.from_env(
                    {**os.environ, env_name: value}
                ).kv_cache_type
            targets.append(
                Target(
                    label=f"{key}={value}",
                    driver=driver,
                    model=model,
                    setting={key: value},
                    daemon=daemon,
                )
            )
    except BaseException:
        for target in targets:
            await target.driver.close()
            if target.daemon is not None:
                await target.daemon.stop()
        raise
    return targets


# -- tables ------------------------------------------------------------------------------------


def _num(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{_num(value, 0)} ms"


def _ratio_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}×"


def point_rows(
    result_points: Sequence[Point], ratios: Sequence[Mapping[str, Any]], sweep: str
) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of the results table of one sweep (``concurrency`` or ``prompt``),
    the same for the CLI and the TUI. Failed requests show as ``ok/sent`` and the first
    error; ratios (``vs ref``) as this target ÷ the reference: aggregate tok/s and TTFT p50 in
    the concurrency sweep, prefill tok/s and TTFT p50 in the prompt sweep."""
    by_key = {
        (r["target"], r["sweep"], r["clients"], r["prompt_tokens"], r["cache"]): r for r in ratios
    }
    show_ratio = bool(ratios)
    if sweep == "concurrency":
        headers = [
            "target",
            "clients",
            "ok",
            "TTFT p50",
            "TTFT p95",
            "stream tok/s",
            "agg tok/s",
            "queue p50",
            "prefill tok/s",
            "cached",
        ]
    else:
        headers = ["target", "prompt", "cache", "ok", "TTFT p50", "prefill tok/s", "cached"]
    if show_ratio:
        headers.append("vs ref")
    rows = []
    points = [p for p in result_points if p.sweep == sweep]
    order = {"cold": 0, "warm": 1}
    points.sort(key=lambda p: (p.clients, p.prompt_tokens, order.get(p.cache, 2)))
    for point in points:
        ok = f"{point.requests - point.failed}/{point.requests}"
        if sweep == "concurrency":
            row = [
                point.target,
                str(point.clients),
                ok,
                _ms(point.ttft_p50_ms),
                _ms(point.ttft_p95_ms),
                _num(point.stream_tps_p50),
                _num(point.aggregate_tps),
                _ms(point.queue_ms_p50),
                _num(point.prefill_tps_p50),
                _num(point.cached_tokens_mean, 0),
            ]
        else:
            row = [
                point.target,
                f"{point.prompt_tokens:,}",
                point.cache,
                ok,
                _ms(point.ttft_p50_ms),
                _num(point.prefill_tps_p50),
                _num(point.cached_tokens_mean, 0),
            ]
        if show_ratio:
            ratio = by_key.get(point.key)
            if ratio is None:
                row.append("ref" if not any(r["target"] == point.target for r in ratios) else "-")
            elif sweep == "concurrency":
                row.append(
                    f"{_ratio_text(ratio['aggregate_tps'])} / {_ratio_text(ratio['ttft_p50_ms'])}"
                )
            else:
                row.append(
                    f"{_ratio_text(ratio['prefill_tps_p50'])} / {_ratio_text(ratio['ttft_p50_ms'])}"
                )
        rows.append(row)
    return headers, rows


def marker(index: int) -> str:
    """The plot marker of the ``index``-th series (distinct without colour too)."""
    return _MARKERS[index % len(_MARKERS)]


# -- the JSON document's shape -----------------------------------------------------------------

_NUM = {"type": ["number", "null"]}
_INT = {"type": ["integer", "null"]}
_STR = {"type": ["string", "null"]}


def _object(properties: dict[str, Any], required: Sequence[str] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(required if required is not None else properties),
    }


JSON_SCHEMA: dict[str, Any] = _object(
    {
        "schema": {"const": SCHEMA_ID},
        "created_at": {"type": "string"},
        "localllm_version": {"type": "string"},
        "host": _object(
            {"platform": {"type": "string"}, "python": {"type": "string"}, "cpus": _INT}
        ),
        "model": {"type": "string"},
        "workload": _object(
            {
                "levels": {"type": "array", "items": {"type": "integer", "minimum": 1}},
                "prompt_tokens": {"type": "integer"},
                "answer_tokens": {"type": "integer"},
                "prompt_lengths": {"type": "array", "items": {"type": "integer"}},
                "prefill_answer_tokens": {"type": "integer"},
                "rounds": {"type": "integer", "minimum": 1},
                "options": {"type": "object"},
            }
        ),
        "targets": {
            "type": "array",
            "minItems": 1,
            "items": _object(
                {
                    "label": {"type": "string"},
                    "kind": {"enum": ["localllm", "ollama", "openai"]},
                    "url": {"type": "string"},
                    "model": {"type": "string"},
                    "options": {"type": "object"},
                    "setting": {"type": "object"},
                    "error": _STR,
                    "memory": {
                        "oneOf": [
                            {"type": "null"},
                            _object(
                                {
                                    "kv_cache_type": {"type": "string"},
                                    "kv_cache_type_assumed": {"type": "boolean"},
                                    "kv_cells": _INT,
                                    "kv_bytes": _INT,
                                    "size": _INT,
                                    "runner_rss": _INT,
                                }
                            ),
                        ]
                    },
                }
            ),
        },
        "notes": {"type": "array", "items": {"type": "string"}},
        "points": {
            "type": "array",
            "items": _object(
                {
                    "target": {"type": "string"},
                    "sweep": {"enum": ["concurrency", "prompt"]},
                    "clients": {"type": "integer", "minimum": 1},
                    "prompt_tokens": {"type": "integer"},
                    "cache": {"enum": ["cold", "warm"]},
                    "requests": {"type": "integer"},
                    "failed": {"type": "integer"},
                    "errors": {"type": "array", "items": {"type": "string"}},
                    "ttft_p50_ms": _NUM,
                    "ttft_p95_ms": _NUM,
                    "stream_tps_p50": _NUM,
                    "aggregate_tps": _NUM,
                    "queue_ms_p50": _NUM,
                    "prefill_tps_p50": _NUM,
                    "cached_tokens_mean": _NUM,
                    "prompt_tokens_mean": _NUM,
                    "wall_s": {"type": "number"},
                }
            ),
        },
        "ratios": {
            "type": "array",
            "items": _object(
                {
                    "target": {"type": "string"},
                    "reference": {"type": "string"},
                    "sweep": {"enum": ["concurrency", "prompt"]},
                    "clients": {"type": "integer"},
                    "prompt_tokens": {"type": "integer"},
                    "cache": {"enum": ["cold", "warm"]},
                    "aggregate_tps": _NUM,
                    "stream_tps_p50": _NUM,
                    "ttft_p50_ms": _NUM,
                    "prefill_tps_p50": _NUM,
                }
            ),
        },
        "samples": {
            "type": "array",
            "items": _object(
                {
                    "target": {"type": "string"},
                    "sweep": {"enum": ["concurrency", "prompt"]},
                    "clients": {"type": "integer"},
                    "prompt_tokens_target": {"type": "integer"},
                    "cache": {"enum": ["cold", "warm"]},
                    "round": {"type": "integer"},
                    "client": {"type": "integer"},
                    "start_s": {"type": "number"},
                    "ok": {"type": "boolean"},
                    "error": _STR,
                    "status": _INT,
                    "ttft_ms": _NUM,
                    "duration_s": _NUM,
                    "tokens": {"type": "integer"},
                    "chunks": {"type": "integer"},
                    "stream_tps": _NUM,
                    "prompt_tokens": _INT,
                    "cached_tokens": _INT,
                    "server_ttft_ms": _NUM,
                    "queue_ms": _NUM,
                    "load_ms": _NUM,
                    "prefill_tps": _NUM,
                    "server_decode_tps": _NUM,
                    "draft_tokens": _INT,
                    "draft_accepted": _INT,
                }
            ),
        },
    }
)
"""JSON Schema of the document :meth:`BenchResult.to_json` returns (and ``--json`` writes)."""


async def run_bench(
    targets: Sequence[Target],
    workload: Workload,
    *,
    on_progress: ProgressCallback | None = None,
    on_point: PointCallback | None = None,
    cap_levels: bool = True,
) -> BenchResult:
    """Run a :class:`Bench` and close it (drivers, spawned daemons) whatever happens."""
    bench = Bench(
        targets, workload, on_progress=on_progress, on_point=on_point, cap_levels=cap_levels
    )
    try:
        return await bench.run()
    finally:
        await asyncio.shield(bench.close())
