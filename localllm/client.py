"""The one client for the localllm daemon, synchronous (:class:`Client`) and asynchronous
(:class:`AsyncClient`), used by the CLI and the terminal UI alike.

It finds the daemon by itself: its Unix socket, then its TCP address (where the socket's place
depends on ``XDG_RUNTIME_DIR``, i.e. without ``LOCALLLM_HOME``), taking the first that answers
as localllm; TCP first when ``LOCALLLM_HOST`` is set. ``base_url=``, ``socket_path=`` or
``use_tcp=`` fix one transport instead. Every daemon route has a method;
streaming methods yield parsed chunks as they arrive, and leaving such an iteration early
closes the connection, which cancels the request in the daemon::

    from localllm.client import Client

    with Client() as client:
        for chunk in client.chat_stream("smollm2:135m", [{"role": "user", "content": "Hi"}]):
            print(chunk["message"]["content"], end="", flush=True)
        print(chunk["ttft_duration"] / 1e6, "ms to the first token")

Errors, and no others from the transport (one mapping, :meth:`_Config.errors`, serves every
path): :class:`~localllm.DaemonUnavailableError` when no daemon answers or the connection drops
(also in the middle of a stream), its subclass :class:`~localllm.DaemonTimeoutError` when the
daemon does not answer in time, :class:`~localllm.APIError` with ``status_code`` and the
daemon's message otherwise (also for an error reported in the middle of a stream).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import ipaddress
import json
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypedDict

import httpx

from ._exceptions import APIError, DaemonTimeoutError, DaemonUnavailableError
from ._transport import async_transport
from .settings import Settings

__all__ = [
    "AsyncClient",
    "ChatChunk",
    "ChatMessage",
    "Client",
    "EmbedResponse",
    "GatewayClient",
    "GenerateChunk",
    "LoadedModelInfo",
    "ModelDetails",
    "ModelSummary",
    "ProgressLine",
    "ShowResponse",
    "StatsSnapshot",
    "Think",
]


Think = bool | Literal["low", "medium", "high", "max"]
"""``think`` on :meth:`Client.chat` and :meth:`Client.generate`: reasoning on or off, or its
level (``True`` is medium); not sending it (``None``) leaves the model's default. A model
whose template does not reason refuses anything but off with :class:`~localllm.APIError`
(400, ``"<model>" does not support thinking``)."""


# -- response shapes -------------------------------------------------------------------------


class ModelDetails(TypedDict, total=False):
    """``details`` of a model."""

    parent_model: str
    format: str
    family: str
    families: list[str] | None
    parameter_size: str
    quantization_level: str


class ModelSummary(TypedDict, total=False):
    """One entry of :meth:`Client.list_models`."""

    name: str
    model: str
    modified_at: str
    size: int
    digest: str
    details: ModelDetails


class LoadedModelInfo(TypedDict, total=False):
    """One entry of :meth:`Client.ps`; ``slots``, ``active_requests``, ``queued_requests``,
    ``runner_pid``, ``devices`` and ``rpc_dropped`` are localllm's additions."""

    name: str
    model: str
    size: int
    size_vram: int
    digest: str
    details: ModelDetails
    expires_at: str
    context_length: int
    slots: int
    active_requests: int
    queued_requests: int
    runner_pid: int
    loaded_at: str
    devices: list[dict[str, Any]]
    """For a model split across RPC workers: each device (``name``, ``kind``, ``endpoint``,
    ``layers``, ``first_layer``, ``output``, ``free``, ``total``), the local CPU first."""
    rpc_dropped: list[str]
    """Workers lost mid-request that this load went without."""
    pinned: bool


class ShowResponse(TypedDict, total=False):
    """:meth:`Client.show`."""

    license: str
    modelfile: str
    parameters: str
    template: str
    system: str
    details: ModelDetails
    model_info: dict[str, Any]
    capabilities: list[str]
    modified_at: str
    messages: list[dict[str, Any]]
    projector_info: dict[str, Any]
    """A vision model's projector GGUF metadata."""


class ChatMessage(TypedDict, total=False):
    """A chat message."""

    role: str
    content: str
    thinking: str
    """An answer's reasoning (sent back in the history as Ollama's CLI does)."""
    images: list[str]
    """Standard base64 of each image file's bytes (needs a model with vision)."""


class _Final(TypedDict, total=False):
    done: bool
    done_reason: str
    total_duration: int
    load_duration: int
    prompt_eval_count: int
    prompt_eval_duration: int
    eval_count: int
    eval_duration: int
    ttft_duration: int
    queue_duration: int
    prompt_cached_count: int
    prompt_evaluated_count: int
    prompt_eval_rate: float
    eval_rate: float


class GenerateChunk(_Final, total=False):
    """A chunk of :meth:`Client.generate_stream`; the last (``done``) one has the timings:
    Ollama's nanosecond fields plus ``ttft_duration``, ``prompt_cached_count``,
    ``prompt_eval_rate`` and ``eval_rate``."""

    model: str
    created_at: str
    response: str
    thinking: str


