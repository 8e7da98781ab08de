"""A client that stops reading its stream: others go on, and the daemon stops producing for it.

The paused client is a raw socket on the daemon's Unix socket that sends a streaming request
for a long answer (8,000 tokens of the tiny model that never ends by itself) and never reads.
A Unix socket holds only a few hundred NDJSON lines in the kernel, and uvicorn stops the
response at its 64 KiB write buffer: about a thousand tokens, after which only the daemon's
own buffering decides how much more is produced for nobody. Bounded per-connection buffering
means the runner must stop generating for that request, by pausing it (its token count stops
moving while other streams run) or cancelling it (its slot goes idle long before 8,000
tokens). Generating all 8,000 tokens into a queue nobody drains is the failure.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from test_daemon_support import Daemon, running_daemon, wait_for_stats
from test_fault_support import create_from_file, rss_bytes
from tiny_gguf import write_tiny_gguf

pytestmark = pytest.mark.slow

MODEL = "endless:long"
ASKED = 8000
# Tokens a paused request may have produced in all: what the kernel and uvicorn absorb
# (about 1,000) plus a per-connection buffer of the daemon's choosing. Half of what was asked.
BOUND = ASKED // 2
# The daemon's memory may grow this much while the reader is paused (buffers are bounded).
RSS_BOUND = 32 << 20
DEADLINE = 120.0  # seconds; a bound on waiting for a condition, never a delay


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    folder = tmp_path_factory.mktemp("paused")
    gguf = write_tiny_gguf(folder / "endless-8k.gguf", never_ends=True, context_length=8192)
    with running_daemon(folder / "home", num_parallel=2, num_threads=1, context_length=8192) as d:
        with d.http() as http:
            create_from_file(http, MODEL, gguf)
        yield d


def _paused_request(daemon: Daemon) -> socket.socket:
    """Send a streaming request for a long answer on the Unix socket; never read from it."""
    body = json.dumps(
        {"model": MODEL, "prompt": "paused reader:", "raw": True, "options": {"num_predict": ASKED}}
    ).encode()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(str(daemon.settings.socket_path))
    sock.sendall(
        b"POST /api/generate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    return sock


def _busy(snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    """The slots of a stats snapshot that serve a request."""
    slots = [slot for m in snapshot["models"] for slot in m.get("slots", [])]
    return [slot for slot in slots if slot["state"] != "idle"]


def _busy_slots(http: httpx.Client) -> list[dict[str, Any]]:
    return _busy(http.get("/api/stats").json())


def _probe(http: httpx.Client, tokens: int) -> None:
    """Another client's whole request, which must complete meanwhile."""
    answer = http.post(
        "/api/generate",
        json={
            "model": MODEL,
            "prompt": "another client:",
            "raw": True,
            "stream": False,
            "options": {"num_predict": tokens},
        },
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["eval_count"] == tokens


def test_a_paused_reader_neither_blocks_others_nor_is_served_without_bound(
    daemon: Daemon,
) -> None:
    pid = daemon.process.pid
    with daemon.http() as http:
        _probe(http, 4)  # the model is loaded
        rss_before = rss_bytes(pid)
        paused = _paused_request(daemon)
        try:
            started = wait_for_stats(daemon, lambda snapshot: bool(_busy(snapshot)), DEADLINE)
            request_id = _busy(started)[0]["request_id"]
            deadline = time.monotonic() + DEADLINE

            _probe(http, 16)  # not blocked by the paused stream

            seen = 0
            verdict = None
            while verdict is None:
                assert time.monotonic() < deadline, f"no verdict within {DEADLINE}s ({seen})"
                ours = [s for s in _busy_slots(http) if s["request_id"] == request_id]
                if not ours:
                    # It ended: cancelled early by the daemon, or it ran to the end.
                    assert seen < BOUND, (
                        f"the daemon had {seen}+ of {ASKED} tokens generated for a client "
                        "that reads nothing (nothing bounds what it buffers per connection)"
                    )
                    verdict = "cancelled"
                    break
                before = ours[0]["generated_tokens"]
                seen = max(seen, before)
                _probe(http, 32)  # 32+ engine steps for another stream
                ours = [s for s in _busy_slots(http) if s["request_id"] == request_id]
                if ours and ours[0]["generated_tokens"] == before:
                    verdict = "paused"
                seen = max([seen, *(s["generated_tokens"] for s in ours)])
                assert seen < BOUND, (
                    f"the daemon had {seen} of {ASKED} tokens generated for a client that "
                    "reads nothing (nothing bounds what it buffers per connection)"
                )
            grown = rss_bytes(pid) - rss_before
            assert grown < RSS_BOUND, f"daemon RSS grew by {grown >> 20} MiB ({verdict})"
        finally:
            paused.close()

        # The client is gone: its slot is given back, and everybody is served.
        wait_for_stats(
            daemon,
            lambda snapshot: (
                not _busy(snapshot) and all(m["active_requests"] == 0 for m in snapshot["models"])
            ),
            DEADLINE,
        )
        _probe(http, 8)
