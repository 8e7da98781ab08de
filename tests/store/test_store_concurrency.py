"""Concurrent changes of the store through a real daemon: each ends with a defined result.

* two creates of one name: the second is refused at once (409, naming what holds the name);
  once the first is done, the name can be created again;
* two pulls of one model: one download, two waiters, both succeed; a create of the name being
  pulled is a 409;
* ``rm`` of a model that is answering: the name goes at once (404 from then on), the answer
  finishes whole, the blobs no other model uses are gone;
* a bounded stress test: four clients, a fixed seed, random creates, copies and removes; every
  answer is one of the defined ones and the store ends consistent.
"""

from __future__ import annotations

import concurrent.futures
import json
import random
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fakes.helpers import TinyModels
from fakes.ollama_registry import FakeRegistry
from store_support import assert_consistent
from test_daemon_support import Daemon, running_daemon
from tiny_gguf import SPECIAL_TOKENS

from localllm.gguf_info import inspect_gguf
from localllm.store.store import Store

pytest_plugins = ["fakes.fixtures"]
pytestmark = pytest.mark.slow

WAIT = 60.0  # seconds: an upper bound for any event, never a delay
SMOL = "smollm2:135m"


def _wait_for_file(path: Path, request: concurrent.futures.Future[Any]) -> None:
    deadline = time.monotonic() + WAIT
    while not path.exists():
        if request.done():
            raise AssertionError(f"the request ended first: {request.result()}")
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def _create(daemon: Daemon, body: dict[str, Any]) -> httpx.Response:
    with daemon.http() as http:
        return http.post("/api/create", json=body | {"stream": False})


