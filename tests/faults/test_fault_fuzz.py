"""Schemathesis over every operation of the daemon's OpenAPI document, both API families:
no request may get a server error (5xx), and every request must end within a client timeout.

Extends the fuzzing in ``test_daemon_security.py`` (20 examples, endless streams and pulls
left out) to all operations, pulls and the live stats stream included:

* the registry and the Hugging Face endpoint are loopback fakes, so a fuzzed pull is answered
  (404 for unknown names) instead of failing on a network that tests do not have;
* half of the generated requests that name a model are pointed at a real one (the tiny GGUF),
  so fuzzed options, formats, messages and prompts reach the runner; a fuzzed ``num_predict``
  or ``max_tokens`` can be huge, and the context (64 tokens unless ``num_ctx`` asks for more,
  up to the model's 4,096) is what bounds the answer;
* ``/api/stats?stream=true`` never ends by design: its first line is read, then it is closed.

A request that does not end within ``TIMEOUT`` fails the test: "every request ends".
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from fakes.helpers import registry_config, registry_layers
from fakes.hf_hub import FakeHub
from fakes.ollama_registry import FakeRegistry
from hypothesis import HealthCheck, Phase, settings
from test_daemon_support import Daemon, running_daemon
from test_fault_support import create_from_file

from localllm.daemon.app import create_app
from localllm.settings import Settings

pytestmark = pytest.mark.slow

MODEL = "tiny:fuzz"
TIMEOUT = 60.0  # seconds for one request to end, whatever was asked
EXAMPLES = 25  # per operation
# Operations whose body names a model to run or describe.
MODEL_OPERATIONS = {
    "/api/show",
    "/api/generate",
    "/api/chat",
    "/api/embed",
    "/api/embeddings",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/responses",
    "/tokenize",
    "/detokenize",
    "/infill",
}

RELOADING_OPTIONS = ("num_ctx", "num_batch", "num_thread", "num_gpu")

schema = schemathesis.openapi.from_dict(create_app(Settings()).openapi())
# The schema's examples, then EXAMPLES fuzzed cases per operation, valid and invalid ones.
# (The coverage phase's thousands of boundary cases would take minutes on two cores.)
schema.config.phases.update(phases=["examples", "fuzzing"])


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Daemon]:
    with FakeRegistry() as registry, FakeHub() as hub, pytest.MonkeyPatch.context() as env:
        registry.add_model(
            "library/tiny",
            "latest",
            registry_config("F32"),
            registry_layers(tiny_gguf.read_bytes()),
        )
        env.setenv("HF_ENDPOINT", hub.url)  # the daemon inherits it
        home = tmp_path_factory.mktemp("fuzz") / "home"
        with running_daemon(
            home, num_parallel=2, num_threads=1, context_length=64, registry=registry.url
        ) as d:
            with d.http() as http:
                create_from_file(http, MODEL, tiny_gguf)
            yield d


def _point_at_a_real_model(case: Any) -> None:
    """For half of the bodies that name a model (chosen by the name), name the tiny one.

    Options that reload the runner (num_ctx, num_batch, num_thread, num_gpu) or unload it
    (keep_alive) cost a process start each; they stay in one of four such requests, which
    keeps the runtime bounded and still fuzzes them.
    """
    body = case.body
    if case.path not in MODEL_OPERATIONS or not isinstance(body, dict) or "model" not in body:
        return
    digest = hashlib.sha256(json.dumps(body.get("model"), default=str).encode()).digest()
    if digest[0] % 2:
        return
    body["model"] = MODEL
    if digest[1] % 4 == 0:
        return
    body.pop("keep_alive", None)
    options = body.get("options")
    if isinstance(options, dict):
        for key in RELOADING_OPTIONS:
            options.pop(key, None)


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: a failure is reported as found
)
def test_every_operation_never_gets_a_server_error(case: Any, daemon: Daemon) -> None:
    _point_at_a_real_model(case)
    endless = case.path == "/api/stats"
    what = f"{case.method} {case.formatted_path} {case.query or ''} {str(case.body)[:300]}"
    try:
        if endless:
            # Read the first line, then close: requests' read timeout never fires on a
            # stream that sends a line every interval.
            kwargs = case.as_transport_kwargs(base_url=daemon.url)
            with requests.request(**kwargs, timeout=TIMEOUT, stream=True) as response:
                if response.status_code == 200:
                    assert next(response.iter_lines(), None), what  # the first snapshot
                else:
                    response.content  # noqa: B018 (an error body ends: read it)
        else:
            response = case.call(base_url=daemon.url, timeout=TIMEOUT)
    except requests.Timeout:
        pytest.fail(f"no answer within {TIMEOUT:.0f}s: {what}")
    assert response.status_code < 500, f"{what}\n-> {response.status_code} {response.text[:500]}"
    assert daemon.process.poll() is None, f"the daemon died: {what}"
