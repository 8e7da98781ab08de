"""Every store change is a transaction: a name is written only once the work it names is done.

The two scenes of issue 37, on a real daemon:

* on a 200 MiB disk holding the starter, a quantizing ``create`` refused for want of space
  (507) leaves no ``big:q8`` behind;
* a daemon SIGKILLed while a quantizing ``create`` runs leaves, after a restart, either no
  ``mid:q8`` or a whole Q8_0 one, never a name holding the source's weights.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from test_daemon_support import running_daemon, start_daemon

from localllm.models import load_model
from localllm.settings import Settings
from localllm.store import Store

pytest_plugins = ["fakes.fixtures"]
pytestmark = pytest.mark.slow

MiB = 1 << 20
SMOL = "smollm2:135m"
WAIT = 120.0  # seconds: an upper bound for any answer, never a delay


def _names(http: httpx.Client) -> list[str]:
    return [m["name"] for m in http.get("/api/tags").json()["models"]]


def test_a_create_refused_for_disk_space_leaves_no_name(
    small_disk: Callable[[int], Path],
) -> None:
    home = small_disk(200 * MiB)
    with running_daemon(home, num_threads=1) as daemon, daemon.http() as http:
        assert SMOL in _names(http)  # the starter fits: about 94 MiB of the 200
        answer = http.post(
            "/api/create",
            json={
                "model": "big:q8",
                "from": SMOL,
                "quantize": "q8_0",
                "allow_requantize": True,
                "stream": False,
            },
        )
        assert answer.status_code == 507, answer.text
        assert "not enough disk space to quantize" in answer.json()["error"]
        assert "big:q8" not in _names(http)
        assert http.post("/api/show", json={"model": "big:q8"}).status_code == 404


def test_a_daemon_killed_while_quantizing_leaves_no_half_made_model(
    home: Path, tiny_gguf: Path
) -> None:
    first = start_daemon(home, num_threads=1)
    try:
        with (
            first.http() as http,
            http.stream(
                "POST",
                "/api/create",
                json={"model": "mid:q8", "from": str(tiny_gguf), "quantize": "q8_0"},
            ) as response,
        ):
            assert response.status_code == 200
            for line in response.iter_lines():
                event = json.loads(line)
                assert "error" not in event, event
                if str(event.get("status", "")).startswith("quantizing"):
                    first.kill()  # SIGKILL: nothing of the daemon's cleanup runs
                    break
            else:
                raise AssertionError("the create ended before the kill")
    finally:
        first.kill()
    assert first.process.returncode == -9

    with running_daemon(home, num_threads=1) as second, second.http() as http:
        store = Store(Settings.from_env(second.env).data_dir)
        if "mid:q8" in _names(http):
            assert load_model(store, "mid:q8").info.file_type == "Q8_0"
        else:
            assert http.post("/api/show", json={"model": "mid:q8"}).status_code == 404
