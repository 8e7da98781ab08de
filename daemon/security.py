"""Security defaults: loopback Host headers, CORS for local origins only, optional API key.

* DNS rebinding: a web page on ``evil.example`` that re-points its name at 127.0.0.1 can make a
  browser send requests to the daemon, but with ``Host: evil.example``. Only loopback host
  names are accepted (403 otherwise), unless the daemon deliberately listens beyond loopback,
  which needs an API key.
* CORS: requests carrying an ``Origin`` that is not a localhost origin or one listed in
  ``LOCALLLM_ORIGINS`` are refused with 403 (as Ollama's CORS layer does), which also stops
  "simple" cross-site POSTs that a browser sends without a preflight.
* Size: a request body over :data:`MAX_JSON_BODY` is refused with 413 before it is read
  (except blob uploads, which stream to disk).
* API key: with ``LOCALLLM_API_KEY`` set, every route except ``/`` and ``/health`` needs
  ``Authorization: Bearer <key>`` (or Anthropic's ``x-api-key: <key>``), compared in constant
  time.

Plain ASGI middleware (not Starlette's BaseHTTPMiddleware) so streaming responses and client
disconnects pass through untouched.
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
import json
import re
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from localllm._exceptions import SettingsError
from localllm.settings import Settings

__all__ = [
    "LOCAL_ORIGIN_REGEX",
    "MAX_JSON_BODY",
    "GuardMiddleware",
    "check_bind_allowed",
    "is_loopback_host",
    "is_openai_path",
    "origin_regex",
]

MAX_JSON_BODY = 64 << 20
"""Largest request body accepted outside blob uploads (a whole chat fits many times)."""

_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})

# Browsers' own origins for pages served from this machine, and the desktop webview schemes
# Ollama allows by default.
LOCAL_ORIGIN_REGEX = (
    r"(https?://(localhost|127\.0\.0\.1|\[::1\]|0\.0\.0\.0|[a-z0-9-]+\.localhost)(:\d+)?"
    r"|app://[^/]*|file://.*|tauri://[^/]*|vscode-webview://[^/]*|vscode-file://[^/]*)"
)


# The OpenAI routes llama-server also serves without the /v1 prefix.
_OPENAI_BARE = ("/chat/completions", "/completions", "/embeddings", "/models")


def is_openai_path(path: str) -> bool:
    """Whether ``path`` is an OpenAI-compatible route, whose errors take OpenAI's shape."""
    if path.startswith("/v1/") or path == "/v1":
        return True
    return path in _OPENAI_BARE or path.startswith("/models/")


def is_loopback_host(host: str) -> bool:
    """True for names and addresses that can only mean this machine."""
    name = host.strip().lower().rstrip(".")
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    if name in _LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_bind_allowed(settings: Settings) -> None:
    """Refuse a non-loopback listen address without an API key (raises SettingsError)."""
    if not is_loopback_host(settings.bind_host) and not settings.api_key:
        raise SettingsError(
            f"refusing to listen on {settings.host}: it is not a loopback address; "
            "set LOCALLLM_API_KEY so remote clients must authenticate, or use 127.0.0.1"
        )


def origin_regex(extra: Iterable[str]) -> str:
    """A regex that matches allowed ``Origin`` values (``*`` in extra origins is a wildcard)."""
    patterns = [LOCAL_ORIGIN_REGEX]
    for origin in extra:
        patterns.append(".*" if origin == "*" else ".*".join(map(re.escape, origin.split("*"))))
    return "^(" + "|".join(patterns) + ")$"


def _split_host(value: str) -> str:
    if value.startswith("["):
        return value[: value.find("]") + 1] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class GuardMiddleware:
    """Host check, origin check and API key, before anything else sees the request."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.api_key = settings.api_key
        self.open_bind = not is_loopback_host(settings.bind_host)
        self.origin = re.compile(origin_regex(settings.origins), re.IGNORECASE)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (refused := self.refusal(scope)) is not None:
            await self.deny(scope, send, refused)
            return
        await self.app(scope, receive, send)

    def refusal(self, scope: Scope) -> tuple[int, str, dict[str, str] | None] | None:
        """Why an HTTP request is refused (status, message, extra headers), or None."""
        headers = _guarded_headers(scope["headers"])
        path = scope.get("path", "")
        host = headers.get("host")
        server = scope.get("server")
        over_unix = server is None or server[1] is None  # uvicorn: (socket path, None)
        if not self.open_bind:
            if host is None:
                if not over_unix:
                    return 403, "a Host header is required", None
            elif not _loopback_host_header(host):
                return 403, f"host {host!r} is not allowed", None
        origin = headers.get("origin")
        if origin is not None and not self.origin.match(origin):
            return 403, f"origin {origin!r} is not allowed; see LOCALLLM_ORIGINS", None
        if self.api_key and not _public(scope) and scope["method"] != "OPTIONS":
            scheme, _, token = headers.get("authorization", "").partition(" ")
            # Anthropic's clients (and Claude Code's ANTHROPIC_API_KEY) send x-api-key.
            supplied = token.strip() if scheme.lower() == "bearer" else headers.get("x-api-key", "")
            if not hmac.compare_digest(supplied.encode(), self.api_key.encode()):
                return (
                    401,
                    "missing or invalid API key: send 'Authorization: Bearer <LOCALLLM_API_KEY>' "
                    "(or 'x-api-key: <LOCALLLM_API_KEY>')",
                    {"www-authenticate": "Bearer"},
                )
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > MAX_JSON_BODY and not path.startswith("/api/blobs/"):
            # Request bodies are read whole before validation; only blob uploads stream.
            return 413, f"request body too large (limit {MAX_JSON_BODY} bytes)", None
        return None

    async def deny(
        self, scope: Scope, send: Send, refused: tuple[int, str, dict[str, str] | None]
    ) -> None:
        """Answer a request :meth:`refusal` refused."""
        await _deny(send, scope.get("path", ""), *refused)


# The headers the guard reads. Every request passes the guard on its way to its first
# token, and after an idle gap all of Python runs slowly: decoding every header into a
# dictionary took 24 us, and the Host header's check (``ipaddress`` parsing "127.0.0.1")
# 60 us; these are read alone, and a Host header's answer is kept.
_GUARDED = frozenset({b"host", b"origin", b"authorization", b"x-api-key", b"content-length"})


def _guarded_headers(raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """The guard's headers by lowercase name (the last of a repeated one, as a dictionary of
    all of them had it), decoded as latin-1."""
    return {
        k.decode("latin-1").lower(): v.decode("latin-1") for k, v in raw if k.lower() in _GUARDED
    }


@functools.lru_cache(maxsize=256)  # bounded: the header is the client's to choose
def _loopback_host_header(host: str) -> bool:
    """Whether a Host header (a name or address, maybe a port) names this machine only."""
    return is_loopback_host(_split_host(host))


def _public(scope: Scope) -> bool:
    # liveness only: nothing about models or requests
    return scope.get("path") in ("/", "/health", "/v1/health") and scope.get("method") in (
        "GET",
        "HEAD",
    )


async def _deny(
    send: Send, path: str, status: int, message: str, extra: dict[str, str] | None = None
) -> None:
    if is_openai_path(path):
        kind = {401: "authentication_error", 403: "permission_error"}.get(
            status, "invalid_request_error"
        )
        body: dict[str, object] = {
            "error": {"message": message, "type": kind, "param": None, "code": None}
        }
    else:
        body = {"error": message}
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    headers += [(k.encode(), v.encode()) for k, v in (extra or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
