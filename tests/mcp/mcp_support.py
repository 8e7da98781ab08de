"""Helpers for the MCP tests: a scripted model behind the daemon's real HTTP protocol, the
test MCP server's command line, and a config file pointing at it.

:class:`ScriptedModel` is a loopback server that answers ``/api/chat`` (NDJSON, or one JSON
object) and ``/v1/chat/completions`` (SSE) as the daemon does, with tool calls in each
route's shape and the daemon's timing fields, from a script of replies: the loop's logic is
tested on answers that are known in advance, where a real small model's choices would make
a test flaky. Every request body is recorded. It also answers what the CLI and the TUI ask
before chatting (``GET /``, ``/api/version``, ``/api/show``, ``/api/tags``, a load).
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

__all__ = ["TOOLBOX", "Reply", "ScriptedModel", "toolbox_entry", "write_config"]

TOOLBOX = Path(__file__).parent / "mcp_servers" / "toolbox.py"
"""The test MCP server (``MCPServer``, over stdio)."""

MODEL = "scripted:latest"


def toolbox_entry(*flags: str, calls: Path | None = None, **extra: Any) -> dict[str, Any]:
    """The config entry that starts the test server (with ``flags``; its calls logged to
    ``calls``)."""
    entry: dict[str, Any] = {"command": sys.executable, "args": [str(TOOLBOX), *flags]}
    if calls is not None:
        entry["env"] = {"TOOLBOX_CALLS": str(calls)}
    entry.update(extra)
    return entry


def write_config(path: Path, servers: dict[str, dict[str, Any]]) -> Path:
    """An ``mcp.json`` with these servers."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"mcpServers": servers}, indent=2))
    return path


@dataclass
class Reply:
    """One scripted answer: reasoning, text and calls ((name, arguments) pairs)."""

    content: str = ""
    calls: list[tuple[str, Any]] = field(default_factory=list)
    thinking: str = ""
    wait: threading.Event | None = None
    """When set, the answer starts streaming only once this is set (or after 30 s)."""


_FINAL = {
    "done": True,
    "done_reason": "stop",
    "total_duration": 30_000_000,
    "load_duration": 1_000_000,
    "prompt_eval_count": 40,
    "prompt_eval_duration": 8_000_000,
    "eval_count": 6,
    "eval_duration": 12_000_000,
    "ttft_duration": 10_000_000,
    "queue_duration": 0,
    "prompt_cached_count": 12,
    "prompt_evaluated_count": 28,
    "prompt_eval_rate": 3500.0,
    "eval_rate": 500.0,
}


