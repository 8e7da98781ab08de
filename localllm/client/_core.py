"""What both clients share, without any I/O: where the daemon is, how a request is built, how an
answer (whole, NDJSON or SSE) is read, and how a transport's failure becomes a documented error.

The transports (:mod:`._sync_transport`, :mod:`._async_transport`) only move bytes: they take a
:class:`Request`, return a :class:`Response` or a stream of lines, and raise one of the
:class:`TransportError` kinds below for whatever went wrong on the wire. :meth:`Config.errors`
turns those into :class:`~localllm.DaemonUnavailableError`,
:class:`~localllm.DaemonTimeoutError` and :class:`~localllm.APIError`: the one place that does.
"""

from __future__ import annotations

import base64
import contextlib
import ipaddress
import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlencode

from .._exceptions import APIError, DaemonTimeoutError, DaemonUnavailableError
from ..settings import Settings

__all__ = [
    "CUT_SHORT",
    "NO_READ_TIMEOUT",
    "PROBE_TIMEOUT",
    "BadAnswer",
    "Config",
    "ConnectFailed",
    "ConnectionLost",
    "Endpoint",
    "Request",
    "Response",
    "TimedOut",
    "Timeout",
    "TransportError",
    "digest_of",
    "error_message",
    "file_chunks",
    "is_localllm",
    "is_loopback",
    "other_server",
    "parse_ndjson",
    "parse_sse",
    "payload",
]


# -- what a transport raises -------------------------------------------------------------------


class TransportError(Exception):
    """A failure on the wire, named by its kind; ``str()`` is the transport's own detail."""


class ConnectFailed(TransportError):
    """No connection could be made (refused, no such socket or host, connect timeout)."""


class TimedOut(TransportError):
    """Connected, but the peer did not answer (or take the request) in time."""


class ConnectionLost(TransportError):
    """The connection broke while sending or receiving, or the peer broke HTTP."""


class BadAnswer(TransportError):
    """An answer that arrived but cannot be decoded (its content encoding, a redirect loop)."""


# -- endpoints ---------------------------------------------------------------------------------


# Named tuples rather than dataclasses: a dataclass costs about a millisecond to define, and
# this module is on the path of every CLI command.


class Timeout(NamedTuple):
    """Seconds to connect, and to wait for each read or write once connected (None: forever)."""

    connect: float | None
    read: float | None


# Generation can wait minutes for a model to load and then stream for long: no read timeout.
NO_READ_TIMEOUT = Timeout(connect=5.0, read=None)
PROBE_TIMEOUT = Timeout(connect=2.0, read=2.0)
# The daemon bounds each Hub request (LOCALLLM_HUB_TIMEOUT); a first look at a repository may
# also wait for the speed probe (seconds, once per machine).
HUB_TIMEOUT = Timeout(connect=5.0, read=180.0)
_IDENTITY = "localllm"


class Endpoint(NamedTuple):
    """One way to reach a daemon: its Unix socket (``uds``) or a TCP ``base_url``."""

    uds: str | None
    base_url: str

    @property
    def address(self) -> str:
        """The socket's path, or the URL."""
        return self.uds or self.base_url

    def describe(self) -> str:
        """The endpoint in a few words, for messages."""
        return f"socket {self.uds}" if self.uds else self.base_url


def _socket_endpoint(path: str | Path) -> Endpoint:
    return Endpoint(str(path), "http://localhost")


