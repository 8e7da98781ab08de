"""llama.cpp's CPU paths: the probe's decision, its cache, and the fallback when repacking crashes.

No CPU here needs to fault for these tests: probe commands that kill themselves by SIGILL stand in
for llama.cpp crashing on a CPU (as ggml's AMX path does in some VMs), and a runner process that
dies by SIGILL when it is asked to repack stands in for a runner on such a CPU. The real probe
runs too, on this machine's llama.cpp, and the decision it gives is what every load here uses.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from runner_harness import greedy

from localllm._format import REBUILD_FOR_THIS_CPU
from localllm.daemon.devices import cpu
from localllm.daemon.runner.client import ProcessRunner, RunnerProcess, RunnerStartError
from localllm.daemon.runner.protocol import GenerationRequest, GenerationResult, RunnerConfig
from localllm.daemon.scheduler import Scheduler
from localllm.settings import Settings
from localllm.store.names import parse_name

DEADLINE_S = 120.0

# Stands in for `python -m localllm.daemon.devices.cpu probe`: dies by SIGILL in the modes named by
# its first argument, else answers as the real probe does.
_FAKE_PROBE = """
import json, os, signal, sys
mode = sys.argv[sys.argv.index("--mode") + 1]
if mode in sys.argv[1].split(","):
    os.kill(os.getpid(), signal.SIGILL)
print(json.dumps({"mode": mode, "buffers": ["AMX"] if mode == "repack" else []}))
"""


@pytest.fixture
def fake_probe(tmp_path: Path) -> Any:
    script = tmp_path / "fake_probe.py"
    script.write_text(_FAKE_PROBE)

    def command(crashing: str) -> list[str]:
        return [sys.executable, str(script), crashing]

    return command


def settings(**changes: Any) -> Settings:
    return Settings(num_parallel=1, keep_alive=300.0, **changes)


def test_the_real_probe_runs_this_machines_llama_cpp_and_caches_its_decision(
    tmp_path: Path,
) -> None:
    paths = cpu.decide(settings(), threads=2, cache_dir=tmp_path, fresh=True)
    assert paths.source == "probe"
    assert [run.mode for run in paths.runs] == ["repack", "plain"]
    # Whatever this CPU does, the decision follows the probes' outcome.
    repack, plain = paths.runs
    assert plain.ok == paths.usable or plain.crashed
    assert paths.repack == (repack.ok and plain.ok)
    cached = json.loads(Path(paths.cache_file).read_text())
    assert cached["key"] == cpu.decision_key(2) and cached["repack"] == paths.repack
    # The same build, CPU and thread count: read back, not probed again.
    again = cpu.decide(
        settings(), threads=2, cache_dir=tmp_path, probe_command=["/nonexistent-probe"]
    )
    assert again.source == "cache" and again.repack == paths.repack


def test_repacking_that_crashes_is_switched_off_with_one_warning(
    tmp_path: Path, fake_probe: Any
) -> None:
    paths = cpu.decide(
        settings(), threads=1, cache_dir=tmp_path, probe_command=fake_probe("repack")
    )
    assert (paths.repack, paths.usable, paths.fell_back) == (False, True, True)
    assert paths.error is None
    assert paths.warning is not None
    assert "was killed by SIGILL" in paths.warning and "LOCALLLM_CPU_REPACK=on" in paths.warning
    # Decided once: a second ask reads the cache even with a probe that would now pass.
    again = cpu.decide(settings(), threads=1, cache_dir=tmp_path, probe_command=fake_probe(""))
    assert again.source == "cache" and not again.repack


def test_when_even_the_plain_path_crashes_the_error_names_the_signal_and_the_remedy(
    tmp_path: Path, fake_probe: Any
) -> None:
    paths = cpu.decide(
        settings(), threads=1, cache_dir=tmp_path, probe_command=fake_probe("repack,plain")
    )
    assert not paths.usable
    assert paths.error is not None and "\n" not in paths.error
    assert "SIGILL" in paths.error and REBUILD_FOR_THIS_CPU in paths.error


def test_a_probe_that_fails_without_crashing_keeps_the_default_and_is_asked_again(
    tmp_path: Path,
) -> None:
    failing = [sys.executable, "-c", "import sys; sys.exit('no llama.cpp here')"]
    paths = cpu.decide(settings(), threads=1, cache_dir=tmp_path, probe_command=failing)
    assert paths.repack and paths.usable and paths.warning is None
    assert "no llama.cpp here" in paths.reason
    assert paths.cache_file == "" and not list(tmp_path.rglob("*.json"))


def test_the_setting_overrides_the_probe(tmp_path: Path, fake_probe: Any) -> None:
    crashing = fake_probe("repack,plain")
    off = cpu.decide(settings(cpu_repack="off"), cache_dir=tmp_path, probe_command=crashing)
    on = cpu.decide(settings(cpu_repack="on"), cache_dir=tmp_path, probe_command=crashing)
    assert (off.repack, off.usable, off.source) == (False, True, "setting")
    assert (on.repack, on.usable) == (True, True)
    assert "LOCALLLM_CPU_REPACK=off" in off.reason
    assert Settings.from_env({"LOCALLLM_CPU_REPACK": "OFF"}).cpu_repack == "off"


# -- through the scheduler, with real runner processes ----------------------------------------


class _SigillRunner(RunnerProcess):
    """A runner process that dies by SIGILL while loading (as on a CPU where repacking faults)."""

    def command(self) -> list[str]:
        return [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGILL)"]


class _Runners:
    """The scheduler's runner factory: real runners, except that one asked to repack weights
    dies by SIGILL while loading when ``repack_crashes``."""

    def __init__(self, workdir: Path, repack_crashes: bool) -> None:
        self.workdir = workdir
        self.repack_crashes = repack_crashes
        self.asked: list[bool | None] = []

    async def __call__(self, model: Any, config: RunnerConfig) -> ProcessRunner:
        self.asked.append(config.cpu_repack)
        number = len(self.asked)
        socket, log = self.workdir / f"r{number}.sock", self.workdir / f"r{number}.log"
        if config.cpu_repack and self.repack_crashes:
            await _SigillRunner(config, socket, log).start(timeout=60)
            raise AssertionError("the SIGILL runner started")
        return await ProcessRunner.start(config, socket, log, timeout=120)


class _Model:
    """The part of a LocalModel the scheduler reads."""

    def __init__(self, name: str) -> None:
        self.name = parse_name(name)
        self.parameters: dict[str, Any] = {}
        self.adapters: list[Any] = []  # no LoRA adapters


def _answer(tiny_gguf: Path, tmp_path: Path, probe: list[str]) -> _Runners:
    """Load the model (repacking crashes its runner) and ask for 4 tokens, which must come;
    returns the runner factory, which knows what each runner was asked."""
    runners = _Runners(tmp_path, repack_crashes=True)

    def decider(settings: Settings, threads: int) -> cpu.CpuPaths:
        return cpu.decide(settings, threads, cache_dir=tmp_path / "cache", probe_command=probe)

    async def main() -> GenerationResult:
        scheduler = Scheduler(settings(), runner_factory=runners, cpu_decider=decider)
        config = RunnerConfig(model_path=str(tiny_gguf), n_slots=1, n_ctx_per_slot=256)
        try:
            async with asyncio.timeout(DEADLINE_S):
                lease = await scheduler.acquire(_Model("tiny"), config)
                async with lease:
                    request = GenerationRequest(id="g1", prompt="Hello", options=greedy(4))
                    stream = await lease.runner.open_generation(request)
                    items = [item async for item in stream]
                result = items[-1]
                assert isinstance(result, GenerationResult)
                return result
        finally:
            await scheduler.close()

    assert asyncio.run(main()).timings.completion_tokens == 4
    return runners


@pytest.fixture
def daemon_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """The daemon's warnings, captured."""
    caplog.set_level(logging.WARNING, logger="localllm.daemon")
    return caplog


