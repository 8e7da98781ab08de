"""Per-model memory settings against a real daemon: ``LOCALLLM_PRELOAD`` loads models at
start (skipping, with a log line, one that is missing), a Modelfile's ``PARAMETER
num_parallel`` sets the model's slots, ``PARAMETER keep_alive -1`` pins it (``/api/ps`` and
``localllm ps`` say so), ``/api/plan`` and ``/metrics`` report the plan."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from test_daemon_support import Daemon, running_daemon, wait_for_stats

from localllm.store.modelfile import parse_modelfile

pytestmark = pytest.mark.slow

SMOL = "smollm2:135m"
FEW = {"num_predict": 2, "temperature": 0}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    home = tmp_path_factory.mktemp("memory") / "home"
    with running_daemon(
        home, num_threads=1, num_parallel=4, preload=f"missing:model,{SMOL}"
    ) as daemon:
        yield daemon


def _loaded(daemon: Daemon) -> dict[str, dict[str, Any]]:
    return {str(m["name"]): dict(m) for m in daemon.client().ps()}


def test_preload_loads_what_exists_and_logs_what_does_not(daemon: Daemon) -> None:
    wait_for_stats(daemon, lambda snapshot: any(m["name"] == SMOL for m in snapshot["models"]))
    entry = _loaded(daemon)[SMOL]
    assert entry["slots"] == 4 and not entry["pinned"]
    log = daemon.log()
    assert "LOCALLLM_PRELOAD: not loading missing:model" in log
    assert f"LOCALLLM_PRELOAD: loaded {SMOL}" in log


def test_modelfile_parameters_set_slots_and_pin_the_model(daemon: Daemon) -> None:
    modelfile = parse_modelfile(f"FROM {SMOL}\nPARAMETER num_parallel 2\nPARAMETER keep_alive -1\n")
    client = daemon.client()
    list(client.create("pinned:two", from_=SMOL, **modelfile.create_fields()))
    assert client.show("pinned:two")["parameters"].count("keep_alive") == 1
    client.generate("pinned:two", "Hi", options=FEW)
    entry = _loaded(daemon)["pinned:two"]
    assert entry["slots"] == 2 and entry["pinned"]
    assert entry["expires_at"].startswith("9999")
    assert entry["size"] > 0 and entry["size_vram"] == 0
    listing = subprocess.run(
        [sys.executable, "-m", "localllm", "ps"],
        env=daemon.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    row = next(line for line in listing.stdout.splitlines() if line.startswith("pinned:two"))
    assert "100% CPU" in row and row.endswith("Forever (pinned)")
    # A request's keep_alive 0 still unloads it.
    client.generate("pinned:two", "Hi", options=FEW, keep_alive=0)
    assert "pinned:two" not in _loaded(daemon)


def test_keep_alive_is_not_a_request_option(daemon: Daemon) -> None:
    with daemon.http() as http:
        answer = http.post(
            "/api/generate",
            json={"model": SMOL, "prompt": "Hi", "options": {"keep_alive": "5m"}},
        )
    assert answer.status_code == 400
    assert "top level" in answer.json()["error"]


def test_plan_and_metrics_report_the_loaded_plan(daemon: Daemon) -> None:
    client = daemon.client()
    client.generate(SMOL, "Hi", options=FEW)
    answer = client.plan(SMOL)
    assert answer["loaded"] is True
    plan = answer["plan"]
    entry = _loaded(daemon)[SMOL]
    assert plan["n_ctx_per_slot"] == entry["context_length"]
    # ps reports what llama.cpp allocated (its log's buffers, in hundredths of a MiB): the plan
    # measured the same layout, so they agree to the log's rounding.
    assert abs(plan["size"] - entry["size"]) < 64 * 1024
    other = client.plan(SMOL, {"num_ctx": 2048})
    assert other["loaded"] is False and other["plan"]["n_ctx_per_slot"] == 2048
    metrics = client.metrics()
    kv = re.search(
        rf'localllm_memory_planned_bytes{{device="CPU",model="{SMOL}",part="kv"}} (\S+)', metrics
    )
    assert kv is not None and float(kv.group(1)) == plan["uses"][0]["kv"]
    used = re.search(rf'localllm_memory_used_bytes{{device="CPU",model="{SMOL}"}} (\S+)', metrics)
    assert used is not None and float(used.group(1)) > 0
    assert 'localllm_device_memory_bytes{device="CPU",state="total"}' in metrics