def is_loopback(host: str) -> bool:
    """True for a host name or address that stays on this machine (``localhost``, 127.0.0.0/8,
    ``::1``, and the unspecified addresses, which a client reaches through loopback)."""
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
) -> tuple[Endpoint, ...]:
    """Where to look for the daemon, in order; one entry when the caller fixed the transport.

    Without ``LOCALLLM_HOST`` the socket comes first, then the TCP address, but the TCP
    address only when the socket's place depends on the environment (no ``LOCALLLM_HOME``:
    ``XDG_RUNTIME_DIR`` differs between desktop, ssh, sudo and cron). With ``LOCALLLM_HOME``
    the socket of that home is its daemon, and whatever answers on the default port may serve
    another home. With ``LOCALLLM_HOST`` TCP comes first, then this home's socket when that
    host is this machine.
    """
    if base_url is not None:
        return (Endpoint(None, base_url.rstrip("/")),)
    if socket_path is not None:
        return (_socket_endpoint(socket_path),)
    tcp = Endpoint(None, settings.base_url)
    socket = _socket_endpoint(settings.socket_path)
    if use_tcp is not None:
        return (tcp,) if use_tcp else (socket,)
    if settings.host_from_env:
        return (tcp, socket) if is_loopback(settings.bind_host) else (tcp,)
    return (socket, tcp) if settings.home is None else (socket,)


# -- requests ----------------------------------------------------------------------------------

_RENAMES = {"from_": "from", "input_": "input"}


def search_path(query: str, sort: str, limit: int, cursor: str | None) -> str:
    """``/api/search?...`` for a page of the Hub's search."""
    from urllib.parse import urlencode

    params: dict[str, Any] = {"q": query, "sort": sort, "limit": limit}
    if cursor:
        params["cursor"] = cursor
    return f"/api/search?{urlencode(params)}"


def payload(values: Mapping[str, Any], **fixed: Any) -> dict[str, Any]:
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