class ScriptedModel:
    """A loopback "daemon" whose one model answers from :attr:`script`."""

    def __init__(self, *, capabilities: tuple[str, ...] = ("completion", "tools")) -> None:
        self.capabilities = list(capabilities)
        """What ``/api/show`` says the model can do."""
        self.script: list[Reply | Callable[[dict[str, Any]], Reply]] = []
        """Replies to give, in order (a callable gets the request body); then "done"."""
        self.requests: list[tuple[str, dict[str, Any]]] = []
        """Every (path, body) received by the chat routes, in order."""
        self._lock = threading.Lock()
        model = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if self.path == "/":
                    self._send(200, b"localllm is running", "text/plain")
                elif self.path.startswith("/api/version"):
                    self._json({"version": "0.9.0", "localllm_version": "0.1.0"})
                elif self.path.startswith("/api/tags"):
                    self._json({"models": [{"name": MODEL, "model": MODEL, "size": 1}]})
                elif self.path.startswith("/api/ps"):
                    self._json({"models": []})
                else:
                    self._json({"error": "not here"}, 404)

            def do_HEAD(self) -> None:
                self._send(200, b"", "text/plain")

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.path == "/api/show":
                    self._json(model.show())
                elif self.path == "/api/generate":
                    self._json({"model": MODEL, "response": "", "done": True})
                elif self.path == "/api/chat":
                    model._record(self.path, body)
                    reply = model.next_reply(body)
                    if body.get("stream") is False:
                        self._json(model.chat_whole(reply))
                    else:
                        self._stream(model.chat_lines(reply), "application/x-ndjson")
                elif self.path == "/v1/chat/completions":
                    model._record(self.path, body)
                    self._stream(model.sse_events(model.next_reply(body)), "text/event-stream")
                else:
                    self._json({"error": f"no route {self.path}"}, 404)

            def _send(self, status: int, data: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _json(self, data: Any, status: int = 200) -> None:
                self._send(status, json.dumps(data).encode(), "application/json")

            def _stream(self, lines: Iterator[bytes], kind: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                try:
                    for line in lines:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client stopped reading (Esc, Ctrl-C)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    # -- the server -----------------------------------------------------------------------

    @property
    def port(self) -> int:
        """Its port on 127.0.0.1."""
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ScriptedModel:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- answers --------------------------------------------------------------------------

    def _record(self, path: str, body: dict[str, Any]) -> None:
        with self._lock:
            self.requests.append((path, body))

    def chat_requests(self) -> list[dict[str, Any]]:
        """The bodies of every chat request (both routes), in order."""
        return [body for _, body in self.requests]

    def show(self) -> dict[str, Any]:
        """``/api/show``'s answer."""
        return {
            "modelfile": "",
            "parameters": "",
            "template": "{{ .Prompt }}",
            "details": {"family": "scripted", "parameter_size": "1M", "format": "gguf"},
            "model_info": {},
            "capabilities": self.capabilities,
        }

    def next_reply(self, body: dict[str, Any]) -> Reply:
        """The next scripted reply (a callable entry is called with the request's body)."""
        with self._lock:
            entry = self.script.pop(0) if self.script else Reply("done")
        reply = entry(body) if callable(entry) else entry
        if reply.wait is not None:
            reply.wait.wait(30)
        return reply

    @staticmethod
    def _ollama_calls(reply: Reply) -> list[dict[str, Any]]:
        return [
            {"id": f"call_{i}", "function": {"index": i, "name": name, "arguments": arguments}}
            for i, (name, arguments) in enumerate(reply.calls)
        ]

    def chat_whole(self, reply: Reply) -> dict[str, Any]:
        """``/api/chat`` without streaming."""
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.calls:
            message["tool_calls"] = self._ollama_calls(reply)
        return {"model": MODEL, "message": message, **_FINAL}

    def chat_lines(self, reply: Reply) -> Iterator[bytes]:
        """``/api/chat``'s NDJSON: reasoning, the text in two pieces, the calls, the end."""

        def line(message: dict[str, Any], **extra: Any) -> bytes:
            data = {"model": MODEL, "message": {"role": "assistant", **message}, **extra}
            return json.dumps(data).encode() + b"\n"

        if reply.thinking:
            yield line({"content": "", "thinking": reply.thinking}, done=False)
        half = len(reply.content) // 2
        for piece in (reply.content[:half], reply.content[half:]):
            if piece:
                yield line({"content": piece}, done=False)
        if reply.calls:
            yield line({"content": "", "tool_calls": self._ollama_calls(reply)}, done=False)
        yield line({"content": ""}, **_FINAL)

    def sse_events(self, reply: Reply) -> Iterator[bytes]:
        """``/v1/chat/completions``' SSE: text, calls (arguments as a JSON string), usage."""

        def event(data: dict[str, Any]) -> bytes:
            return b"data: " + json.dumps(data).encode() + b"\n\n"

        base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": MODEL}
        if reply.content:
            delta = {"role": "assistant", "content": reply.content}
            yield event({**base, "choices": [{"index": 0, "delta": delta}]})
        calls = [
            {
                "index": i,
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
            for i, (name, arguments) in enumerate(reply.calls)
        ]
        finish = "tool_calls" if calls else "stop"
        delta = {"tool_calls": calls} if calls else {}
        yield event({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        usage = {
            "prompt_tokens": 40,
            "completion_tokens": 6,
            "total_tokens": 46,
            "prompt_tokens_details": {"cached_tokens": 12},
            "timings": {
                "ttft_ms": 10.0,
                "queued_ms": 0.0,
                "prompt_ms": 8.0,
                "prompt_tokens_per_s": 3500.0,
                "decode_ms": 12.0,
                "decode_tokens_per_s": 500.0,
                "load_ms": 1.0,
            },
        }
        yield event({**base, "choices": [], "usage": usage})
        yield b"data: [DONE]\n\n"
