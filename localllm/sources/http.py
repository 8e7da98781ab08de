"""HTTP plumbing shared by the sources: the client, transient errors, redirect and range helpers."""

from __future__ import annotations

import functools
import importlib
import re
import threading

import httpx

from ..settings import Settings

__all__ = [
    "TransientError",
    "content_range",
    "is_transport_error",
    "make_client",
    "response_total",
    "same_host",
    "same_origin",
    "shared_client",
    "transient_status",
]

# Redirect chains longer than this are a loop or an attack, not a CDN.
MAX_REDIRECTS = 10


class TransientError(Exception):
    """A failure worth retrying (a dropped connection, a 5xx, an expired CDN link).

    Sources raise it from :meth:`BlobSource.open`; the download engine retries with backoff and
    turns it into a :class:`~localllm.NetworkError` once the retries are spent.
    """


_clients: dict[float, httpx.Client] = {}
_clients_lock = threading.Lock()


def shared_client(settings: Settings) -> httpx.Client:
    """This process's client for ``settings`` (see :func:`make_client`); never close it.

    Downloads share it, so connections and the TLS context (tens of milliseconds to build) are
    reused from one blob to the next. httpx clients are safe to use from several threads.
    """
    with _clients_lock:
        client = _clients.get(settings.pull_stall_timeout)
        if client is None:
            client = _clients[settings.pull_stall_timeout] = make_client(settings)
        return client


def make_client(settings: Settings) -> httpx.Client:
    """An httpx client for registries and CDNs.

    The read timeout is the stall timeout: a connection that delivers no byte for that long
    raises ``ReadTimeout``, and the download resumes on a new connection. Redirects are never
    followed implicitly; each source decides which ones it trusts.
    """
    from .. import __version__

    stall = settings.pull_stall_timeout
    return httpx.Client(
        timeout=httpx.Timeout(connect=min(stall, 30.0), read=stall, write=stall, pool=stall),
        follow_redirects=False,
        headers={"User-Agent": f"localllm/{__version__}", "Accept-Encoding": "identity"},
    )


@functools.cache
def _transport_error_types() -> tuple[type[BaseException], ...]:
    # huggingface_hub 1.x speaks httpx, 2.x httpx2 and 0.x requests: a network failure inside it
    # surfaces as whichever of these it uses.
    types: list[type[BaseException]] = [httpx.TransportError, ConnectionError, TimeoutError]
    for module_name, attrs in (
        ("httpx2", ("TransportError",)),
        ("requests.exceptions", ("ConnectionError", "Timeout")),
    ):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        types.extend(getattr(module, attr) for attr in attrs if hasattr(module, attr))
    return tuple(types)


def is_transport_error(exc: BaseException) -> bool:
    """True for connection-level failures (refused, reset, DNS, timeouts) of any HTTP stack."""
    return isinstance(exc, _transport_error_types())


def transient_status(status: int) -> bool:
    """Statuses a later attempt may well not get: timeouts, rate limits, server errors."""
    return status in (408, 425, 429) or 500 <= status < 600


def same_host(a: str | httpx.URL, b: str | httpx.URL) -> bool:
    """Whether two URLs name the same host (ports aside, as Ollama compares them)."""
    return httpx.URL(str(a)).host.lower() == httpx.URL(str(b)).host.lower()


def same_origin(a: str | httpx.URL, b: str | httpx.URL) -> bool:
    """Whether two URLs share scheme, host and port (where a token may be sent)."""
    first, second = httpx.URL(str(a)), httpx.URL(str(b))
    return (first.scheme, first.host.lower(), first.port) == (
        second.scheme,
        second.host.lower(),
        second.port,
    )


_CONTENT_RANGE = re.compile(r"bytes\s+(?:(\d+)-(\d+)|\*)/(\d+|\*)")


def content_range(value: str | None) -> tuple[int | None, int | None]:
    """``(first byte, total size)`` of a ``Content-Range`` header (``bytes a-b/n`` or
    ``bytes */n``); either is ``None`` when absent or unknown."""
    match = _CONTENT_RANGE.fullmatch(value.strip()) if value else None
    if not match:
        return None, None
    start = int(match.group(1)) if match.group(1) is not None else None
    total = int(match.group(3)) if match.group(3) != "*" else None
    return start, total


def response_total(response: httpx.Response) -> int | None:
    """The full size of the file a 200/206/416 response is about, when the server says."""
    if response.status_code in (206, 416):
        return content_range(response.headers.get("content-range"))[1]
    length = response.headers.get("content-length")
    encoded = response.headers.get("content-encoding", "identity") != "identity"
    return int(length) if length and length.isdigit() and not encoded else None
