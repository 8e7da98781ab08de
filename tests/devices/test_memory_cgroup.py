"""End to end in a real memory cgroup: the issue's scene, a daemon held to 900 MiB.

The daemon starts inside a fresh memory cgroup (a child of this process's own, v2 or v1,
whichever holds the memory controller) limited to 900 MiB. Its runners inherit the limit,
and their memory plans read it (the cgroup's room, not the machine's 24 GiB):

* ``num_ctx`` 131072 for SmolLM2 (4 × 131,072 cells, 11 GiB of KV) is refused *before*
  loading with the plan's sentence (what it needs, what is free, what would fit), and the
  daemon keeps serving;
* the ``num_ctx`` the sentence suggests answers;
* with no ``num_ctx``, the plan picks a context that fits the cgroup;
* nothing was ever killed by the kernel (no OOM kill in the group).

Creating a cgroup needs root and a writable cgroup filesystem. Where the machine does not
allow it the test says exactly which step failed and why; that is a limit of the machine the
suite runs on, not of the feature, which the planner's unit tests cover with injected memory.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from cgroup_support import memory_limited
from test_daemon_support import running_daemon

pytestmark = pytest.mark.slow

LIMIT = 900 << 20
SMOL = "smollm2:135m"


def test_a_daemon_in_a_900_mib_cgroup_refuses_what_cannot_fit_and_serves_what_can(
    tmp_path: Path,
) -> None:
    with (
        memory_limited(LIMIT) as group,
        running_daemon(tmp_path / "home", group.enter, num_threads=1) as daemon,
        daemon.http() as http,
    ):
        # The default context: chosen to fit the cgroup, not the machine.
        answer = http.post(
            "/api/generate",
            json={"model": SMOL, "prompt": "Hi", "stream": False, "options": {"num_predict": 2}},
        )
        assert answer.status_code == 200, answer.text
        (loaded,) = http.get("/api/ps").json()["models"]
        assert loaded["context_length"] in (4096, 8192)
        assert loaded["size"] < LIMIT

        # The request: refused before loading, with what to change.
        refused = http.post(
            "/api/generate",
            json={
                "model": SMOL,
                "prompt": "Hi",
                "stream": False,
                "options": {"num_ctx": 131072, "num_predict": 2},
            },
        )
        assert refused.status_code == 507, refused.text
        message = refused.json()["error"]
        sentence = re.fullmatch(
            r"smollm2:135m needs ([\d,]+) MiB \(weights \d+, KV ([\d,]+) for 4 × 131,072 "
            r"cells, compute \d+\); ([\d,]+) MiB are free; try num_ctx (\d+)",
            message,
        )
        assert sentence is not None, message
        needed, kv, free, suggested = (int(g.replace(",", "")) for g in sentence.groups())
        assert kv == 11520 and needed > free and free < LIMIT >> 20
        assert http.get("/").status_code == 200  # the daemon stays up

        # What the sentence suggests answers.
        smaller = http.post(
            "/api/generate",
            json={
                "model": SMOL,
                "prompt": "Hi",
                "stream": False,
                "options": {"num_ctx": suggested, "num_predict": 2},
            },
        )
        assert smaller.status_code == 200, smaller.text
        assert smaller.json()["eval_count"] > 0
        (loaded,) = http.get("/api/ps").json()["models"]
        assert loaded["context_length"] == suggested
        assert group.oom_kills() == 0
        assert "refusing to load smollm2:135m" in daemon.log()
