"""``localllm doctor``: versions, llama.cpp's view of the machine, the repack decision and why,
the data root, both endpoints; and a daemon that follows a decision to turn repacking off.

Each test has a cache dir of its own (``XDG_CACHE_HOME``), so the CPU probe's decision there is
the one the test made: the real probe's, or one written by a probe that dies by SIGILL in
repacking mode (standing in for a CPU whose AMX path faults).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from test_cli_support import cli_home

from localllm.daemon.devices import cpu
from localllm.daemon.speed.probe import BASE_TYPES

pytestmark = pytest.mark.slow

_SIGILL_IN_REPACKING = """
import json, os, signal, sys
mode = sys.argv[sys.argv.index("--mode") + 1]
if mode == "repack":
    os.kill(os.getpid(), signal.SIGILL)
print(json.dumps({"mode": mode, "buffers": []}))
"""


def test_doctor_reports_the_machine_the_decision_and_the_endpoints(tmp_path: Path) -> None:
    cache = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    # The probe's rounds end at their minimum (the suite's other workers keep this machine
    # busy, so they would go on to the probe's budget): this test is of what doctor reports.
    budget = {"LOCALLLM_TEST_PROBE_BUDGET": "0"}
    with cli_home(tmp_path / "home", **cache, **budget) as cli:
        before = cli.json("doctor")  # the one call that measures the speed afresh
        assert before["test_hooks"]["variables"] == budget
        speed = before["speed"]
        assert speed["rounds"] == 3, speed  # the hook's minimum of rounds: the hooks are on
        # Figures that did not agree from round to round (a busy machine: the suite's other
        # workers) are shown all the same, said to be unkept, and not cached.
        kept = speed["source"] == "measured"
        assert speed["source"] in ("measured", "measured, not kept"), speed
        assert speed["bandwidth"] > 0 and speed["cache_bytes"] != 0, speed
        assert kept == (not speed["unsettled"] and not speed["refused"]), speed
        # The probe's child ran llama.cpp on a synthetic model of each base type: each one a
        # positive rate (test_speed.py's own probe test was folded in here: one probe, not two).
        assert set(speed["types"]) == set(BASE_TYPES), speed["types"]
        for name, rate in speed["types"].items():
            assert rate["decode"] > 0 and rate["prefill"] > 0, (name, rate)
        llama = before["llama_cpp"]
        assert "error" not in llama, llama
        assert llama["llama_cpp_python"] and "CPU" in llama["system_info"]
        assert "CPU" in llama["backends"]
        assert any(device["type"] == "cpu" for device in llama["devices"])
        assert isinstance(llama["gpu_offload"], bool) and isinstance(llama["rpc"], bool)
        assert before["rpc"]["line"].startswith("RPC backend: ")
        assert before["rpc"]["ok"] == llama["rpc"]
        repack = before["cpu_repack"]
        assert repack["source"] == "probe" and repack["usable"]
        assert [run["mode"] for run in repack["runs"]] == ["repack", "plain"]
        assert Path(repack["cache_file"]).is_relative_to(tmp_path / "cache")
        threads = before["threads"]
        # Whether the build uses OpenMP is read from llama.cpp's own system info.
        assert threads["openmp"] == ("OPENMP = 1" in llama["system_info"])
        assert threads["governor"] is True and threads["max_threads"] >= 1
        assert threads["others_now"] is None or threads["others_now"] >= 0
        assert before["data_root"]["path"] == str(tmp_path / "home")
        assert before["data_root"]["free"] > 0
        assert not before["endpoints"]["socket"]["localllm"]
        assert not before["endpoints"]["tcp"]["localllm"]

        cli.ok("list")  # starts the daemon
        after = cli.json("doctor", "--cached-speed")
        # The figures the first call measured, read back from the cache, not measured again.
        if kept:
            assert after["speed"] == speed | {"source": "cached"}
        assert after["cpu_repack"]["source"] == "cache"
        assert after["cpu_repack"]["repack"] == repack["repack"]
        for name in ("socket", "tcp"):
            assert after["endpoints"][name]["localllm"], after["endpoints"]
            assert after["endpoints"][name]["version"] == after["localllm"]
        text = cli.ok("doctor", "--cached-speed")
        if kept:
            assert f"speed ({speed['threads']} threads, cached, measured in " in text
        assert "weight repacking: " + ("on" if repack["repack"] else "off") in text
        assert "system info: " in text and "localllm" in text and "answers" in text
        assert "CPU governor: on: a runner uses up to" in text
        assert ("llama.cpp uses OpenMP" in text) == bool(threads["openmp"])

    # A test hook variable set as a user would (without the fixtures' switch): doctor names it,
    # and says it does nothing.
    fault = {"LOCALLLM_TEST_FAULT": "decode-failed@1"}
    with cli_home(tmp_path / "user", hooks=False, **cache, **fault) as cli:
        assert cli.json("doctor", "--cached-speed")["test_hooks"] == {
            "variables": fault,
            "module": None,
        }
        assert (
            "test hooks: LOCALLLM_TEST_FAULT=decode-failed@1 set; inert: test hooks act only in "
            "daemons the test suite's fixtures start"
        ) in cli.ok("doctor", "--cached-speed")


def test_a_daemon_follows_a_decision_to_turn_repacking_off_and_says_why(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(_SIGILL_IN_REPACKING)
    with cli_home(tmp_path / "home", XDG_CACHE_HOME=str(tmp_path / "cache")) as cli:
        # The decision the probe would make on such a CPU, cached where the CLI looks.
        decided = cpu.decide(
            cli.settings,
            cache_dir=tmp_path / "cache" / "localllm",
            probe_command=[sys.executable, str(probe)],
        )
        assert decided.fell_back
        text = cli.ok("doctor", "--cached-speed")  # nothing measured in this cache dir yet
        assert "speed: not measured (none measured yet (`localllm doctor` measures them))" in text
        assert "weight repacking: off — the repack probe was killed by SIGILL" in text, text
        assert "warning: llama.cpp's weight repacking crashed on this CPU" in text, text

        with cli.client() as client:
            cli.ok("list")
            answer = client.generate("smollm2:135m", "Hi", options={"num_predict": 3})
            assert answer["eval_count"] == 3
            pid = next(m for m in client.ps() if m["model"] == "smollm2:135m")["runner_pid"]
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert command[command.index(b"--cpu-repack") + 1] == b"off"
        log = (cli.settings.log_dir / "daemon.log").read_text()
        assert log.count("weight repacking crashed on this CPU") == 1, log[-2000:]
