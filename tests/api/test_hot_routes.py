"""The generation routes served past FastAPI's per-request machinery (``daemon/api/hotroutes.py``)
answer as FastAPI's own routes do: the same status, headers and body for every bad body (handed
back to FastAPI) and for a request the endpoint refuses, the same route in the metrics; the
routes whose family renders errors its own way stay FastAPI's."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from localllm.daemon.api import anthropic, llamaserver, openai
from localllm.daemon.api.hotroutes import HotRoutes, hot_route
from localllm.daemon.app import _hot_routes, _post_route, create_app
from localllm.daemon.state import DaemonState
from localllm.settings import Settings

BASE = "http://127.0.0.1:11435"  # a Host the daemon's guard lets in

MESSAGES = [{"role": "user", "content": "hi"}]
BODIES: list[tuple[str, bytes]] = [
    ("/v1/chat/completions", b"model=smollm2&prompt=hi"),  # not JSON
    ("/v1/chat/completions", b""),  # no body
    ("/v1/chat/completions", b"[1, 2]"),  # JSON, not an object
    ("/v1/chat/completions", json.dumps({"messages": MESSAGES}).encode()),  # no model
    ("/chat/completions", json.dumps({"model": 3, "messages": "hi"}).encode()),
    ("/v1/completions", json.dumps({"model": "m", "prompt": {"a": 1}}).encode()),
    ("/completions", b"{"),
    ("/api/chat", b"[" * 100_000 + b"]" * 100_000),  # too deep for json.loads
    ("/api/chat", json.dumps({"model": "m", "messages": [{"content": "hi"}]}).encode()),
    ("/api/generate", json.dumps({"model": "m", "options": "fast"}).encode()),
    # valid bodies for a model that is not there: the endpoint runs and refuses (404)
    ("/v1/chat/completions", json.dumps({"model": "nope", "messages": MESSAGES}).encode()),
    ("/completions", json.dumps({"model": "nope", "prompt": "hi"}).encode()),
    ("/api/chat", json.dumps({"model": "nope", "messages": MESSAGES}).encode()),
    ("/api/generate", json.dumps({"model": "nope", "prompt": "hi"}).encode()),
]


def _fastapi_only(settings: Settings) -> FastAPI:
    """The daemon's app with FastAPI's own stack: no hot routes in front of the router."""
    app = create_app(settings, DaemonState.create(settings))
    app.middleware_stack = FastAPI.build_middleware_stack(app)
    return app


def _answer(client: TestClient, path: str, body: bytes) -> tuple[int, dict[str, str], Any]:
    response = client.post(path, content=body, headers={"content-type": "application/json"})
    headers = {k: v for k, v in response.headers.items() if k not in ("date", "server")}
    try:
        return response.status_code, headers, response.json()
    except ValueError:
        return response.status_code, headers, response.text


def _requests_counted(app: FastAPI) -> dict[tuple[str, ...], float]:
    """The app's http_requests counter by labels (method, route, status)."""
    counter = app.state.daemon.metrics.http_requests
    return {
        tuple(sample.labels.values()): sample.value
        for metric in counter.collect()
        for sample in metric.samples
        if sample.name.endswith("_total")
    }


def test_the_hot_routes_are_the_generation_routes(settings: Settings) -> None:
    app = create_app(settings, DaemonState.create(settings))
    stack: Any = app.build_middleware_stack()
    while not isinstance(stack, HotRoutes):
        stack = stack.app
    assert stack.app is app.router
    assert sorted(stack.routes) == sorted(_hot_routes())
    assert sorted(stack.routes) == [
        "/api/chat",
        "/api/generate",
        "/chat/completions",
        "/completions",
        "/v1/chat/completions",
        "/v1/completions",
    ]


def test_a_family_that_renders_its_own_errors_stays_with_fastapi() -> None:
    # Anthropic's route class answers a bad body in Anthropic's shape: only FastAPI's route
    # class is served past it.
    assert hot_route(_post_route(anthropic.router, "/messages")) is None
    assert hot_route(_post_route(openai.router, "/chat/completions")) is not None
    # a route answering with a value to serialize (not a response) stays FastAPI's
    assert hot_route(_post_route(llamaserver.router, "/tokenize")) is None


@pytest.mark.parametrize(("path", "body"), BODIES)
def test_every_answer_is_fastapis_word_for_word(settings: Settings, path: str, body: bytes) -> None:
    hot = create_app(settings, DaemonState.create(settings))
    plain = _fastapi_only(settings)
    with TestClient(hot, base_url=BASE) as one, TestClient(plain, base_url=BASE) as other:
        answer = _answer(one, path, body)
        assert answer == _answer(other, path, body)
    assert answer[0] in (400, 404, 422)
    # counted under the same route (the route's own path) and status
    assert _requests_counted(hot) == _requests_counted(plain)
    assert any(labels[1] != "unmatched" for labels in _requests_counted(hot))
