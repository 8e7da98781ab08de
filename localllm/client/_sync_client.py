"""The daemon's client, synchronous: :class:`Client`, the twin of
:class:`~localllm.client.AsyncClient` (same constructor, same methods; streaming methods are
iterators).

Written by ``python -m localllm.client._unasync`` from ``_async_client.py``: do not edit this
file; change that one and run the command (a test fails while this file is stale).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._exceptions import APIError, DaemonUnavailableError
from ..settings import Settings
from ._core import (
    CUT_SHORT,
    HUB_TIMEOUT,
    NO_READ_TIMEOUT,
    PROBE_TIMEOUT,
    Config,
    Endpoint,
    Request,
    Response,
    Timeout,
    TransportError,
    digest_of,
    error_message,
    file_chunks,
    is_localllm,
    other_server,
    parse_ndjson,
    parse_sse,
    payload,
    search_path,
)
from ._sync_transport import SyncTransport, in_thread, sleep

if TYPE_CHECKING:  # annotations only; defining the typed dicts costs the CLI's start
    from ._types import (
        ChatChunk,
        ChatMessage,
        EmbedResponse,
        GenerateChunk,
        LoadedModelInfo,
        ModelSummary,
        ProgressLine,
        ShowResponse,
        StatsSnapshot,
        Think,
    )

__all__ = ["Client"]


class Client:
    """A client for every daemon route.

    By default it reads ``LOCALLLM_*`` settings and finds the daemon itself: its Unix socket,
    or the TCP address when the socket does not answer (the socket's place depends on
    ``XDG_RUNTIME_DIR`` when ``LOCALLLM_HOME`` is unset), TCP first when ``LOCALLLM_HOST`` is
    set; and ``LOCALLLM_API_KEY``. ``base_url`` fixes TCP to that URL, ``socket_path`` a
    socket, ``use_tcp=True`` TCP to ``settings.host`` and ``use_tcp=False`` the settings'
    socket. ``timeout`` (seconds) bounds the non-streaming management calls; generation has
    no read timeout.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        base_url: str | None = None,
        socket_path: str | Path | None = None,
        use_tcp: bool | None = None,
        api_key: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        self._config = Config(settings, base_url, socket_path, use_tcp, api_key, timeout)
        self._transport = SyncTransport(self._config.headers)

    @property
    def address(self) -> str:
        """The socket path or URL this client talks to (the first it tries, until one has
        answered)."""
        return self._config.current.address

    def close(self) -> None:
        """Close the connections."""
        self._transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- transport -----------------------------------------------------------------------

    def _endpoint(self) -> Endpoint:
        """Where requests go: found by :meth:`is_running` the first time."""
        if self._config.endpoint is None and not self.is_running():
            raise self._config.unavailable("nothing answered")
        assert self._config.endpoint is not None
        return self._config.endpoint

    def _request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        timeout: Timeout | None = None,
        content: Any = None,
    ) -> Response:
        endpoint = self._endpoint()
        request = Request.build(
            method,
            path,
            timeout if timeout is not None else self._config.timeout,
            json_body=body,
            content=content,
        )
        with self._config.errors(endpoint):
            response = self._transport.request(endpoint, request)
        if response.status_code >= 400:
            raise APIError(
                response.status_code, error_message(response.status_code, response.content)
            )
        return response

    def _json(
        self, method: str, path: str, body: Any = None, *, timeout: Timeout | None = None
    ) -> Any:
        response = self._request(method, path, body, timeout=timeout)
        with self._config.errors(self._config.current):
            return response.json()

    def _stream(
        self,
        method: str,
        path: str,
        body: Any,
        parse: Callable[[str], Any],
        params: Mapping[str, Any] | None = None,
    ) -> Iterator[Any]:
        endpoint = self._endpoint()
        request = Request.build(method, path, NO_READ_TIMEOUT, json_body=body, params=params)
        with self._config.errors(endpoint):
            yield from self._items(endpoint, request, parse)

    def _items(
        self, endpoint: Endpoint, request: Request, parse: Callable[[str], Any]
    ) -> Iterator[Any]:
        """A streamed answer's items: each line as ``parse`` reads it, blank ones left out."""
        with self._transport.stream(endpoint, request) as response:
            if response.status_code >= 400:
                content = response.read()
                raise APIError(response.status_code, error_message(response.status_code, content))
            for line in response.lines():
                try:
                    item = parse(line)
                except StopIteration:
                    return
                if item is not None:
                    yield item

    def _answer(self, path: str, body: Any) -> Iterator[Any]:
        """An answer's chunks; a stream that ends before the one marked ``done`` is an error,
        not a short answer."""
        done = False
        for item in self._stream("POST", path, body, parse_ndjson):
            done = done or bool(item.get("done"))
            yield item
        if not done:
            raise DaemonUnavailableError(CUT_SHORT)

    # -- daemon --------------------------------------------------------------------------

    def is_running(self) -> bool:
        """True when a localllm daemon answers (never raises).

        When the client finds the daemon itself, this is where it looks: the endpoint that
        answered last, then the others in order; later calls use the one that answered.
        """
        request = Request.build("GET", "/", PROBE_TIMEOUT)
        for endpoint in self._config.probe_order():
            try:
                response = self._transport.request(endpoint, request)
            except TransportError:
                continue
            if is_localllm(response):
                self._config.found(endpoint)
                return True
        self._config.found(None)
        return False

    def identify(self) -> str | None:
        """Who answers at this client's first address: None for a localllm daemon, otherwise
        what answered instead, in a few words (``GET / answered HTTP 200: 'Ollama is
        running'``). Raises :class:`~localllm.DaemonUnavailableError` when nothing answers
        (connection refused, no such host, timeout)."""
        endpoint = self._config.current
        with self._config.errors(endpoint):
            response = self._transport.request(endpoint, Request.build("GET", "/", PROBE_TIMEOUT))
        return other_server(response)

    def wait_ready(self, timeout: float = 30.0, interval: float = 0.05) -> bool:
        """Wait until a daemon answers (after starting one); False if none did in time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.is_running():
                return True
            sleep(interval)
        return self.is_running()

    def version(self) -> str:
        """The daemon's own version (``localllm_version`` when the daemon gives an
        Ollama-compatible ``version`` next to it)."""
        data = self._json("GET", "/api/version")
        return str(data.get("localllm_version") or data["version"])

    # -- models --------------------------------------------------------------------------

    def list_models(self) -> list[ModelSummary]:
        """Models in the store, newest first (``/api/tags``)."""
        data = self._json("GET", "/api/tags")
        return list(data["models"])

    def show(self, model: str, *, verbose: bool = False) -> ShowResponse:
        """A model's Modelfile, parameters, template, details, metadata, capabilities."""
        return self._json("POST", "/api/show", {"model": model, "verbose": verbose})

    def ps(self) -> list[LoadedModelInfo]:
        """Loaded models."""
        data = self._json("GET", "/api/ps")
        return list(data["models"])

    def plan(self, model: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
        """The memory plan of ``model`` on the daemon's machine (``/api/plan``): ``plan``
        when it fits, else ``refusal``, the sentence a load would be refused with."""
        body: dict[str, Any] = {"model": model}
        if options:
            body["options"] = options
        data = self._json("POST", "/api/plan", body)
        return dict(data)

    def speed(self, model: str) -> dict[str, Any]:
        """A stored model's ``predicted`` and ``measured`` tokens/s (``/api/speed``)."""
        return dict(self._json("POST", "/api/speed", {"model": model}))

    def search(
        self, query: str, *, sort: str = "downloads", limit: int = 20, cursor: str | None = None
    ) -> dict[str, Any]:
        """GGUF models on the Hugging Face Hub (``/api/search``, localllm's own): ``models``
        (``name``, downloads, likes, parameters...) and the ``next_cursor`` of the next page."""
        path = search_path(query, sort, limit, cursor)
        return dict(self._json("GET", path, timeout=HUB_TIMEOUT))

    def hub_show(self, model: str) -> dict[str, Any]:
        """A Hub repository's quantizations on the daemon's machine before any download
        (``/api/hub/show``): size, fit, context and predicted speed of each."""
        body = {"model": model}
        return dict(self._json("POST", "/api/hub/show", body, timeout=HUB_TIMEOUT))

    def copy(self, source: str, destination: str) -> None:
        """Give ``source`` a second name."""
        self._request("POST", "/api/copy", {"source": source, "destination": destination})

    def delete(self, model: str) -> None:
        """Remove a model (unloading it first)."""
        self._request("DELETE", "/api/delete", {"model": model})

    def prune(self) -> dict[str, Any]:
        """Remove what no model uses from the daemon's store (``/api/prune``, a localllm
        extension); the report says what went and ``freed`` bytes."""
        return dict(self._json("POST", "/api/prune", {}))

    def pull(
        self, model: str, *, insecure: bool = False, quantize: str | None = None
    ) -> Iterator[ProgressLine]:
        """Download a model; yields Ollama's progress lines up to ``{"status": "success"}``.
        Leaving the iteration early cancels the pull. ``quantize`` (a localllm extension)
        stores it quantized, never as downloaded."""
        body = payload({"model": model, "insecure": insecure, "quantize": quantize})
        yield from self._stream("POST", "/api/pull", body, parse_ndjson)

    def create(
        self,
        model: str,
        *,
        from_: str | None = None,
        files: dict[str, str] | None = None,
        template: str | None = None,
        system: str | None = None,
        parameters: dict[str, Any] | None = None,
        messages: Sequence[ChatMessage] | None = None,
        license: str | list[str] | None = None,
        quantize: str | None = None,
        allow_requantize: bool | None = None,
        draft: str | None = None,
        adapters: dict[str, Any] | None = None,
    ) -> Iterator[ProgressLine]:
        """Create a model from another (``from_``), a GGUF path the daemon can read
        (``from_``), or uploaded blobs (``files``: name → digest); yields status lines.
        ``adapters`` (Modelfile ``ADAPTER``): file name → a blob digest, a GGUF path the
        daemon can read, or ``{"from": ..., "scale": 0.5}``.
        ``allow_requantize`` (a localllm extension) lets ``quantize`` start from an already
        quantized model. ``draft`` (a localllm extension: Modelfile ``DRAFT``) names the
        draft model: a model, a GGUF path the daemon can read, or an uploaded blob's digest."""
        body = payload(locals())
        yield from self._stream("POST", "/api/create", body, parse_ndjson)

    def blob_exists(self, digest: str) -> bool:
        """True if the daemon's store holds the blob."""
        try:
            self._request("HEAD", f"/api/blobs/{digest}")
        except APIError as exc:
            if exc.status_code == 404:
                return False
            raise
        return True

    def upload_blob(self, path: str | Path) -> str:
        """Upload a file as a blob (skipped when already there); returns its digest."""
        path = Path(path)
        digest = in_thread(digest_of, path)
        if not self.blob_exists(digest):
            self._request(
                "POST", f"/api/blobs/{digest}", content=file_chunks(path), timeout=NO_READ_TIMEOUT
            )
        return digest

    # -- generation ----------------------------------------------------------------------

    def generate(
        self,
        model: str,
        prompt: str = "",
        *,
        suffix: str | None = None,
        system: str | None = None,
        template: str | None = None,
        raw: bool | None = None,
        format: str | dict[str, Any] | None = None,
        options: Mapping[str, Any] | None = None,
        keep_alive: str | float | None = None,
        think: Think | None = None,
        images: Sequence[str | bytes] | None = None,
    ) -> GenerateChunk:
        """A whole completion (``/api/generate`` without streaming)."""
        body = payload(locals(), stream=False)
        return self._json("POST", "/api/generate", body, timeout=NO_READ_TIMEOUT)

    def generate_stream(
        self,
        model: str,
        prompt: str = "",
        *,
        suffix: str | None = None,
        system: str | None = None,
        template: str | None = None,
        raw: bool | None = None,
        format: str | dict[str, Any] | None = None,
        options: Mapping[str, Any] | None = None,
        keep_alive: str | float | None = None,
        think: Think | None = None,
        images: Sequence[str | bytes] | None = None,
    ) -> Iterator[GenerateChunk]:
        """A completion streamed chunk by chunk; the last chunk has ``done`` and timings.
        Leaving the iteration early stops the generation in the daemon."""
        yield from self._answer("/api/generate", payload(locals(), stream=True))

    def chat(
        self,
        model: str,
        messages: Sequence[ChatMessage],
        *,
        format: str | dict[str, Any] | None = None,
        options: Mapping[str, Any] | None = None,
        keep_alive: str | float | None = None,
        think: Think | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> ChatChunk:
        """A whole chat answer (``/api/chat`` without streaming); ``tools`` (functions in the
        chat API's shape) may be called: the answer's ``message.tool_calls``."""
        body = payload(locals(), stream=False)
        return self._json("POST", "/api/chat", body, timeout=NO_READ_TIMEOUT)

    def chat_stream(
        self,
        model: str,
        messages: Sequence[ChatMessage],
        *,
        format: str | dict[str, Any] | None = None,
        options: Mapping[str, Any] | None = None,
        keep_alive: str | float | None = None,
        think: Think | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> Iterator[ChatChunk]:
        """A chat answer streamed chunk by chunk; the last chunk has ``done`` and timings.
        Leaving the iteration early stops the generation in the daemon. With ``tools``, each
        call the model makes arrives whole in a chunk's ``message.tool_calls``."""
        yield from self._answer("/api/chat", payload(locals(), stream=True))

    def load(
        self,
        model: str,
        *,
        options: Mapping[str, Any] | None = None,
        keep_alive: str | float | None = None,
    ) -> GenerateChunk:
        """Load a model without generating (an empty prompt); ``options`` are those the
        requests that follow will send (the ones that shape the load, ``num_ctx`` say, then
        find it loaded as they want it)."""
        body = payload(locals(), stream=False)
        return self._json("POST", "/api/generate", body, timeout=NO_READ_TIMEOUT)

    def unload(self, model: str) -> GenerateChunk:
        """Unload a model now (or once its running requests end)."""
        body = {"model": model, "keep_alive": 0, "stream": False}
        return self._json("POST", "/api/generate", body, timeout=NO_READ_TIMEOUT)

    def embed(
        self,
        model: str,
        input_: str | Sequence[str],
        *,
        truncate: bool | None = None,
        dimensions: int | None = None,
        options: Mapping[str, Any] | None = None,
        keep_alive: str | float | None = None,
    ) -> EmbedResponse:
        """Normalised embeddings, one per input (``/api/embed``)."""
        body = payload(locals())
        return self._json("POST", "/api/embed", body, timeout=NO_READ_TIMEOUT)

    def embeddings(self, model: str, prompt: str) -> list[float]:
        """One embedding (the legacy ``/api/embeddings``)."""
        body = {"model": model, "prompt": prompt}
        data = self._json("POST", "/api/embeddings", body, timeout=NO_READ_TIMEOUT)
        return list(data["embedding"])

    # -- observability -------------------------------------------------------------------

    def stats(self) -> StatsSnapshot:
        """Every loaded model's slots, KV use, rates and recent requests, once."""
        return self._json("GET", "/api/stats")

    def stats_stream(self, interval: float = 0.25) -> Iterator[StatsSnapshot]:
        """:meth:`stats` every ``interval`` seconds until the iteration is left."""
        params = {"stream": "true", "interval": interval}
        yield from self._stream("GET", "/api/stats", None, parse_ndjson, params=params)

    def metrics(self) -> str:
        """The Prometheus exposition text."""
        response = self._request("GET", "/metrics")
        return response.text

    # -- OpenAI-compatible routes ------------------------------------------------------------

    def openai_models(self) -> list[dict[str, Any]]:
        """``GET /v1/models``."""
        data = self._json("GET", "/v1/models")
        return list(data["data"])

    def openai_model(self, model: str) -> dict[str, Any]:
        """``GET /v1/models/{model}``."""
        return self._json("GET", f"/v1/models/{model}")

    def openai_chat(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /v1/chat/completions`` (``stream`` forced off)."""
        data = {**body, "stream": False}
        return self._json("POST", "/v1/chat/completions", data, timeout=NO_READ_TIMEOUT)

    def openai_chat_stream(self, body: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        """``POST /v1/chat/completions`` streamed: the SSE chunks, without ``[DONE]``."""
        data = {**body, "stream": True}
        yield from self._stream("POST", "/v1/chat/completions", data, parse_sse)

    def openai_completion(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /v1/completions`` (``stream`` forced off)."""
        data = {**body, "stream": False}
        return self._json("POST", "/v1/completions", data, timeout=NO_READ_TIMEOUT)

    def openai_completion_stream(self, body: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        """``POST /v1/completions`` streamed."""
        data = {**body, "stream": True}
        yield from self._stream("POST", "/v1/completions", data, parse_sse)

    def openai_embeddings(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /v1/embeddings``."""
        return self._json("POST", "/v1/embeddings", dict(body), timeout=NO_READ_TIMEOUT)