def test_a_second_create_of_a_name_being_created_is_refused_at_once(
    home: Path, tiny_gguf: Path
) -> None:
    first = {"model": "mid:q8", "from": str(tiny_gguf), "quantize": "q8_0"}
    with (
        running_daemon(home, num_threads=1, test_pause="quantize-ready") as daemon,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        request = pool.submit(_create, daemon, first)
        _wait_for_file(home / "test-pause", request)  # the first create holds the name
        second = _create(daemon, {"model": "mid:q8", "from": str(tiny_gguf)})
        assert second.status_code == 409, second.text
        assert second.json()["error"] == (
            "mid:q8 is being changed by another request (creating mid:q8); "
            "try again when it finishes"
        )
        with daemon.http() as http:
            copied = http.post("/api/copy", json={"source": SMOL, "destination": "mid:q8"})
            assert copied.status_code == 409, copied.text
            # Other names are not held up.
            assert _create(daemon, {"model": "other", "from": str(tiny_gguf)}).status_code == 200
        (home / "test-pause").unlink()
        assert request.result(timeout=WAIT).status_code == 200
        assert _create(daemon, {"model": "mid:q8", "from": str(tiny_gguf)}).status_code == 200
    assert sorted(assert_consistent(home)) == ["mid:q8", "other:latest", SMOL]


def _pull(daemon: Daemon, seen: threading.Event, digest: str) -> list[dict[str, Any]]:
    lines = []
    with (
        httpx.Client(base_url=daemon.url, timeout=WAIT) as http,
        http.stream("POST", "/api/pull", json={"model": "tiny"}) as response,
    ):
        for line in response.iter_lines():
            if line.strip():
                lines.append(json.loads(line))
                if lines[-1].get("digest") == digest and lines[-1].get("completed"):
                    seen.set()
    return lines


def test_two_pulls_of_one_model_share_one_download(
    home: Path, registry: FakeRegistry, tiny_models: TinyModels, tiny_gguf: Path
) -> None:
    digest = next(d for d, data in registry.models[("library/tiny", "latest")].blobs.items()
                  if data == tiny_models.f32)  # fmt: skip
    route = f"/v2/library/tiny/blobs/{digest}"
    # Held past the first MiB, which a download writes (and reports) in one batch.
    pause = registry.add_fault("pause", 3_000_000, route)
    with (
        running_daemon(home, num_threads=1, registry=registry.url) as daemon,
        concurrent.futures.ThreadPoolExecutor(2) as pool,
    ):
        seen = [threading.Event(), threading.Event()]
        pulls = [pool.submit(_pull, daemon, event, digest) for event in seen]
        try:
            for event in seen:  # both wait on the one download, held at 3 MB
                assert event.wait(WAIT), "a pull never reported the download"
            created = _create(daemon, {"model": "tiny", "from": str(tiny_gguf)})
            assert created.status_code == 409, created.text
            assert "tiny:latest is being changed by another request (pulling" in created.text
        finally:
            pause.resume.set()
        for pull in pulls:
            assert pull.result(timeout=WAIT)[-1] == {"status": "success"}
    assert len(registry.requests_for(route)) == 1  # one download for both
    assert "tiny:latest" in assert_consistent(home)


def test_removing_a_model_while_it_answers(home: Path, tiny_gguf: Path) -> None:
    with running_daemon(home, num_threads=1) as daemon, daemon.http() as http:
        assert _create(daemon, {"model": "busy", "from": str(tiny_gguf)}).status_code == 200
        store = Store(home)
        weights = store.get("busy").manifest.layers[0].digest
        # Its end-of-text tokens banned, the answer runs to max_tokens: long enough to be
        # removed mid-way.
        tokens = inspect_gguf(tiny_gguf).metadata["tokenizer.ggml.tokens"]
        body = {
            "model": "busy",
            "prompt": "a",
            "max_tokens": 3000,
            "stream": True,
            "logit_bias": {str(tokens.index(t)): -100 for t in SPECIAL_TOKENS},
        }
        with http.stream("POST", "/v1/completions", json=body) as stream:
            lines = (line for line in stream.iter_lines() if line.startswith("data: "))
            assert json.loads(next(lines)[6:])["choices"]  # it answers
            removed = http.request("DELETE", "/api/delete", json={"model": "busy"})
            assert removed.status_code == 200, removed.text
            loaded = [m["name"] for m in http.get("/api/ps").json()["models"]]
            assert "busy:latest" in loaded  # still answering: unloaded once it is done
            assert not store.has_blob(weights)  # no other model uses them
            again = http.post("/v1/completions", json=body | {"stream": False})
            assert again.status_code == 404
            rest = [line[6:] for line in lines]
        assert rest[-1] == "[DONE]"  # the answer finished whole
        assert json.loads(rest[-2])["choices"][0]["finish_reason"] == "length"
        assert "busy:latest" not in assert_consistent(home)


def test_random_creates_copies_and_removes_from_four_clients(home: Path, tiny_gguf: Path) -> None:
    names = [f"s{i}" for i in range(5)]
    allowed = {
        "create": {200, 404, 409},  # 404: its source is not there (now)
        "copy": {200, 404, 409},
        "delete": {200, 404, 409},
    }

    def client(seed: int) -> list[tuple[str, int]]:
        rng = random.Random(seed)
        done = []
        with daemon.http() as http:
            for _ in range(15):
                kind = rng.choices(list(allowed), weights=[2, 1, 1])[0]
                name = rng.choice(names)
                if kind == "create":
                    source = rng.choice([SMOL, str(tiny_gguf), *names])
                    answer = http.post(
                        "/api/create",
                        json={"model": name, "from": source, "stream": False,
                              "system": f"client {seed}"},
                    )  # fmt: skip
                elif kind == "copy":
                    answer = http.post(
                        "/api/copy", json={"source": rng.choice(names), "destination": name}
                    )
                else:
                    answer = http.request("DELETE", "/api/delete", json={"model": name})
                assert answer.status_code in allowed[kind], (kind, name, answer.text)
                done.append((kind, answer.status_code))
        return done

    with running_daemon(home, num_threads=1) as daemon:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            results = [r for f in [pool.submit(client, s) for s in range(4)] for r in f.result()]
        assert len(results) == 60
        assert {code for _, code in results} >= {200}
        listed = assert_consistent(home)
        with daemon.http() as http:
            tags = sorted(m["name"] for m in http.get("/api/tags").json()["models"])
            assert tags == listed
            for name in listed:
                assert http.post("/api/show", json={"model": name}).status_code == 200
            pruned = http.post("/api/prune").json()
    # Nothing was left behind that no model uses (failed changes cleaned up after themselves).
    assert pruned["blobs"] == [], pruned
