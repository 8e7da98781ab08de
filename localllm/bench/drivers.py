"""How the benchmark reaches a server: a :class:`Driver` sends one streamed completion and
reports what came back, for three server kinds: ``localllm`` (:class:`LocalllmDriver`, through
:class:`~localllm.client.AsyncClient`), ``ollama`` (:class:`OllamaDriver`, ``/api/generate``
over httpx) and ``openai`` (:class:`OpenAIDriver`, ``/v1/completions`` with SSE: llama-server,
vLLM, LM Studio...). :func:`detect_driver` picks one by asking the server.

What a server reports about a request (its counts, timings and rates, each API in its own
names) is normalized into :class:`Final`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import httpx

from .._exceptions import APIError, BenchError, DaemonError, LocalLLMError
from ..client import AsyncClient
from ..client._async_transport import async_transport
from ..settings import Settings

__all__ = [
    "Completion",
    "Driver",
    "Final",
    "LocalllmDriver",
    "OllamaDriver",
    "OpenAIDriver",
    "TextSink",
    "describe_error",
    "detect_driver",
    "ollama_final",
    "openai_final",
]

TextSink = Callable[[str], None]
"""Gets each piece of an answer's text as it arrives."""


class Completion(NamedTuple):
    """One greedy raw completion to ask for: ``options`` are Ollama's request options."""

    model: str
    prompt: str
    max_tokens: int
    options: Mapping[str, Any] = {}


@dataclass
class Final:
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
    finish_reason: str | None = None


def _ns_to_ms(value: Any) -> float | None:
    return value / 1e6 if isinstance(value, int | float) else None


def _rate(count: Any, nanoseconds: Any) -> float | None:
    if isinstance(count, int | float) and isinstance(nanoseconds, int | float) and nanoseconds:
        return count / (nanoseconds / 1e9)
    return None


def ollama_final(chunk: Mapping[str, Any]) -> Final:
    """Figures from the last chunk of ``/api/generate`` (localllm's extras when present; plain
    Ollama counts only the evaluated prompt tokens and has no rates, so they are derived)."""
    cached = chunk.get("prompt_cached_count")
    evaluated = chunk.get("prompt_eval_count")
    return Final(
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
        finish_reason=chunk.get("done_reason"),
    )


def openai_final(data: Mapping[str, Any], final: Final) -> None:
    """Update ``final`` from one chunk of an OpenAI stream: its ``usage``, llama-server's
    ``timings`` and a choice's ``finish_reason``."""
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
    for choice in data.get("choices") or []:
        if choice.get("finish_reason"):
            final.finish_reason = choice["finish_reason"]


def describe_error(exc: BaseException) -> tuple[str, int | None]:
    """A failed request's error for the report, and its HTTP status when it has one."""
    if isinstance(exc, APIError):
        return f"HTTP {exc.status_code}: {exc}", exc.status_code
    if isinstance(exc, httpx.HTTPError):
        return f"{type(exc).__name__}: {exc or 'connection failed'}", None
    return f"{type(exc).__name__}: {exc}", None


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

    async def complete(self, request: Completion, on_text: TextSink) -> Final:
        """Stream a greedy raw completion; ``on_text`` gets each piece of text as it arrives;
        returns the server's figures. Raises on any failure."""
        raise NotImplementedError

    async def close(self) -> None:
        """Release connections."""

    async def describe_model(self, model: str) -> dict[str, Any]:
        """What the server says about the model loaded for ``model``: ``slots``,
        ``context_length``, ``memory`` facts; empty when it does not say."""
        return {}


def _ollama_options(request: Completion) -> dict[str, Any]:
    return {"temperature": 0, **request.options, "num_predict": request.max_tokens}


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

    async def complete(self, request: Completion, on_text: TextSink) -> Final:
        """See :meth:`Driver.complete` (``/api/generate``, raw, streamed)."""
        final = Final()
        chunks = self.client.generate_stream(
            request.model, request.prompt, raw=True, options=_ollama_options(request)
        )
        async for chunk in chunks:
            if chunk.get("response"):
                on_text(chunk["response"])
            if chunk.get("done"):
                final = ollama_final(chunk)
        return final

    async def close(self) -> None:
        """Close the client when the driver owns it."""
        if self.owns_client:
            await self.client.close()

    async def describe_model(self, model: str) -> dict[str, Any]:
        """Slots, context and memory of ``model`` from ``/api/ps``, ``/api/stats`` and
        ``/api/show``: KV bytes are the runner's cells times the model's bytes per cell for
        the KV cache type; the runner's resident memory when it runs on this machine."""
        from ..store.names import parse_name

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
    from ..gguf_info import KV_BYTES_PER_ELEMENT, GGUFInfo

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


def _error_text(error: Any) -> str:
    return str(error.get("message", error) if isinstance(error, Mapping) else error)


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

    @contextlib.asynccontextmanager
    async def _lines(self, path: str, body: Mapping[str, Any]) -> AsyncIterator[AsyncIterator[str]]:
        """POST ``body`` as JSON; the answer's lines (an error status raises
        :class:`~localllm.APIError` with the server's message)."""
        async with self.http.stream("POST", path, json=body) as response:
            if response.status_code >= 400:
                await response.aread()
                try:
                    error = response.json().get("error")
                    message = error.get("message") if isinstance(error, Mapping) else error
                except (ValueError, AttributeError):
                    message = None
                raise APIError(response.status_code, str(message or response.text[:200]).strip())
            yield response.aiter_lines()


class OllamaDriver(_HttpDriver):
    """An Ollama-compatible server: ``/api/generate`` (raw, streamed NDJSON)."""

    kind = "ollama"

    async def complete(self, request: Completion, on_text: TextSink) -> Final:
        """See :meth:`Driver.complete`."""
        body = {
            "model": request.model,
            "prompt": request.prompt,
            "raw": True,
            "stream": True,
            "options": _ollama_options(request),
        }
        final = Final()
        async with self._lines("/api/generate", body) as lines:
            async for line in lines:
                if not line.strip():
                    continue
                chunk = json.loads(line)
                if chunk.get("error"):
                    raise APIError(500, str(chunk["error"]))
                if chunk.get("response"):
                    on_text(chunk["response"])
                if chunk.get("done"):
                    final = ollama_final(chunk)
        return final


class OpenAIDriver(_HttpDriver):
    """An OpenAI-compatible server: ``/v1/completions`` streamed as SSE, with usage."""

    kind = "openai"

    async def complete(self, request: Completion, on_text: TextSink) -> Final:
        """See :meth:`Driver.complete`; ``options`` (Ollama's names) are not sent: the
        OpenAI API has no equivalent for most of them."""
        body = {**self.stream_body(request), "prompt": request.prompt}
        return await self.stream("/v1/completions", body, on_text)

    @staticmethod
    def stream_body(request: Completion) -> dict[str, Any]:
        """The fields of a greedy streamed request with usage, but its prompt or messages."""
        return {
            "model": request.model,
            "max_tokens": request.max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }

    async def stream(self, path: str, body: Mapping[str, Any], on_text: TextSink) -> Final:
        """POST a streamed request to ``path`` (completions or chat completions): each
        choice's text or content delta goes to ``on_text``; returns the server's figures."""
        final = Final()
        async with self._lines(path, body) as lines:
            async for line in lines:
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                data = json.loads(payload)
                if data.get("error"):
                    raise APIError(500, _error_text(data["error"]))
                for choice in data.get("choices") or []:
                    text = choice.get("text") or (choice.get("delta") or {}).get("content")
                    if text:
                        on_text(text)
                openai_final(data, final)
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
