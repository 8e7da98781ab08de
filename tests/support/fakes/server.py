"""A loopback HTTP/1.1 server for fakes, with Range serving and switches that make it misbehave.

Every request is recorded (method, path, headers) and every body byte sent is counted per
path, so tests can assert what a client asked for and what it was sent. Faults are one-shot:
each applies to the first response whose byte range covers its offset.
"""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

__all__ = ["Fault", "LoopbackServer", "Recorded", "RequestHandler", "bind_host"]

_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")
_CHUNK = 64 * 1024
# The longest a stalled or paused response waits before giving up (a test failed meanwhile).
_MAX_WAIT = 60.0


@dataclass(frozen=True)
class Recorded:
    """One request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    """Header names lower-cased."""


@dataclass
class Fault:
    """Something to do once, when a response reaches byte ``at`` of a file.

    ``kind`` is ``drop`` (close the connection there), ``stall`` (send nothing more, holding the
    connection until the server stops), ``pause`` (set :attr:`reached`, wait for
    :attr:`resume`, go on) or ``corrupt`` (flip the byte at ``at``; applies to every response).
    ``path`` limits it to one URL path (default: any file).
    """

    kind: str
    at: int
    path: str | None = None
    reached: threading.Event = field(default_factory=threading.Event)
    resume: threading.Event = field(default_factory=threading.Event)
    used: bool = False


def bind_host(preferred: str) -> str:
    """``preferred`` if this machine can bind it (127.0.0.2 on Linux), else ``127.0.0.1``."""
    try:
        with socket.socket() as probe:
            probe.bind((preferred, 0))
        return preferred
    except OSError:
        return "127.0.0.1"


class RequestHandler(BaseHTTPRequestHandler):
    """Dispatches to the owning :class:`LoopbackServer`; quiet; keep-alive HTTP/1.1."""

    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _dispatch(self) -> None:
        owner = self.server.owner
        owner.record(self)
        try:
            owner.route(self)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    do_GET = _dispatch
    do_HEAD = _dispatch

    # -- response helpers --------------------------------------------------------------------

    def send_json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        import json

        data = json.dumps(body).encode()
        self.send_bytes(status, data, "application/json", headers)

    def send_bytes(
        self,
        status: int,
        data: bytes,
        content_type: str = "application/octet-stream",
        headers: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def send_empty(self, status: int, headers: dict[str, str] | None = None) -> None:
        self.send_bytes(status, b"", "text/plain", headers)

    def redirect(self, status: int, location: str, headers: dict[str, str] | None = None) -> None:
        self.send_empty(status, {"Location": location, **(headers or {})})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    owner: LoopbackServer


class LoopbackServer:
    """Base of the fakes: subclasses implement :meth:`route`."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._server = _Server((host, 0), RequestHandler)
        self._server.owner = self
        # A short poll interval: shutdown() waits for it, once per server per test.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._lock = threading.Lock()
        self.stopped = threading.Event()
        self.requests: list[Recorded] = []
        self.body_bytes: dict[str, int] = {}
        """Body bytes sent per URL path, over all responses."""
        self.faults: list[Fault] = []
        self.fail_status: int | None = None
        """When set, every file request is answered with this status instead."""
        self.on_request: Callable[[Recorded], None] | None = None
        self.companions: list[LoopbackServer] = []
        """Servers started and stopped with this one (a fake's CDN)."""

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> Self:
        for companion in self.companions:
            companion.start()
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()
        for fault in self.faults:
            fault.resume.set()
        self._server.shutdown()
        self._server.server_close()
        for companion in self.companions:
            companion.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- recording ---------------------------------------------------------------------------

    def record(self, handler: RequestHandler) -> None:
        entry = Recorded(
            handler.command,
            handler.path.split("?", 1)[0],
            {k.lower(): v for k, v in handler.headers.items()},
        )
        with self._lock:
            self.requests.append(entry)
        if self.on_request is not None:
            self.on_request(entry)

    def requests_for(self, path: str, method: str = "GET") -> list[Recorded]:
        """Requests of ``method`` for exactly ``path``."""
        with self._lock:
            return [r for r in self.requests if r.path == path and r.method == method]

    def add_fault(self, kind: str, at: int, path: str | None = None) -> Fault:
        """Arm a one-shot fault (see :class:`Fault`)."""
        fault = Fault(kind, at, path)
        with self._lock:
            self.faults.append(fault)
        return fault

    def route(self, handler: RequestHandler) -> None:
        raise NotImplementedError

    # -- serving files -----------------------------------------------------------------------

    def send_file(
        self, handler: RequestHandler, data: bytes, headers: dict[str, str] | None = None
    ) -> None:
        """Serve ``data`` honouring one ``Range: bytes=a-[b]``, with the armed faults."""
        if self.fail_status is not None:
            handler.send_empty(self.fail_status)
            return
        size = len(data)
        start, end, status = 0, size, 200
        match = _RANGE.match(handler.headers.get("Range", "").strip())
        if match:
            start = int(match.group(1))
            end = min(int(match.group(2)) + 1, size) if match.group(2) else size
            if start >= size or start >= end:
                handler.send_empty(416, {"Content-Range": f"bytes */{size}"})
                return
            status = 206
        handler.send_response(status)
        handler.send_header("Content-Type", "application/octet-stream")
        handler.send_header("Content-Length", str(end - start))
        handler.send_header("Accept-Ranges", "bytes")
        if status == 206:
            handler.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        handler.end_headers()
        if handler.command == "HEAD":
            return
        path = handler.path.split("?", 1)[0]
        body = bytearray(data[start:end])
        with self._lock:
            faults = [f for f in self.faults if f.path in (None, path)]
            for fault in faults:
                if fault.kind == "corrupt" and start <= fault.at < end:
                    body[fault.at - start] ^= 0xFF
        position = start
        while position < end:
            chunk_end = min(position + _CHUNK, end)
            fault = self._take_fault(faults, position, chunk_end)
            if fault is not None:
                chunk_end = fault.at
            self._write(handler, path, body[position - start : chunk_end - start])
            position = chunk_end
            if fault is None:
                continue
            if fault.kind == "drop":
                handler.wfile.flush()
                # A clean FIN after the bytes sent, so the client gets every one of them.
                handler.connection.shutdown(socket.SHUT_WR)
                handler.close_connection = True
                return
            handler.wfile.flush()
            fault.reached.set()
            if fault.kind == "stall":
                self.stopped.wait(_MAX_WAIT)
                handler.close_connection = True
                return
            fault.resume.wait(_MAX_WAIT)  # pause

    def _take_fault(self, faults: list[Fault], start: int, end: int) -> Fault | None:
        with self._lock:
            for fault in faults:
                if fault.kind != "corrupt" and not fault.used and start <= fault.at < end:
                    fault.used = True
                    return fault
        return None

    def _write(self, handler: RequestHandler, path: str, data: bytes | bytearray) -> None:
        if not data:
            return
        handler.wfile.write(data)
        with self._lock:
            self.body_bytes[path] = self.body_bytes.get(path, 0) + len(data)