class Request(NamedTuple):
    """One HTTP request as a transport sends it: ``path`` holds the query string, ``content``
    the body (bytes, or chunks sent with chunked encoding), ``headers`` its own headers."""

    method: str
    path: str
    timeout: Timeout
    content: bytes | Iterable[bytes] | None = None
    headers: Mapping[str, str] = {}

    @classmethod
    def build(
        cls,
        method: str,
        path: str,
        timeout: Timeout,
        *,
        json_body: Any = None,
        content: Iterable[bytes] | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> Request:
        """A request with ``json_body`` encoded as JSON (as httpx encodes it), or ``content``."""
        if params:
            path = f"{path}?{urlencode(params)}"
        if json_body is not None:
            body = json.dumps(json_body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
            headers = {"Content-Type": "application/json"}
            return cls(method, path, timeout, body.encode("utf-8"), headers)
        return cls(method, path, timeout, content)


class Response(NamedTuple):
    """A whole answer: its status and body."""

    status_code: int
    content: bytes

    @property
    def text(self) -> str:
        """The body as text (UTF-8; undecodable bytes replaced)."""
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The body as JSON (raises :class:`json.JSONDecodeError`)."""
        return json.loads(self.content)


# -- answers -----------------------------------------------------------------------------------


def error_message(status_code: int, content: bytes) -> str:
    """What an error answer says: its ``error`` (Ollama's string, OpenAI's ``message``), or
    its text."""
    text = content.decode("utf-8", errors="replace")
    try:
        data = json.loads(content)
    except ValueError:
        return text.strip() or f"HTTP {status_code}"
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        return str(error.get("message") or error)
    if error:
        return str(error)
    return text.strip() or f"HTTP {status_code}"


def _check_line(data: Any) -> Any:
    if isinstance(data, dict) and "error" in data and len(data) <= 2:
        error = data["error"]
        message = error.get("message", str(error)) if isinstance(error, dict) else str(error)
        raise APIError(500, message)
    return data


def parse_ndjson(line: str) -> Any | None:
    """The JSON of one NDJSON line, ``None`` for a blank one; an error line raises
    :class:`~localllm.APIError`."""
    line = line.strip()
    return _check_line(json.loads(line)) if line else None


def parse_sse(line: str) -> Any | None:
    """The JSON of one ``data:`` line, ``None`` for anything else; ``[DONE]`` → StopIteration."""
    if not line.startswith("data:"):
        return None
    text = line[5:].strip()
    if text == "[DONE]":
        raise StopIteration
    return _check_line(json.loads(text))


CUT_SHORT = "the daemon's answer stream ended before its final chunk (the connection closed)"
"""Why an answer stream that ends before its ``done`` chunk is an error, not a short answer."""


def is_localllm(response: Response) -> bool:
    """True for the answer of a localllm daemon's ``GET /``.

    That route answers "localllm is running" without an API key (Ollama's answers "Ollama is
    running"): it tells our daemon from another server on the same port whatever ``version``
    says in ``/api/version``.
    """
    return response.status_code == 200 and response.text.startswith(_IDENTITY)


def other_server(response: Response) -> str | None:
    """None for a localllm daemon's ``GET /`` answer, else what answered, in a few words."""
    if is_localllm(response):
        return None
    text = " ".join(response.text.split())
    excerpt = repr(text[:60] + ("..." if len(text) > 60 else ""))
    return f"GET / answered HTTP {response.status_code}: {excerpt}"


def digest_of(path: Path) -> str:
    """``sha256:<hex>`` of a file's bytes."""
    import hashlib  # loads OpenSSL: only for an upload, not on every command's path

    hasher = hashlib.sha256()
    for chunk in file_chunks(path):
        hasher.update(chunk)
    return f"sha256:{hasher.hexdigest()}"


def file_chunks(path: Path) -> Iterator[bytes]:
    """A file's bytes, a MiB at a time."""
    with open(path, "rb") as handle:
        yield from iter(lambda: handle.read(1 << 20), b"")


# -- configuration and errors ------------------------------------------------------------------


class Config:
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
        self.endpoint: Endpoint | None = None if self.discovers else self.candidates[0]
        key = api_key if api_key is not None else settings.api_key
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.timeout = Timeout(connect=5.0, read=timeout)

    @property
    def current(self) -> Endpoint:
        """The endpoint in use, or the first one to try while none has answered yet."""
        return self.endpoint or self.candidates[0]

    def probe_order(self) -> list[Endpoint]:
        """The endpoint in use first (it answered last time), then the others."""
        first = [self.endpoint] if self.endpoint is not None else []
        return first + [c for c in self.candidates if c != self.endpoint]

    def found(self, endpoint: Endpoint | None) -> None:
        """Record the endpoint that answered (None: none did)."""
        if self.discovers:
            self.endpoint = endpoint

    def unavailable(self, reason: str) -> DaemonUnavailableError:
        """The error for a daemon that answers nowhere it was looked for."""
        where = " or ".join(c.describe() for c in self.candidates)
        return DaemonUnavailableError(
            f"no localllm daemon answers at {where} ({reason}); start one with `localllm serve`"
        )

    @contextlib.contextmanager
    def errors(self, endpoint: Endpoint) -> Iterator[None]:
        """Turn a transport's failure while talking to ``endpoint`` (connecting, sending,
        reading, in the middle of a stream too) into the documented errors: the one place
        that does. :class:`~localllm.DaemonTimeoutError` (a
        :class:`~localllm.DaemonUnavailableError`) when it does not answer in time,
        :class:`~localllm.DaemonUnavailableError` when it cannot be reached or the connection
        drops, :class:`~localllm.APIError` for an answer that cannot be read."""
        where = endpoint.describe()
        try:
            yield
        except ConnectFailed as exc:
            self.found(None)  # the daemon went away, or moved: look again next time
            raise self.unavailable(str(exc)) from exc
        except TimedOut as exc:
            raise DaemonTimeoutError(
                f"the localllm daemon at {where} did not answer in time ({exc})"
            ) from exc
        except ConnectionLost as exc:
            raise DaemonUnavailableError(
                f"lost the connection to the localllm daemon at {where} ({exc})"
            ) from exc
        except BadAnswer as exc:
            raise APIError(
                502, f"unreadable answer from the localllm daemon at {where} ({exc})"
            ) from exc
        except json.JSONDecodeError as exc:
            raise APIError(
                502, f"the localllm daemon at {where} answered with invalid JSON ({exc})"
            ) from exc
