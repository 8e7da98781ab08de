"""Every store change is a transaction: a name is written only once the work it names is done.

The first scene of issue 37, on a real daemon: on a 200 MiB disk holding the starter, a
quantizing ``create`` refused for want of space (507) leaves no ``big:q8`` behind. (The second,
a daemon SIGKILLed while quantizing ``mid:q8``, is ``test_store_kills.py``, at every step.)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from test_daemon_support import running_daemon

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
