"""Hostile GGUF files against a real daemon: every crafted file of ``hostile_gguf`` is refused
with a clear 4xx on every way in, each request ends, and the daemon stays up.

Ways in: an uploaded blob given to ``/api/create`` (``files``), a path given to
``/api/create`` (``from``, as ``localllm create --from`` does), and a model pulled from a
registry (the loopback fake) whose GGUF layer is the crafted file, then asked for with
``/api/show``, ``/api/generate`` and ``/v1/chat/completions``. A pull checks digests, not
GGUF headers, so such a model is in the store; llama.cpp must still never see the file.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fakes.helpers import registry_config
from fakes.ollama_registry import FakeRegistry
from hostile_gguf import HostileCase, hostile_corpus
from test_daemon_support import Daemon, running_daemon
from test_fault_support import create_from_file

pytestmark = pytest.mark.slow

MEDIA_MODEL = "application/vnd.ollama.image.model"
TIMEOUT = 30.0  # seconds; every request here must end well within it
CASES = sorted(hostile_corpus(bytes(4096)))  # the case names (the bytes come from a fixture)


def _digest(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


@pytest.fixture(scope="module")
def corpus(tiny_gguf: Path) -> dict[str, HostileCase]:
    return hostile_corpus(tiny_gguf.read_bytes())


@pytest.fixture(scope="module")
def registry(corpus: dict[str, HostileCase]) -> Iterator[FakeRegistry]:
    with FakeRegistry() as server:
        for name, case in corpus.items():
            server.add_model(
                f"hostile/{name}", "latest", registry_config("F32"), [(MEDIA_MODEL, case.data)]
            )
        yield server


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, registry: FakeRegistry, tiny_gguf: Path
) -> Iterator[Daemon]:
    home = tmp_path_factory.mktemp("hostile") / "home"
    with running_daemon(home, num_parallel=1, num_threads=1, registry=registry.url) as d:
        with d.http() as http:
            create_from_file(http, "good:model", tiny_gguf)
        yield d


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, corpus: dict[str, HostileCase]) -> Path:
    folder = tmp_path_factory.mktemp("hostile-files")
    for name, case in corpus.items():
        (folder / f"{name}.gguf").write_bytes(case.data)
    return folder


def _refused(response: httpx.Response, what: str) -> str:
    """A 4xx whose body names the problem; returns the message."""
    assert 400 <= response.status_code < 500, f"{what}: {response.status_code} {response.text}"
    error = response.json()["error"]
    message = error["message"] if isinstance(error, dict) else error
    assert isinstance(message, str) and message.strip(), f"{what}: {response.text}"
    assert "Traceback" not in message, message
    return message


def _still_serves(daemon: Daemon, http: httpx.Client) -> None:
    assert daemon.process.poll() is None, "the daemon died"
    assert http.get("/api/version").status_code == 200
    answer = http.post(
        "/api/generate",
        json={
            "model": "good:model",
            "prompt": "abc",
            "raw": True,
            "stream": False,
            "options": {"num_predict": 2},
        },
    )
    assert answer.status_code == 200, answer.text


@pytest.mark.parametrize("case", CASES)
def test_hostile_gguf_is_refused_on_every_way_in(
    daemon: Daemon, corpus: dict[str, HostileCase], files: Path, case: str
) -> None:
    data = corpus[case].data
    digest = _digest(data)
    with httpx.Client(base_url=daemon.url, timeout=TIMEOUT) as http:
        # 1. uploaded as a blob (any bytes are a blob), then named in a create
        uploaded = http.post(f"/api/blobs/{digest}", content=data)
        assert uploaded.status_code == 201, uploaded.text
        message = _refused(
            http.post(
                "/api/create",
                json={"model": f"up-{case}", "files": {"model.gguf": digest}, "stream": False},
            ),
            "create from an uploaded blob",
        )
        assert "GGUF" in message or "model" in message, message
        # 2. a path, as `localllm create --from FILE` sends it (streamed progress)
        with http.stream(
            "POST",
            "/api/create",
            json={"model": f"path-{case}", "from": str(files / f"{case}.gguf")},
        ) as response:
            if response.status_code == 200:  # refused after streaming began: a last error line
                lines = [json.loads(line) for line in response.iter_lines() if line.strip()]
                raise AssertionError(f"create from a path was accepted: {lines[-3:]}")
            response.read()
            _refused(response, "create from a path")
        for name in (f"up-{case}", f"path-{case}"):
            assert http.post("/api/show", json={"model": name}).status_code == 404

        # 3. pulled from a registry, then used
        pulled = http.post("/api/pull", json={"model": f"hostile/{case}", "stream": False})
        if pulled.status_code == 200:
            model = f"hostile/{case}"
            shown = http.post("/api/show", json={"model": model})
            if corpus[case].structural:
                _refused(shown, "show")
            else:
                assert shown.status_code < 500, shown.text
            body: dict[str, Any] = {"model": model, "prompt": "hi", "stream": False}
            _refused(http.post("/api/generate", json=body), "generate")
            chat = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
            _refused(http.post("/v1/chat/completions", json=chat), "chat completion")
            tags = http.get("/api/tags")
            assert tags.status_code == 200, tags.text  # listing the store still works
        else:
            _refused(pulled, "pull")
        _still_serves(daemon, http)