class ChatChunk(_Final, total=False):
    """A chunk of :meth:`Client.chat_stream` (same timing fields as :class:`GenerateChunk`)."""

    model: str
    created_at: str
    message: ChatMessage


class ProgressLine(TypedDict, total=False):
    """A status line of :meth:`Client.pull` or :meth:`Client.create`."""

    status: str
    digest: str
    total: int
    completed: int


class EmbedResponse(TypedDict, total=False):
    """:meth:`Client.embed`."""

    model: str
    embeddings: list[list[float]]
    total_duration: int
    load_duration: int
    prompt_eval_count: int


class StatsSnapshot(TypedDict, total=False):
    """:meth:`Client.stats`: each loaded model's slots, KV use and rates, and the queue."""

    time: float
    queue_depth: int
    max_queue: int
    models: list[dict[str, Any]]


# -- shared plumbing ---------------------------------------------------------------------------

_RENAMES = {"from_": "from", "input_": "input"}


def _payload(values: Mapping[str, Any], **fixed: Any) -> dict[str, Any]:
    """A JSON body from a method's arguments: ``self`` and None values dropped."""
    body = {_RENAMES.get(k, k): v for k, v in values.items() if k != "self" and v is not None}
    if "images" in body:
        # Image files' bytes travel as standard base64, as Ollama's API carries them.
        body["images"] = [
            base64.b64encode(i).decode("ascii") if isinstance(i, bytes) else i
            for i in body["images"]
        ]
    body.update(fixed)
    return body


def _search_params(query: str, sort: str, limit: int, cursor: str | None) -> dict[str, Any]:
    params: dict[str, Any] = {"q": query, "sort": sort, "limit": limit}
    if cursor:
        params["cursor"] = cursor
    return params


