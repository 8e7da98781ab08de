"""A runner killed mid-stream (SIGKILL, or SIGILL as a fault in llama.cpp's native code would), on
both API families: the stream ends with an error event that names the signal, and the next
request is served by a new runner process (``/api/ps`` shows its pid)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from test_daemon_support import Daemon, running_daemon
from test_fault_support import StreamEnd, create_from_file, read_stream
from tiny_gguf import write_tiny_gguf

pytestmark = pytest.mark.slow

MODEL = "endless:kill"
TIMEOUT = 60.0  # seconds for any request to end; the stream is killed after its first chunk
MESSAGES = [{"role": "user", "content": "a long answer, please"}]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    folder = tmp_path_factory.mktemp("kill")
    gguf = write_tiny_gguf(folder / "endless.gguf", never_ends=True)
    with running_daemon(folder / "home", num_parallel=2, num_threads=1, context_length=2048) as d:
        with d.http() as http:
            create_from_file(http, MODEL, gguf)
        yield d


def _runner_pid(http: httpx.Client) -> int:
    models = {m["name"]: m for m in http.get("/api/ps").json()["models"]}
    pid = models[MODEL]["runner_pid"]
    assert isinstance(pid, int) and pid > 0
    return pid


def _load(http: httpx.Client) -> int:
    """Load the model (an empty generate); the runner's pid."""
    loaded = http.post("/api/generate", json={"model": MODEL}, timeout=TIMEOUT)
    assert loaded.status_code == 200, loaded.text
    return _runner_pid(http)


def _has_text(event: Any) -> bool:
    if not isinstance(event, dict):
        return False
    if event.get("response") or (event.get("message") or {}).get("content"):
        return True
    return any((c.get("delta") or {}).get("content") for c in event.get("choices") or [])


async def _killed_stream(url: str, family: str, pid: int, signum: int) -> StreamEnd:
    """A long stream whose runner gets ``signum`` as soon as text arrives; read to its end."""

    def kill_on_first_text(event: Any) -> None:
        if _has_text(event) and not killed:
            killed.append(pid)
            os.kill(pid, signum)

    killed: list[int] = []
    async with (
        httpx.AsyncClient(base_url=url, timeout=TIMEOUT) as http,
        asyncio.timeout(TIMEOUT),
    ):
        if family == "ollama":
            body: dict[str, Any] = {
                "model": MODEL,
                "messages": MESSAGES,
                "options": {"num_predict": 100000},
            }
            end = await read_stream(http, "/api/chat", body, kill_on_first_text)
        else:
            body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 100000, "stream": True}
            end = await read_stream(http, "/v1/chat/completions", body, kill_on_first_text)
    assert killed, "no text streamed before the end"
    return end


@pytest.mark.parametrize(
    ("family", "signum"),
    [("ollama", signal.SIGKILL), ("openai", signal.SIGILL), ("ollama", signal.SIGILL)],
    ids=["ollama-SIGKILL", "openai-SIGILL", "ollama-SIGILL"],
)
def test_killed_runner_ends_the_stream_with_an_error_and_a_new_runner_serves(
    daemon: Daemon, family: str, signum: signal.Signals
) -> None:
    with daemon.http() as http:
        pid = _load(http)
        end = asyncio.run(_killed_stream(daemon.url, family, pid, signum))
        assert end.status == 200
        assert not end.finished, "a killed stream must not look complete"
        assert end.error is not None, f"the stream ended without an error event: {end.final}"
        message = end.error if family == "ollama" else end.error["message"]
        assert "runner" in message and "Traceback" not in message, message
        # How it died, by name, and the cause line of its log.
        assert f"was killed by {signum.name}" in message, message
        assert "runner-" in message and ".log" in message, message
        if signum == signal.SIGILL:
            assert "illegal instruction" in message, message
            # The runner's fault handler wrote its line before the signal took the process.
            assert "Fatal Python error: Illegal instruction" in message, message
        if family == "openai":
            assert end.error["type"] and end.error["code"] == "runner_died", end.error
        assert not end.after_end, end.after_end

        # The next request loads the model again, in a new process, and is answered.
        if family == "ollama":
            answer = http.post(
                "/api/chat",
                json={
                    "model": MODEL,
                    "messages": MESSAGES,
                    "stream": False,
                    "options": {"num_predict": 5},
                },
                timeout=TIMEOUT,
            )
            assert answer.status_code == 200, answer.text
            assert answer.json()["eval_count"] == 5
        else:
            answer = http.post(
                "/v1/chat/completions",
                json={"model": MODEL, "messages": MESSAGES, "max_tokens": 5},
                timeout=TIMEOUT,
            )
            assert answer.status_code == 200, answer.text
            assert answer.json()["usage"]["completion_tokens"] == 5
        new_pid = _runner_pid(http)
        assert new_pid != pid
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # the killed runner was reaped, not left a zombie