def test_a_probe_that_dies_in_repacking_leads_to_a_load_without_it_that_answers(
    tiny_gguf: Path, tmp_path: Path, fake_probe: Any, daemon_log: pytest.LogCaptureFixture
) -> None:
    runners = _answer(tiny_gguf, tmp_path, fake_probe("repack"))
    assert runners.asked == [False], "no runner was asked to repack"
    warnings = [r.getMessage() for r in daemon_log.records if "repacking crashed" in r.getMessage()]
    assert len(warnings) == 1 and "SIGILL" in warnings[0]


def test_a_runner_that_dies_by_sigill_while_repacking_is_loaded_again_without_it(
    tiny_gguf: Path, tmp_path: Path, fake_probe: Any, daemon_log: pytest.LogCaptureFixture
) -> None:
    """The probe passed (its model lacks the weight type that faults), yet the runner died."""
    runners = _answer(tiny_gguf, tmp_path, fake_probe(""))
    assert runners.asked == [True, False]
    said = " | ".join(r.getMessage() for r in daemon_log.records)
    assert "repacking crashed" in said and "was killed by SIGILL" in said
    # Remembered like a probe's decision: the next daemon starts with repacking off.
    remembered = cpu.decide(
        settings(),
        threads=cpu.default_threads(),
        cache_dir=tmp_path / "cache",
        probe_command=fake_probe(""),
        fresh=False,
    )
    assert not remembered.repack


def test_when_both_paths_die_a_load_fails_in_one_line_and_no_runner_starts(
    tiny_gguf: Path, tmp_path: Path, fake_probe: Any
) -> None:
    with pytest.raises(RunnerStartError) as failure:
        _answer(tiny_gguf, tmp_path, fake_probe("repack,plain"))
    message = str(failure.value)
    assert "\n" not in message and "SIGILL" in message and REBUILD_FOR_THIS_CPU in message


def test_sigill_names_itself_when_a_runner_dies_while_loading(tmp_path: Path) -> None:
    config = RunnerConfig(model_path="unused.gguf")
    process = _SigillRunner(config, tmp_path / "r.sock", tmp_path / "r.log")
    with pytest.raises(RunnerStartError) as failure:
        asyncio.run(process.start(timeout=60))
    assert failure.value.returncode == -signal.SIGILL
    assert "was killed by SIGILL (illegal instruction) while loading the model" in str(
        failure.value
    )
