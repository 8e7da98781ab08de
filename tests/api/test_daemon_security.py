"""Security defaults and hostile input on a real daemon: Host and Origin checks, the API key,
loopback-only binding, socket permissions, malformed bodies, and schemathesis fuzzing of the
OpenAPI document for both API families."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from test_daemon_support import Daemon, free_port, run_daemon_expecting_failure, running_daemon

from localllm._exceptions import APIError
from localllm.client import Client
from localllm.daemon.app import create_app
from localllm.daemon.security import GuardMiddleware
from localllm.settings import Settings

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    home = tmp_path_factory.mktemp("security") / "home"
    with running_daemon(
        home, num_threads=1, origins="app://obsidian.md,https://*.example.org"
    ) as d:
        yield d


# -- Host and Origin --------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["evil.example", "evil.example:11435", "192.168.1.10", "[::2]"])
def test_non_loopback_host_header_is_refused(http: httpx.Client, host: str) -> None:
    response = http.get("/api/tags", headers={"Host": host})
    assert response.status_code == 403
    assert "not allowed" in response.json()["error"]
    openai_shaped = http.get("/v1/models", headers={"Host": host})
    assert openai_shaped.status_code == 403
    assert openai_shaped.json()["error"]["type"] == "permission_error"


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1:8080", "[::1]:11435", "app.localhost"])
def test_loopback_host_headers_pass(http: httpx.Client, host: str) -> None:
    assert http.get("/api/tags", headers={"Host": host}).status_code == 200


def test_origins(http: httpx.Client) -> None:
    refused = http.get("/api/tags", headers={"Origin": "https://evil.example"})
    assert refused.status_code == 403
    for origin in ("http://localhost:3000", "app://obsidian.md", "https://notes.example.org"):
        allowed = http.get("/api/tags", headers={"Origin": origin})
        assert allowed.status_code == 200
        assert allowed.headers["access-control-allow-origin"] == origin
    preflight = http.options(
        "/api/chat",
        headers={
            "Origin": "http://127.0.0.1:5173",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type",
        },
    )
    assert preflight.status_code == 200
    assert "POST" in preflight.headers["access-control-allow-methods"]


def test_socket_is_private(daemon: Daemon) -> None:
    mode = stat.S_IMODE(os.stat(daemon.settings.socket_path).st_mode)
    assert mode == 0o600
    assert daemon.client().version()  # and it serves


# -- binding and the API key --------------------------------------------------------------------


def test_non_loopback_bind_without_key_refuses(tmp_path: Path) -> None:
    result = run_daemon_expecting_failure(tmp_path / "home", host=f"0.0.0.0:{free_port()}")
    assert result.returncode == 1
    assert "LOCALLLM_API_KEY" in result.stderr
    assert "Traceback" not in result.stderr


def test_api_key_required_everywhere_but_root(tmp_path: Path) -> None:
    with running_daemon(tmp_path / "home", api_key="s3cret-key") as daemon:
        with daemon.http() as http:
            assert http.get("/").status_code == 200
            # liveness is public, as llama-server's /health is
            assert http.get("/health").json() == {"status": "ok"}
            assert http.get("/v1/health").status_code == 200
            assert http.get("/api/tags").status_code == 401
            # the bare OpenAI routes refuse in OpenAI's shape too
            bare = http.get("/models")
            assert bare.status_code == 401
            assert bare.json()["error"]["type"] == "authentication_error"
            wrong = http.get("/api/tags", headers={"Authorization": "Bearer nope"})
            assert wrong.status_code == 401
            assert wrong.json()["error"].startswith("missing or invalid API key")
            assert http.get("/v1/models").json()["error"]["type"] == "authentication_error"
            ok = http.get("/api/tags", headers={"Authorization": "Bearer s3cret-key"})
            assert ok.status_code == 200
            # Anthropic's header, as its SDK and Claude Code send it
            assert http.get("/api/tags", headers={"x-api-key": "s3cret-key"}).status_code == 200
            assert http.get("/api/tags", headers={"x-api-key": "nope"}).status_code == 401
        # the localllm client sends the key from the settings, over either transport
        assert daemon.client().list_models()
        assert daemon.client(use_tcp=True).list_models()
        with pytest.raises(APIError) as info:
            daemon.client(api_key="wrong").list_models()
        assert info.value.status_code == 401


# -- hostile and malformed input ------------------------------------------------------------------

_HOSTILE: list[tuple[str, str, dict[str, Any]]] = [
    ("POST", "/api/generate", {"content": b"{not json"}),
    ("POST", "/api/generate", {"content": b""}),
    ("POST", "/api/generate", {"json": []}),
    ("POST", "/api/generate", {"json": {"model": 5}}),
    ("POST", "/api/generate", {"json": {"model": "../../../etc/passwd", "prompt": "x"}}),
    ("POST", "/api/generate", {"json": {"model": "a\x00b", "prompt": "x"}}),
    ("POST", "/api/generate", {"json": {"model": "smollm2:135m", "keep_alive": "soon"}}),
    ("POST", "/api/generate", {"json": {"model": "smollm2:135m", "format": 12, "prompt": "x"}}),
    ("POST", "/api/generate", {"json": {"model": "smollm2:135m", "options": {"num_ctx": "x"}}}),
    ("POST", "/api/generate", {"json": {"model": "smollm2:135m", "options": {"top_p": 7}}}),
    ("POST", "/api/generate", {"json": {"model": "smollm2:135m", "options": {"num_ctx": 10**12}}}),
    ("POST", "/api/generate", {"json": {"model": "smollm2:135m", "options": []}}),
    ("POST", "/api/generate", {"json": {"model": "smollm2:135m", "images": ["aGk="]}}),
    ("POST", "/api/chat", {"json": {"model": "smollm2:135m", "messages": "hello"}}),
    ("POST", "/api/chat", {"json": {"model": "smollm2:135m", "messages": [{"content": "x"}]}}),
    ("POST", "/api/chat", {"json": {"model": "smollm2:135m", "tools": [{"type": "function"}]}}),
    ("POST", "/api/chat", {"json": {"model": "smollm2:135m", "tools": {"a": 1}}}),
    ("POST", "/chat/completions", {"json": {"model": "smollm2:135m", "tool_choice": 5}}),
    ("POST", "/api/generate", {"content": b"model=x&prompt=y"}),
    ("POST", "/api/chat", {"json": {"model": "x" * 10_000, "messages": []}}),
    ("POST", "/api/chat", {"content": b"[" * 100_000 + b"]" * 100_000}),
    ("POST", "/api/embed", {"json": {"model": "smollm2:135m", "input": [1, 2]}}),
    ("POST", "/api/show", {"json": {"model": ""}}),
    ("POST", "/api/copy", {"json": {"source": "smollm2:135m", "destination": "../x"}}),
    ("DELETE", "/api/delete", {"json": {"model": "nothing:here"}}),
    ("POST", "/api/create", {"json": {"model": "x"}}),
    ("POST", "/api/create", {"json": {"model": "x", "from": "/etc/passwd"}}),
    ("POST", "/api/create", {"json": {"model": "x", "files": {"a.gguf": "sha256:abc"}}}),
    ("POST", "/api/create", {"json": {"model": "x", "from": "smollm2:135m", "quantize": "zz"}}),
    ("POST", "/api/blobs/sha256:..%2F..%2Fetc", {"content": b"x"}),
    ("POST", f"/api/blobs/sha256:{'0' * 64}", {"content": b"not these bytes"}),
    ("HEAD", "/api/blobs/md5:1234", {}),
    ("GET", "/api/stats?stream=true&interval=0", {}),
    ("POST", "/v1/chat/completions", {"json": {"model": "smollm2:135m"}}),
    ("POST", "/v1/chat/completions", {"json": {"model": "smollm2:135m", "messages": [{}]}}),
    (
        "POST",
        "/v1/chat/completions",
        {
            "json": {
                "model": "smollm2:135m",
                "messages": [{"role": "user", "content": "x"}],
                "n": 99,
            }
        },
    ),
    (
        "POST",
        "/v1/chat/completions",
        {
            "json": {
                "model": "smollm2:135m",
                "messages": [{"role": "user", "content": [{"type": "image_url"}]}],
            }
        },
    ),
    (
        "POST",
        "/v1/chat/completions",
        {
            "json": {
                "model": "smollm2:135m",
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "function", "function": {"name": "f"}}],
            }
        },
    ),
    ("POST", "/v1/completions", {"json": {"model": "smollm2:135m", "prompt": [[1], "b"]}}),
    ("POST", "/v1/embeddings", {"json": {"model": "smollm2:135m", "input": [[1, 10**9]]}}),
    ("POST", "/v1/embeddings", {"json": {"model": "smollm2:135m", "input": ""}}),
    ("GET", "/v1/models/..%2F..%2Fetc%2Fpasswd", {}),
    ("PUT", "/api/tags", {}),
    ("GET", "/no/such/route", {}),
]


@pytest.mark.parametrize(("method", "path", "kwargs"), _HOSTILE)
def test_hostile_input_gets_a_4xx_with_a_message(
    http: httpx.Client, method: str, path: str, kwargs: dict[str, Any]
) -> None:
    response = http.request(method, path, **kwargs)
    assert 400 <= response.status_code < 500, response.text[:300]
    if method != "HEAD":
        error = response.json()["error"]
        message = error["message"] if isinstance(error, dict) else error
        assert message and "Traceback" not in message


def test_oversized_body_is_refused_before_reading(daemon: Daemon) -> None:
    with socket.create_connection(("127.0.0.1", daemon.settings.bind_port), timeout=30) as sock:
        sock.sendall(
            b"POST /api/chat HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1099511627776\r\n\r\n{"
        )
        status_line = sock.makefile("rb").readline()
    assert status_line.split()[1] == b"413"


def test_invalid_field_is_named(http: httpx.Client) -> None:
    response = http.post(
        "/api/generate", json={"model": "smollm2:135m", "prompt": "x", "options": {"top_p": 7}}
    )
    assert response.status_code == 400
    assert "options.top_p" in response.json()["error"]
    response = http.post(
        "/v1/chat/completions",
        json={"model": "smollm2:135m", "messages": [{"role": "robot", "content": "x"}]},
    )
    assert response.json()["error"]["param"] == "messages[0].role"


# -- schemathesis ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def openapi_schema() -> Any:
    """The daemon's OpenAPI document as schemathesis reads it. A fixture, not a module global:
    schemathesis then builds its cases (the coverage phase's boundary values, ~2.5 s of CPU)
    in the worker that runs the test, not in every worker's collection."""
    return schemathesis.openapi.from_dict(create_app(Settings()).openapi())


# A lazy schema applies its own filters (the fixture's schema is filtered again with these).
_schema = schemathesis.pytest.from_fixture("openapi_schema").exclude(
    # endless streams and the network (pulls, the Hub's search and files) are not for a
    # fuzzer here: test_fault_fuzz.py fuzzes them against loopback fakes
    path_regex=r"^/api/(stats|pull|search|hub/show)$"
)


@_schema.parametrize()
@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_fuzzed_requests_never_get_a_server_error(case: Any, daemon: Daemon) -> None:
    response = case.call(base_url=daemon.url, timeout=60)
    assert response.status_code < 500, f"{case.method} {case.path}: {response.text[:300]}"


def test_client_reports_unavailable_daemon(tmp_path: Path) -> None:
    from localllm._exceptions import DaemonUnavailableError

    settings_ = Settings.from_env({"LOCALLLM_HOME": str(tmp_path)})
    with pytest.raises(DaemonUnavailableError) as info:
        Client(settings_).list_models()
    assert "localllm serve" in str(info.value)
    assert not Client(settings_).is_running()


def test_the_guard_reads_the_last_of_a_repeated_header_whatever_its_case() -> None:
    guard = GuardMiddleware(None, Settings(api_key="k"))  # type: ignore[arg-type]

    def refused(*headers: tuple[bytes, bytes]) -> int | None:
        scope = {"method": "POST", "path": "/api/chat", "server": ("127.0.0.1", 11435)}
        refusal = guard.refusal({**scope, "headers": list(headers)})
        return None if refusal is None else refusal[0]

    good, evil = (b"host", b"127.0.0.1:11435"), (b"Host", b"evil.example")
    key = (b"Authorization", b"Bearer k")
    assert refused(good, key) is None
    assert refused(good, evil, key) == 403  # the last Host counts, as before
    assert refused(evil, good, key) is None
    for _ in range(2):  # a Host's answer is kept: asked again, the same
        assert refused((b"HOST", b"evil.example"), key) == 403
        assert refused((b"host", b"localhost"), key) is None
    assert refused(good, (b"authorization", b"Bearer no")) == 401
    assert refused(good, key, (b"Origin", b"https://evil.example")) == 403
    assert refused(good, key, (b"content-length", b"999999999999")) == 413