def _error_message(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return response.text.strip() or f"HTTP {response.status_code}"
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        return str(error.get("message") or error)
    if error:
        return str(error)
    return response.text.strip() or f"HTTP {response.status_code}"


def _check_line(data: Any) -> Any:
    if isinstance(data, dict) and "error" in data and len(data) <= 2:
        error = data["error"]
        message = error.get("message", str(error)) if isinstance(error, dict) else str(error)
        raise APIError(500, message)
    return data


def _parse_ndjson(line: str) -> Any | None:
    line = line.strip()
    return _check_line(json.loads(line)) if line else None


_CUT_SHORT = "the daemon's answer stream ended before its final chunk (the connection closed)"


def _until_done(chunks: Iterator[Any]) -> Iterator[Any]:
    """An answer's chunks; a stream that ends before the one marked ``done`` is an error,
    not a short answer."""
    done = False
    for chunk in chunks:
        done = done or bool(chunk.get("done"))
        yield chunk
    if not done:
        raise DaemonUnavailableError(_CUT_SHORT)


def _parse_sse(line: str) -> Any | None:
    """The JSON of one ``data:`` line, ``None`` for anything else; ``[DONE]`` → StopIteration."""
    if not line.startswith("data:"):
        return None
    text = line[5:].strip()
    if text == "[DONE]":
        raise StopIteration
    return _check_line(json.loads(text))


def _digest_of(path: Path) -> str:
    hasher = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            hasher.update(chunk)
    return f"sha256:{hasher.hexdigest()}"


def _file_chunks(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as handle:
        yield from iter(lambda: handle.read(1 << 20), b"")


async def _afile_chunks(path: Path) -> AsyncIterator[bytes]:
    for chunk in _file_chunks(path):
        yield chunk


@dataclass(frozen=True)
class _Endpoint:
    """One way to reach a daemon: its Unix socket (``uds``) or a TCP ``base_url``."""

    uds: str | None
    base_url: str

    @property
    def address(self) -> str:
        return self.uds or self.base_url

    def describe(self) -> str:
        return f"socket {self.uds}" if self.uds else self.base_url


def _socket_endpoint(path: str | Path) -> _Endpoint:
    return _Endpoint(str(path), "http://localhost")


def _is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


def _candidates(
    settings: Settings,
    base_url: str | None,
    socket_path: str | Path | None,
    use_tcp: bool | None,
) -> tuple[_Endpoint, ...]:
    """Where to look for the daemon, in order; one entry when the caller fixed the transport.

    Without ``LOCALLLM_HOST`` the socket comes first, then the TCP address, but the TCP
    address only when the socket's place depends on the environment (no ``LOCALLLM_HOME``:
    ``XDG_RUNTIME_DIR`` differs between desktop, ssh, sudo and cron). With ``LOCALLLM_HOME``
    the socket of that home is its daemon, and whatever answers on the default port may serve
    another home. With ``LOCALLLM_HOST`` TCP comes first, then this home's socket when that
    host is this machine.
    """
    if base_url is not None:
        return (_Endpoint(None, base_url.rstrip("/")),)
    if socket_path is not None:
        return (_socket_endpoint(socket_path),)
    tcp = _Endpoint(None, settings.base_url)
    socket = _socket_endpoint(settings.socket_path)
    if use_tcp is not None:
        return (tcp,) if use_tcp else (socket,)
    if settings.host_from_env:
        return (tcp, socket) if _is_loopback(settings.bind_host) else (tcp,)
    return (socket, tcp) if settings.home is None else (socket,)


def _is_localllm(response: httpx.Response) -> bool:
    """True for the answer of a localllm daemon's ``GET /``.

    That route answers "localllm is running" without an API key (Ollama's answers "Ollama is
    running"): it tells our daemon from another server on the same port whatever ``version``
    says in ``/api/version``.
    """
    return response.status_code == 200 and response.text.startswith(_IDENTITY)


def _other_server(response: httpx.Response) -> str | None:
    """None for a localllm daemon's ``GET /`` answer, else what answered, in a few words."""
    if _is_localllm(response):
        return None
    text = " ".join(response.text.split())
    excerpt = repr(text[:60] + ("..." if len(text) > 60 else ""))
    return f"GET / answered HTTP {response.status_code}: {excerpt}"


_IDENTITY = "localllm"
_PROBE_TIMEOUT = httpx.Timeout(2.0)
# The daemon bounds each Hub request (LOCALLLM_HUB_TIMEOUT); a first look at a repository may
# also wait for the speed probe (seconds, once per machine).
_HUB_TIMEOUT = httpx.Timeout(180.0, connect=5.0)


class _Config:
    """Where and how to reach the daemon, and what went wrong when it cannot be (both clients).

    ``candidates`` are the endpoints to try in order; with more than one, the first that
    answers as localllm becomes ``endpoint`` (see :meth:`Client.is_running`), and a failed
    connection forgets it so that the next call looks again.
    """

    def __init__(
        self,
        settings: Settings | None,
        base_url: str | None,
        socket_path: str | Path | None,
        use_tcp: bool | None,
        api_key: str | None,
        timeout: float,
    ) -> None:
        settings = settings if settings is not None else Settings.from_env()
        self.candidates = _candidates(settings, base_url, socket_path, use_tcp)
        self.discovers = len(self.candidates) > 1
        self.endpoint: _Endpoint | None = None if self.discovers else self.candidates[0]
        key = api_key if api_key is not None else settings.api_key
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.timeout = httpx.Timeout(timeout, connect=5.0)

    @property
    def current(self) -> _Endpoint:
        """The endpoint in use, or the first one to try while none has answered yet."""
        return self.endpoint or self.candidates[0]

    def probe_order(self) -> list[_Endpoint]:
        """The endpoint in use first (it answered last time), then the others."""
        first = [self.endpoint] if self.endpoint is not None else []
        return first + [c for c in self.candidates if c != self.endpoint]

    def found(self, endpoint: _Endpoint | None) -> None:
        """Record the endpoint that answered (None: none did)."""
        if self.discovers:
            self.endpoint = endpoint

    def unavailable(self, reason: str) -> DaemonUnavailableError:
        where = " or ".join(c.describe() for c in self.candidates)
        return DaemonUnavailableError(
            f"no localllm daemon answers at {where} ({reason}); start one with `localllm serve`"
        )

    @contextlib.contextmanager
    def errors(self, endpoint: _Endpoint) -> Iterator[None]:
        """Turn whatever httpx raises while talking to ``endpoint`` (connecting, sending,
        reading, in the middle of a stream too) into the documented errors: the one place
        that does. :class:`~localllm.DaemonTimeoutError` (a
        :class:`~localllm.DaemonUnavailableError`) when it does not answer in time,
        :class:`~localllm.DaemonUnavailableError` when it cannot be reached or the connection
        drops, :class:`~localllm.APIError` for an answer that cannot be read."""
        where = endpoint.describe()
        try:
            yield
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            self.found(None)  # the daemon went away, or moved: look again next time
            raise self.unavailable(exc.__class__.__name__) from exc
        except httpx.TimeoutException as exc:  # read, write, pool
            raise DaemonTimeoutError(
                f"the localllm daemon at {where} did not answer in time ({exc.__class__.__name__})"
            ) from exc
        except httpx.TransportError as exc:  # read/write errors, protocol errors, ...
            detail = str(exc) or exc.__class__.__name__
            raise DaemonUnavailableError(
                f"lost the connection to the localllm daemon at {where} ({detail})"
            ) from exc
        except httpx.HTTPError as exc:  # undecodable content, redirects
            raise APIError(
                502, f"unreadable answer from the localllm daemon at {where} ({exc})"
            ) from exc
        except json.JSONDecodeError as exc:
            raise APIError(
                502, f"the localllm daemon at {where} answered with invalid JSON ({exc})"
            ) from exc


# Generation can wait minutes for a model to load and then stream for long: no read timeout.
_NO_READ_TIMEOUT = httpx.Timeout(None, connect=5.0)


# -- synchronous client ------------------------------------------------------------------------


class Client:
    """Synchronous client for every daemon route.

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
        self._config = _Config(settings, base_url, socket_path, use_tcp, api_key, timeout)
        self._pools: dict[_Endpoint, httpx.Client] = {}

    @property
    def address(self) -> str:
        """The socket path or URL this client talks to (the first it tries, until one has
        answered)."""
        return self._config.current.address

    def close(self) -> None:
        """Close the connection pools."""
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- transport -----------------------------------------------------------------------

    def _http(self, endpoint: _Endpoint) -> httpx.Client:
        pool = self._pools.get(endpoint)
        if pool is None:
            transport = httpx.HTTPTransport(uds=endpoint.uds) if endpoint.uds else None
            pool = self._pools[endpoint] = httpx.Client(
                base_url=endpoint.base_url,
                transport=transport,
                headers=self._config.headers,
                timeout=self._config.timeout,
            )
        return pool

    def _endpoint(self) -> _Endpoint:
        """Where requests go: found by :meth:`is_running` the first time."""
        if self._config.endpoint is None and not self.is_running():
            raise self._config.unavailable("nothing answered")
        assert self._config.endpoint is not None
        return self._config.endpoint

    def _request(
        self, method: str, path: str, body: Any = None, *, timeout: Any = None, **kwargs: Any
    ) -> httpx.Response:
        endpoint = self._endpoint()
        with self._config.errors(endpoint):
            response = self._http(endpoint).request(
                method,
                path,
                json=body,
                timeout=timeout if timeout is not None else self._config.timeout,
                **kwargs,
            )
        if response.status_code >= 400:
            raise APIError(response.status_code, _error_message(response))
        return response

    def _json(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        response = self._request(method, path, body, **kwargs)
        with self._config.errors(self._config.current):
            return response.json()

    def _stream(
        self, method: str, path: str, body: Any, parse: Any, params: Any = None
    ) -> Iterator[Any]:
        endpoint = self._endpoint()
        with (
            self._config.errors(endpoint),
            self._http(endpoint).stream(
                method, path, json=body, params=params, timeout=_NO_READ_TIMEOUT
            ) as response,
        ):
            if response.status_code >= 400:
                response.read()
                raise APIError(response.status_code, _error_message(response))
            for line in response.iter_lines():
                try:
                    item = parse(line)
                except StopIteration:
                    return
                if item is not None:
                    yield item

    # -- daemon --------------------------------------------------------------------------

    def is_running(self) -> bool:
        """True when a localllm daemon answers (never raises).

        When the client finds the daemon itself, this is where it looks: the endpoint that
        answered last, then the others in order; later calls use the one that answered.
        """
        for endpoint in self._config.probe_order():
            try:
                response = self._http(endpoint).get("/", timeout=_PROBE_TIMEOUT)
            except httpx.HTTPError:
                continue
            if _is_localllm(response):
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
            response = self._http(endpoint).get("/", timeout=_PROBE_TIMEOUT)
        return _other_server(response)

    def wait_ready(self, timeout: float = 30.0, interval: float = 0.05) -> bool:
        """Wait until a daemon answers (after starting one); False if none did in time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.is_running():
                return True
            time.sleep(interval)
        return self.is_running()

    def version(self) -> str:
        """The daemon's own version (``localllm_version`` when the daemon gives an
        Ollama-compatible ``version`` next to it)."""
        data = self._json("GET", "/api/version")
        return str(data.get("localllm_version") or data["version"])

    # -- models --------------------------------------------------------------------------

    def list_models(self) -> list[ModelSummary]:
        """Models in the store, newest first (``/api/tags``)."""
        return list(self._json("GET", "/api/tags")["models"])

    def show(self, model: str, *, verbose: bool = False) -> ShowResponse:
        """A model's Modelfile, parameters, template, details, metadata, capabilities."""
        return self._json("POST", "/api/show", {"model": model, "verbose": verbose})

    def ps(self) -> list[LoadedModelInfo]:
        """Loaded models."""
        return list(self._json("GET", "/api/ps")["models"])

    def plan(self, model: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
        """The memory plan of ``model`` on the daemon's machine (``/api/plan``): ``plan``
        when it fits, else ``refusal``, the sentence a load would be refused with."""
        body: dict[str, Any] = {"model": model}
        if options:
            body["options"] = options
        return dict(self._json("POST", "/api/plan", body))

    def search(
        self, query: str, *, sort: str = "downloads", limit: int = 20, cursor: str | None = None
    ) -> dict[str, Any]:
        """GGUF models on the Hugging Face Hub (``/api/search``, localllm's own): ``models``
        (``name``, downloads, likes, parameters...) and the ``next_cursor`` of the next page."""
        params = _search_params(query, sort, limit, cursor)
        return dict(self._json("GET", "/api/search", params=params, timeout=_HUB_TIMEOUT))

    def speed(self, model: str) -> dict[str, Any]:
        """A stored model's ``predicted`` and ``measured`` tokens/s (``/api/speed``)."""
        return dict(self._json("POST", "/api/speed", {"model": model}))

    def hub_show(self, model: str) -> dict[str, Any]:
        """A Hub repository's quantizations on the daemon's machine before any download
        (``/api/hub/show``): size, fit, context and predicted speed of each."""
        return dict(self._json("POST", "/api/hub/show", {"model": model}, timeout=_HUB_TIMEOUT))

    def copy(self, source: str, destination: str) -> None:
        """Give ``source`` a second name."""
        self._request("POST", "/api/copy", {"source": source, "destination": destination})

    def delete(self, model: str) -> None:
        """Remove a model (unloading it first)."""
        self._request("DELETE", "/api/delete", {"model": model})

    def pull(self, model: str, *, insecure: bool = False) -> Iterator[ProgressLine]:
        """Download a model; yields Ollama's progress lines up to ``{"status": "success"}``."""
        yield from self._stream(
            "POST", "/api/pull", _payload({"model": model, "insecure": insecure}), _parse_ndjson
        )

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
    ) -> Iterator[ProgressLine]:
        """Create a model from another (``from_``), a GGUF path the daemon can read
        (``from_``), or uploaded blobs (``files``: name → digest); yields status lines.
        ``allow_requantize`` (a localllm extension) lets ``quantize`` start from an already
        quantized model. ``draft`` (a localllm extension: Modelfile ``DRAFT``) names the
        draft model: a model, a GGUF path the daemon can read, or an uploaded blob's digest."""
        body = _payload(locals())
        yield from self._stream("POST", "/api/create", body, _parse_ndjson)

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
        digest = _digest_of(path)
        if not self.blob_exists(digest):
            self._request(
                "POST",
                f"/api/blobs/{digest}",
                content=_file_chunks(path),
                timeout=_NO_READ_TIMEOUT,
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
        body = _payload(locals(), stream=False)
        return self._json("POST", "/api/generate", body, timeout=_NO_READ_TIMEOUT)

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
        """A completion streamed chunk by chunk; the last chunk has ``done`` and timings."""
        body = _payload(locals(), stream=True)
        yield from _until_done(self._stream("POST", "/api/generate", body, _parse_ndjson))

    def chat(
        self,
        model: str,
        messages: Sequence[ChatMessage],
        *,
        format: str | dict[str, Any] | None = None,
        options: Mapping[str, Any] | None = None,
        keep_alive: str | float | None = None,
        think: Think | None = None,
    ) -> ChatChunk:
        """A whole chat answer (``/api/chat`` without streaming)."""
        body = _payload(locals(), stream=False)
        return self._json("POST", "/api/chat", body, timeout=_NO_READ_TIMEOUT)

    def chat_stream(
        self,
        model: str,
        messages: Sequence[ChatMessage],
        *,
        format: str | dict[str, Any] | None = None,
        options: Mapping[str, Any] | None = None,
        keep_alive: str | float | None = None,
        think: Think | None = None,
    ) -> Iterator[ChatChunk]:
        """A chat answer streamed chunk by chunk; the last chunk has ``done`` and timings."""
        body = _payload(locals(), stream=True)
        yield from _until_done(self._stream("POST", "/api/chat", body, _parse_ndjson))

    def load(self, model: str, *, keep_alive: str | float | None = None) -> GenerateChunk:
        """Load a model without generating (an empty prompt)."""
        body = _payload(locals(), stream=False)
        return self._json("POST", "/api/generate", body, timeout=_NO_READ_TIMEOUT)

    def unload(self, model: str) -> GenerateChunk:
        """Unload a model now (or once its running requests end)."""
        body = {"model": model, "keep_alive": 0, "stream": False}
        return self._json("POST", "/api/generate", body, timeout=_NO_READ_TIMEOUT)

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
        body = _payload(locals())
        return self._json("POST", "/api/embed", body, timeout=_NO_READ_TIMEOUT)

    def embeddings(self, model: str, prompt: str) -> list[float]:
        """One embedding (the legacy ``/api/embeddings``)."""
        body = {"model": model, "prompt": prompt}
        data = self._json("POST", "/api/embeddings", body, timeout=_NO_READ_TIMEOUT)
        return list(data["embedding"])

    # -- observability -------------------------------------------------------------------

    def stats(self) -> StatsSnapshot:
        """Every loaded model's slots, KV use, rates and recent requests, once."""
        return self._json("GET", "/api/stats")

    def stats_stream(self, interval: float = 0.25) -> Iterator[StatsSnapshot]:
        """:meth:`stats` every ``interval`` seconds until the iteration is left."""
        params = {"stream": "true", "interval": interval}
        yield from self._stream("GET", "/api/stats", None, _parse_ndjson, params=params)

    def metrics(self) -> str:
        """The Prometheus exposition text."""
        return self._request("GET", "/metrics").text

    # -- OpenAI-compatible routes ------------------------------------------------------------

    def openai_models(self) -> list[dict[str, Any]]:
        """``GET /v1/models``."""
        return list(self._json("GET", "/v1/models")["data"])

    def openai_model(self, model: str) -> dict[str, Any]:
        """``GET /v1/models/{model}``."""
        return self._json("GET", f"/v1/models/{model}")

    def openai_chat(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /v1/chat/completions`` (``stream`` forced off)."""
        return self._json(
            "POST", "/v1/chat/completions", {**body, "stream": False}, timeout=_NO_READ_TIMEOUT
        )

    def openai_chat_stream(self, body: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        """``POST /v1/chat/completions`` streamed: the SSE chunks, without ``[DONE]``."""
        yield from self._stream(
            "POST", "/v1/chat/completions", {**body, "stream": True}, _parse_sse
        )

    def openai_completion(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /v1/completions`` (``stream`` forced off)."""
        return self._json(
            "POST", "/v1/completions", {**body, "stream": False}, timeout=_NO_READ_TIMEOUT
        )

    def openai_completion_stream(self, body: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        """``POST /v1/completions`` streamed."""
        yield from self._stream("POST", "/v1/completions", {**body, "stream": True}, _parse_sse)

    def openai_embeddings(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /v1/embeddings``."""
        return self._json("POST", "/v1/embeddings", dict(body), timeout=_NO_READ_TIMEOUT)


# -- the gateway (smg) -------------------------------------------------------------------------


class GatewayClient:
    """The few calls localllm makes to the gateway that ``localllm gateway`` starts (the
    Shepherd Model Gateway's own routes, not a daemon's): whether it is ready, and its
    workers with their health and load. ``api_key`` is the gateway's (its ``--api-key``).

    Errors as for :class:`Client`: :class:`~localllm.DaemonUnavailableError` when nothing
    answers at ``base_url``, :class:`~localllm.APIError` for an error answer.
    """

    def __init__(self, base_url: str, *, api_key: str | None = None, timeout: float = 5.0) -> None:
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(
            base_url=self.base_url, headers=headers, timeout=httpx.Timeout(timeout)
        )

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> GatewayClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _get(self, path: str, *, accept: tuple[int, ...] = ()) -> Any:
        try:
            response = self._http.get(path)
            if response.status_code >= 400 and response.status_code not in accept:
                raise APIError(response.status_code, _error_message(response))
            return response.json()
        except httpx.TimeoutException as exc:
            raise DaemonTimeoutError(
                f"the gateway at {self.base_url} did not answer in time"
            ) from exc
        except httpx.HTTPError as exc:
            raise DaemonUnavailableError(
                f"no gateway answers at {self.base_url} ({exc.__class__.__name__}); "
                "start one with `localllm gateway --worker URL ...`"
            ) from exc
        except json.JSONDecodeError as exc:
            message = f"the gateway at {self.base_url} answered with invalid JSON"
            raise APIError(502, message) from exc

    def readiness(self) -> dict[str, Any]:
        """``GET /readiness``: ``status`` ("ready" once a worker is healthy, else
        "not_ready"), ``healthy_workers``, ``total_workers``."""
        return dict(self._get("/readiness", accept=(503,)))

    def workers(self) -> list[dict[str, Any]]:
        """``GET /workers``: each worker's ``url``, ``is_healthy``, ``status``, ``models``,
        ``load`` (requests the gateway has in flight there) and ``engine_load`` (what the
        worker last reported at ``/v1/loads``)."""
        return list(self._get("/workers").get("workers", []))


# -- asynchronous client -----------------------------------------------------------------------


class AsyncClient:
    """Asynchronous twin of :class:`Client` (same constructor, same methods, awaitable;
    streaming methods are async iterators)."""

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
        self._config = _Config(settings, base_url, socket_path, use_tcp, api_key, timeout)
        self._pools: dict[_Endpoint, httpx.AsyncClient] = {}

    @property
    def address(self) -> str:
        """The socket path or URL this client talks to (the first it tries, until one has
        answered)."""
        return self._config.current.address

    async def close(self) -> None:
        """Close the connection pools."""
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            await pool.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- transport -----------------------------------------------------------------------

    def _http(self, endpoint: _Endpoint) -> httpx.AsyncClient:
        pool = self._pools.get(endpoint)
        if pool is None:
            transport = async_transport(uds=endpoint.uds)
            pool = self._pools[endpoint] = httpx.AsyncClient(
                base_url=endpoint.base_url,
                transport=transport,
                headers=self._config.headers,
                timeout=self._config.timeout,
            )
        return pool

    async def _endpoint(self) -> _Endpoint:
        """Where requests go: found by :meth:`is_running` the first time."""
        if self._config.endpoint is None and not await self.is_running():
            raise self._config.unavailable("nothing answered")
        assert self._config.endpoint is not None
        return self._config.endpoint

    async def _request(
        self, method: str, path: str, body: Any = None, *, timeout: Any = None, **kwargs: Any
    ) -> httpx.Response:
        endpoint = await self._endpoint()
        with self._config.errors(endpoint):
            response = await self._http(endpoint).request(
                method,
                path,
                json=body,
                timeout=timeout if timeout is not None else self._config.timeout,
                **kwargs,
            )
        if response.status_code >= 400:
            raise APIError(response.status_code, _error_message(response))
        return response

    async def _json(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        response = await self._request(method, path, body, **kwargs)
        with self._config.errors(self._config.current):
            return response.json()

    async def _stream(
        self, method: str, path: str, body: Any, parse: Any, params: Any = None
    ) -> AsyncIterator[Any]:
        endpoint = await self._endpoint()
        with self._config.errors(endpoint):
            async with self._http(endpoint).stream(
                method, path, json=body, params=params, timeout=_NO_READ_TIMEOUT
            ) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise APIError(response.status_code, _error_message(response))
                async for line in response.aiter_lines():
                    try:
                        item = parse(line)
                    except StopIteration:
                        return
                    if item is not None:
                        yield item

    # -- daemon --------------------------------------------------------------------------

    async def is_running(self) -> bool:
        """True when a localllm daemon answers (never raises); see :meth:`Client.is_running`."""
        for endpoint in self._config.probe_order():
            try:
                response = await self._http(endpoint).get("/", timeout=_PROBE_TIMEOUT)
            except httpx.HTTPError:
                continue
            if _is_localllm(response):
                self._config.found(endpoint)
                return True
        self._config.found(None)
        return False

    async def identify(self) -> str | None:
        """Who answers at this client's first address; see :meth:`Client.identify`."""
        endpoint = self._config.current
        with self._config.errors(endpoint):
            response = await self._http(endpoint).get("/", timeout=_PROBE_TIMEOUT)
        return _other_server(response)

    async def wait_ready(self, timeout: float = 30.0, interval: float = 0.05) -> bool:
        """Wait until a daemon answers; False if none did in time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if await self.is_running():
                return True
            await asyncio.sleep(interval)
        return await self.is_running()

    async def version(self) -> str:
        """The daemon's own version (see :meth:`Client.version`)."""
        data = await self._json("GET", "/api/version")
        return str(data.get("localllm_version") or data["version"])

    # -- models --------------------------------------------------------------------------

    async def list_models(self) -> list[ModelSummary]:
        """Models in the store, newest first."""
        return list((await self._json("GET", "/api/tags"))["models"])

    async def show(self, model: str, *, verbose: bool = False) -> ShowResponse:
        """A model's details (see :meth:`Client.show`)."""
        return await self._json("POST", "/api/show", {"model": model, "verbose": verbose})

    async def ps(self) -> list[LoadedModelInfo]:
        """Loaded models."""
        return list((await self._json("GET", "/api/ps"))["models"])

    async def plan(self, model: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
        """The memory plan of ``model`` on the daemon's machine (``/api/plan``): ``plan``
        when it fits, else ``refusal``, the sentence a load would be refused with."""
        body: dict[str, Any] = {"model": model}
        if options:
            body["options"] = options
        return dict(await self._json("POST", "/api/plan", body))

    async def search(
        self, query: str, *, sort: str = "downloads", limit: int = 20, cursor: str | None = None
    ) -> dict[str, Any]:
        """GGUF models on the Hugging Face Hub (see :meth:`Client.search`)."""
        params = _search_params(query, sort, limit, cursor)
        return dict(await self._json("GET", "/api/search", params=params, timeout=_HUB_TIMEOUT))

    async def speed(self, model: str) -> dict[str, Any]:
        """A stored model's predicted and measured tokens/s (see :meth:`Client.speed`)."""
        return dict(await self._json("POST", "/api/speed", {"model": model}))

    async def hub_show(self, model: str) -> dict[str, Any]:
        """A Hub repository's quantizations on the daemon's machine (see
        :meth:`Client.hub_show`)."""
        body = {"model": model}
        return dict(await self._json("POST", "/api/hub/show", body, timeout=_HUB_TIMEOUT))

    async def copy(self, source: str, destination: str) -> None:
        """Give ``source`` a second name."""
        await self._request("POST", "/api/copy", {"source": source, "destination": destination})

    async def delete(self, model: str) -> None:
        """Remove a model (unloading it first)."""
        await self._request("DELETE", "/api/delete", {"model": model})

    async def pull(self, model: str, *, insecure: bool = False) -> AsyncIterator[ProgressLine]:
        """Download a model; yields progress lines. Leaving the iteration cancels the pull."""
        body = _payload({"model": model, "insecure": insecure})
        async for item in self._stream("POST", "/api/pull", body, _parse_ndjson):
            yield item

    async def create(
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
    ) -> AsyncIterator[ProgressLine]:
        """Create a model (see :meth:`Client.create`); yields status lines."""
        body = _payload(locals())
        async for item in self._stream("POST", "/api/create", body, _parse_ndjson):
            yield item

    async def blob_exists(self, digest: str) -> bool:
        """True if the daemon's store holds the blob."""
        try:
            await self._request("HEAD", f"/api/blobs/{digest}")
        except APIError as exc:
            if exc.status_code == 404:
                return False
            raise
        return True

    async def upload_blob(self, path: str | Path) -> str:
        """Upload a file as a blob (skipped when already there); returns its digest."""
        path = Path(path)
        digest = await asyncio.to_thread(_digest_of, path)
        if not await self.blob_exists(digest):
            await self._request(
                "POST",
                f"/api/blobs/{digest}",
                content=_afile_chunks(path),
                timeout=_NO_READ_TIMEOUT,
            )
        return digest

    # -- generation ----------------------------------------------------------------------

    async def generate(
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
        """A whole completion."""
        body = _payload(locals(), stream=False)
        return await self._json("POST", "/api/generate", body, timeout=_NO_READ_TIMEOUT)

    async def generate_stream(
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
    ) -> AsyncIterator[GenerateChunk]:
        """A completion streamed chunk by chunk; ``aclose()`` stops it in the daemon."""
        body = _payload(locals(), stream=True)
        done = False
        async for item in self._stream("POST", "/api/generate", body, _parse_ndjson):
            done = done or bool(item.get("done"))
            yield item
        if not done:
            raise DaemonUnavailableError(_CUT_SHORT)

    async def chat(
        self,
        model: str,
        messages: Sequence[ChatMessage],
        *,
        format: str | dict[str, Any] | None = None,
        options: Mapping[str, Any] | None = None,
        keep_alive: str | float | None = None,
        think: Think | None = None,
    ) -> ChatChunk:
        """A whole chat answer."""
        body = _payload(locals(), stream=False)
        return await self._json("POST", "/api/chat", body, timeout=_NO_READ_TIMEOUT)

    async def chat_stream(
        self,
        model: str,
        messages: Sequence[ChatMessage],
        *,
        format: str | dict[str, Any] | None = None,
        options: Mapping[str, Any] | None = None,
        keep_alive: str | float | None = None,
        think: Think | None = None,
    ) -> AsyncIterator[ChatChunk]:
        """A chat answer streamed chunk by chunk; ``aclose()`` stops it in the daemon."""
        body = _payload(locals(), stream=True)
        done = False
        async for item in self._stream("POST", "/api/chat", body, _parse_ndjson):
            done = done or bool(item.get("done"))
            yield item
        if not done:
            raise DaemonUnavailableError(_CUT_SHORT)

    async def load(self, model: str, *, keep_alive: str | float | None = None) -> GenerateChunk:
        """Load a model without generating."""
        body = _payload(locals(), stream=False)
        return await self._json("POST", "/api/generate", body, timeout=_NO_READ_TIMEOUT)

    async def unload(self, model: str) -> GenerateChunk:
        """Unload a model now (or once its running requests end)."""
        body = {"model": model, "keep_alive": 0, "stream": False}
        return await self._json("POST", "/api/generate", body, timeout=_NO_READ_TIMEOUT)

    async def embed(
        self,
        model: str,
        input_: str | Sequence[str],
        *,
        truncate: bool | None = None,
        dimensions: int | None = None,
        options: Mapping[str, Any] | None = None,
        keep_alive: str | float | None = None,
    ) -> EmbedResponse:
        """Normalised embeddings, one per input."""
        body = _payload(locals())
        return await self._json("POST", "/api/embed", body, timeout=_NO_READ_TIMEOUT)

    async def embeddings(self, model: str, prompt: str) -> list[float]:
        """One embedding (legacy route)."""
        body = {"model": model, "prompt": prompt}
        data = await self._json("POST", "/api/embeddings", body, timeout=_NO_READ_TIMEOUT)
        return list(data["embedding"])

    # -- observability -------------------------------------------------------------------

    async def stats(self) -> StatsSnapshot:
        """Every loaded model's slots, KV use, rates and recent requests, once."""
        return await self._json("GET", "/api/stats")

    async def stats_stream(self, interval: float = 0.25) -> AsyncIterator[StatsSnapshot]:
        """:meth:`stats` every ``interval`` seconds until the iteration is closed."""
        params = {"stream": "true", "interval": interval}
        async for item in self._stream("GET", "/api/stats", None, _parse_ndjson, params=params):
            yield item

    async def metrics(self) -> str:
        """The Prometheus exposition text."""
        return (await self._request("GET", "/metrics")).text

    # -- OpenAI-compatible routes ------------------------------------------------------------

    async def openai_models(self) -> list[dict[str, Any]]:
        """``GET /v1/models``."""
        return list((await self._json("GET", "/v1/models"))["data"])

    async def openai_model(self, model: str) -> dict[str, Any]:
        """``GET /v1/models/{model}``."""
        return await self._json("GET", f"/v1/models/{model}")

    async def openai_chat(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /v1/chat/completions`` (``stream`` forced off)."""
        return await self._json(
            "POST", "/v1/chat/completions", {**body, "stream": False}, timeout=_NO_READ_TIMEOUT
        )

    async def openai_chat_stream(self, body: Mapping[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """``POST /v1/chat/completions`` streamed: the SSE chunks, without ``[DONE]``."""
        payload = {**body, "stream": True}
        async for item in self._stream("POST", "/v1/chat/completions", payload, _parse_sse):
            yield item

    async def openai_completion(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /v1/completions`` (``stream`` forced off)."""
        return await self._json(
            "POST", "/v1/completions", {**body, "stream": False}, timeout=_NO_READ_TIMEOUT
        )

    async def openai_completion_stream(
        self, body: Mapping[str, Any]
    ) -> AsyncIterator[dict[str, Any]]:
        """``POST /v1/completions`` streamed."""
        payload = {**body, "stream": True}
        async for item in self._stream("POST", "/v1/completions", payload, _parse_sse):
            yield item

    async def openai_embeddings(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /v1/embeddings``."""
        return await self._json("POST", "/v1/embeddings", dict(body), timeout=_NO_READ_TIMEOUT)
