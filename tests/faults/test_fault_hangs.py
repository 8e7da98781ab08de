"""Requests that used to never end (issue 10), each answered with a clear 4xx within seconds,
and Ollama's documented "all options" request, whose ``num_batch: 2`` used to abort the runner.

Every request here has a client timeout: a request that does not end within it fails the
test ("every request ends"), whatever a client with no timeout would have done.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from test_daemon_support import Daemon, running_daemon
from test_fault_support import create_from_file, short_answer
from tiny_gguf import write_tiny_gguf

pytestmark = pytest.mark.slow

MODEL = "tiny:hangs"
TIMEOUT = 20.0  # seconds: far more than any of these needs; hitting it is the failure
CTX = 256
MISSING_REF = {"type": "object", "properties": {"a": {"$ref": "#/definitions/missing"}}}
# JSON text with a lone surrogate escape: valid JSON, but no UTF-8 can hold it.
SURROGATE_PROMPT = '"hi \\ud800 there"'


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    folder = tmp_path_factory.mktemp("hangs")
    gguf = write_tiny_gguf(folder / "tiny.gguf")
    with running_daemon(folder / "home", num_parallel=4, num_threads=1, context_length=CTX) as d:
        with d.http() as http:
            create_from_file(http, MODEL, gguf)
        yield d


@pytest.fixture
def http(daemon: Daemon) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=daemon.url, timeout=TIMEOUT) as client:
        yield client


def _message(response: httpx.Response) -> str:
    error = response.json()["error"]
    return error["message"] if isinstance(error, dict) else error


def _streamed_end(http: httpx.Client, path: str, **kwargs: Any) -> tuple[int, list[Any]]:
    """Status and NDJSON lines of a streamed request, read to its end (or the timeout)."""
    with http.stream("POST", path, **kwargs) as response:
        if response.status_code != 200:
            response.read()
            return response.status_code, [response.json()]
        return 200, [json.loads(line) for line in response.iter_lines() if line.strip()]


def _assert_ends_with_error(status: int, lines: list[Any], fragment: str) -> None:
    """A streamed request refused: a 4xx, or (once streaming began) a last error line."""
    if status != 200:
        assert 400 <= status < 500, (status, lines)
        assert fragment in json.dumps(lines[-1]), lines
        return
    assert lines and "error" in lines[-1], lines[-3:]
    assert fragment in lines[-1]["error"], lines[-1]


def _serves(http: httpx.Client) -> None:
    assert short_answer(http, MODEL, "still there?")["done"] is True


def test_chat_with_a_schema_the_grammar_converter_rejects(http: httpx.Client) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "format": MISSING_REF,
    }
    response = http.post("/api/chat", json={**body, "stream": False})
    assert response.status_code == 400, response.text
    assert "schema" in _message(response) or "format" in _message(response), response.text
    status, lines = _streamed_end(http, "/api/chat", json=body)
    _assert_ends_with_error(status, lines, "")
    # The OpenAI family takes the schema in response_format.
    openai = http.post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": MISSING_REF},
            },
        },
    )
    assert openai.status_code == 400, openai.text
    _serves(http)


def test_generate_with_a_lone_surrogate_in_the_prompt(http: httpx.Client) -> None:
    raw = f'{{"model": "{MODEL}", "prompt": {SURROGATE_PROMPT}, "stream": false}}'.encode()
    response = http.post("/api/generate", content=raw, headers={"Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    assert "prompt" in _message(response), response.text
    streamed = f'{{"model": "{MODEL}", "prompt": {SURROGATE_PROMPT}}}'.encode()
    status, lines = _streamed_end(http, "/api/generate", content=streamed)
    _assert_ends_with_error(status, lines, "prompt")
    # The same in a chat message and in OpenAI's completions.
    chat = (
        f'{{"model": "{MODEL}", "stream": false, '
        f'"messages": [{{"role": "user", "content": {SURROGATE_PROMPT}}}]}}'
    ).encode()
    assert http.post("/api/chat", content=chat).status_code == 400
    completion = f'{{"model": "{MODEL}", "prompt": {SURROGATE_PROMPT}}}'.encode()
    assert http.post("/v1/completions", content=completion).status_code == 400
    _serves(http)


def test_embed_without_truncation_of_an_input_longer_than_the_context(
    http: httpx.Client,
) -> None:
    long_input = "the sky is blue " * CTX  # several times the context
    response = http.post(
        "/api/embed", json={"model": MODEL, "input": long_input, "truncate": False}
    )
    assert response.status_code == 400, response.text
    assert "context" in _message(response), response.text
    # With truncation (the default) the same input is embedded.
    truncated = http.post("/api/embed", json={"model": MODEL, "input": long_input})
    assert truncated.status_code == 200, truncated.text
    assert len(truncated.json()["embeddings"]) == 1
    _serves(http)


def test_a_keep_alive_shorter_than_the_load_still_answers(http: httpx.Client) -> None:
    # Found by fuzzing: a keep_alive that expires before the request that loaded the model
    # takes its slot unloaded the model under it, and the request loaded it again, for ever.
    # The request is answered; the model goes away once it is done.
    http.post("/api/generate", json={"model": MODEL, "keep_alive": 0})  # not loaded now
    for path, body in (
        ("/api/generate", {"prompt": "x", "stream": False, "options": {"num_predict": 2}}),
        ("/api/embed", {"input": "x"}),
    ):
        response = http.post(path, json={"model": MODEL, "keep_alive": 1e-9, **body})
        assert response.status_code == 200, response.text
    _serves(http)


# Ollama's API documentation, "Generate request (With options)": every option at once.
ALL_OPTIONS: dict[str, Any] = {
    "num_keep": 5,
    "seed": 42,
    "num_predict": 100,
    "top_k": 20,
    "top_p": 0.9,
    "min_p": 0.0,
    "typical_p": 0.7,
    "repeat_last_n": 33,
    "temperature": 0.8,
    "repeat_penalty": 1.2,
    "presence_penalty": 1.5,
    "frequency_penalty": 1.0,
    "penalize_newline": True,
    "stop": ["\n", "user:"],
    "numa": False,
    "num_ctx": 1024,
    "num_batch": 2,
    "num_gpu": 1,
    "main_gpu": 0,
    "use_mmap": True,
    "num_thread": 8,
}


def test_ollama_all_options_example_does_not_crash_the_runner(
    daemon: Daemon, http: httpx.Client
) -> None:
    # num_batch 2 is below the slot count (4): llama.cpp asserts n_batch >= n_seq_max and
    # aborts. The daemon clamps it (a 200) or refuses it naming the option (a 400).
    body = {"model": MODEL, "prompt": "Why is the sky blue?", "stream": False}
    response = http.post("/api/generate", json={**body, "options": ALL_OPTIONS}, timeout=120)
    assert response.status_code < 500, response.text
    if response.status_code == 200:
        assert response.json()["done"] is True
        assert "gdb" not in response.text
        models = http.get("/api/ps").json()["models"]
        assert [m["name"] for m in models] == [MODEL]  # its runner is alive and listed
    else:
        assert response.status_code == 400, response.text
        assert "num_batch" in _message(response) or "options." in _message(response)
    assert daemon.process.poll() is None
    _serves(http)
