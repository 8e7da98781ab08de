"""A spare runner: a runner process started ahead of need, its imports done, waiting for a model.

Why: a runner is a fresh ``python -m localllm.daemon.runner`` process, and before it reads a
byte of the model it spends about half a second (on this project's 2-core machine) starting
Python and importing llama-cpp-python, numpy and the engine's modules. llama-server, a native
binary, pays nothing of the kind, so that half second is the difference in a cold first token.
The daemon therefore keeps one runner process started, imported and idle: a load hands it its
command line instead of spawning a process, and it runs the very same runner ``main`` from
there. Loading stays per model (nothing about a model is done ahead of time).

How the spare is handed its job: the daemon starts ``python -P -m localllm.daemon.runner
--spare-fd N`` with one end of a Unix socket pair as fd N. The spare imports the runner's
modules (in a thread of low priority: see :func:`_preload`), writes ``spare`` on the socket,
and blocks reading it. A load sends one JSON line, ``{"argv": [...], "log": PATH, "cwd":
PATH}`` (the runner's arguments as :meth:`.client.RunnerProcess.arguments` builds them for a
fresh process); the spare opens the log itself and makes it its stdout and stderr, moves to
``cwd`` (as ``Popen(cwd=...)`` does for a fresh runner), answers ``go``, and calls the
runner's ``main`` with ``argv`` plus ``--ready-fd N``: the same socket then carries ``ready``
or ``nofit {...}``, exactly as a fresh runner's pipe does, and its closing empty means the
runner died while loading.

When a fresh process is started instead (:meth:`SparePool.hand` returns None): the spare is
switched off (``LOCALLLM_SPARE_RUNNER=off``), not started yet or not done importing, dead, or
started with another environment than the load needs (a CPU-only runner hides the GPUs from
llama.cpp through its environment, which a process cannot change for the libraries it has
loaded); also when it does not answer ``go`` (it died in between). A memory plan alone
(:func:`.client.plan_only`) never takes the spare: it is not on the way to a first token and
writes its answer to a pipe on stdout.

The spare holds no model and nothing on a GPU (llama.cpp's device registry is left for the load:
asking it about devices would start the GPU backends): about 60 MB resident, 35 MB of it its
own (the interpreter's and the modules' objects), the rest the libraries' pages, shared with
every runner. It is in a session of its own like every runner
(so a kill of its group stays within it), is stopped with the daemon, and exits by itself when
its socket reaches end of file (the daemon died without stopping it). After every load (one
that used the spare or not) a spare is started once the daemon is quiet (no load, no
request, and none arrived for a second: ``_SETTLE_S``), so that its imports do not take a
core from the first requests of the model that just loaded (the runner's CPU governor would
see them as another program's load and use fewer threads). So the first spare follows the
daemon's first load: a daemon that never loads a model (one started to list, pull or create)
starts none, and the load that comes right after the daemon starts (``localllm run`` starting
it) does not import beside a spare doing the same. What the spare saves is the next load:
after an unload, a switch to another model, a model reloaded with other options.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Handed", "SparePool", "serve_spare"]

log = logging.getLogger("localllm.daemon")

# What a runner imports before it is ready, all of it the same for every model.
_PRELOAD = (
    "localllm.daemon.runner.server",
    "localllm.daemon.engine.loop",
    "localllm.daemon.engine.model",
    "localllm.daemon.memory.plan",
    "localllm.daemon.memory.plancache",
    "localllm.daemon.memory.measure",
    "platformdirs",
)
# The spare's importing thread runs at this nice value: it never outbids a loading or serving
# runner, and the runner's own threads (started from the main thread) keep the normal priority.
_PRELOAD_NICE = 10
# How long a spare may take to answer its job before the load starts a fresh process instead.
_GO_S = 10.0
# How long a refill waits for the daemon to be quiet before starting the spare anyway.
_QUIET_WAIT_S = 30.0
# How long the daemon must have been quiet (no request arrived) before a spare starts: a
# spare started in the moment between a load's first request and the next one (a
# ``/tokenize``, then the generation) imported beside that generation's prefill and cost it
# 15 % (a Gemma-3-270M-shaped model's first 514-token prompt at 823-872 tokens/s against
# ~1,000 for the next ones, and against 1,016-1,072 with no spare).
_SETTLE_S = 1.0
# How long a stopped spare gets to exit before it is killed.
_STOP_S = 5.0


def _preload() -> None:
    """Import what every runner imports, in a thread of low priority (a thread's nice value is
    its own on Linux, and threads inherit it from the thread that starts them: the runner's
    threads, started later from the main thread, are not slowed)."""
    if sys.platform.startswith("linux"):  # elsewhere the priority is the whole process's
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), _PRELOAD_NICE)
    for name in _PRELOAD:
        importlib.import_module(name)
    import llama_cpp

    llama_cpp.llama_backend_init()


def _read_line(channel: socket.socket) -> tuple[bytes, bytes] | None:
    """The first line read from ``channel`` (without its newline) and what came after it;
    None at end of file before a whole line."""
    data = b""
    while b"\n" not in data:
        chunk = channel.recv(65536)
        if not chunk:
            return None
        data += chunk
    line, _, rest = data.partition(b"\n")
    return line, rest


def serve_spare(fd: int, run: Callable[[list[str]], int]) -> int:
    """The spare's life (``python -m localllm.daemon.runner --spare-fd FD``): import, say
    ``spare`` on socket ``fd``, wait for a job, then become that runner (``run`` is the
    runner's ``main``); exit status 0 when the daemon closed the socket instead."""
    channel = socket.socket(fileno=fd)
    # numpy first, here: OpenBLAS starts its worker threads as it loads, and they would keep
    # the low priority of the importing thread for the runner's whole life.
    import numpy  # noqa: F401

    failed: list[BaseException] = []

    def preload() -> None:
        try:
            _preload()
        except BaseException as exc:
            failed.append(exc)
            raise  # its traceback goes to this spare's log

    loader = threading.Thread(target=preload, name="localllm-spare-preload")
    loader.start()
    loader.join()
    if failed:  # never offered: a load then starts a fresh runner, which reports the failure
        return 1
    try:
        channel.sendall(b"spare\n")
        read = _read_line(channel)
    except OSError:
        return 0
    if read is None:  # the daemon is gone or let this spare go
        return 0
    job = json.loads(read[0])
    # The same start as a fresh runner's: stdout and stderr appended to the model's log, in
    # the log's folder.
    log_fd = os.open(job["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    os.chdir(job["cwd"])
    channel.sendall(b"go\n")
    ready_fd = channel.detach()
    return run([*job["argv"], "--ready-fd", str(ready_fd)])


@dataclass
class Handed:
    """A spare that took a job: now the runner of that load."""

    process: subprocess.Popen[bytes]
    """The process (the spare's, now the runner's)."""
    ready_fd: int
    """Where ``ready`` or ``nofit`` arrives (the daemon's end of the spare's socket)."""
    early: bytes
    """What already arrived on it after ``go`` (the start of the ready line, if any)."""


class _Spare:
    """One spare process and the daemon's end of its socket."""

    def __init__(
        self, process: subprocess.Popen[bytes], channel: socket.socket, env: dict[str, str]
    ) -> None:
        self.process = process
        self.channel = channel
        self.env = env
        self.ready = False
        """Said ``spare``: its imports are done."""
        self.ended = False
        """Its socket reached end of file: it died (or exits)."""
        self.settled = asyncio.Event()
        """Set once it is ready or ended."""


class SparePool:
    """The daemon's one spare runner: started ahead, handed to a load, replaced when quiet.

    ``quiet(settle)`` returns once the daemon neither loads nor serves and no request arrived
    for ``settle`` seconds (the scheduler's); a pool that is not ``enabled`` never starts a
    process.
    """

    def __init__(
        self,
        log_dir: Path,
        enabled: bool = True,
        quiet: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        self.log_dir = log_dir
        """Where the spare's own log (``runner-spare.log``) goes until it takes a job."""
        self.enabled = enabled
        """False: no spare process, every load starts a fresh one."""
        self._quiet = quiet
        self._spare: _Spare | None = None
        self._refill: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def pid(self) -> int | None:
        """The spare's process id while there is one."""
        return self._spare.process.pid if self._spare is not None else None

    @property
    def ready(self) -> bool:
        """Whether a spare is waiting with its imports done (a load would take it)."""
        spare = self._spare
        return spare is not None and spare.ready and not spare.ended

    def describe(self) -> dict[str, object] | None:
        """``{"pid": N, "ready": bool}`` for the stats stream; None when there is no spare."""
        return None if self._spare is None else {"pid": self.pid, "ready": self.ready}

    async def wait_ready(self) -> bool:
        """Wait until the spare being started (if any) is ready or ended; whether it is
        ready."""
        if self._refill is not None:
            await asyncio.shield(self._refill)
        if self._spare is not None:
            await self._spare.settled.wait()
        return self.ready

    def refill(self) -> None:
        """Start a spare in the background unless one lives or is being started: once the
        daemon is quiet (at most ``_QUIET_WAIT_S`` later)."""
        if not self.enabled or self._closed:
            return
        if self._spare is not None and not self._spare.ended:
            return
        if self._refill is not None and not self._refill.done():
            return
        self._refill = asyncio.get_running_loop().create_task(self._start_when_quiet())

    async def _start_when_quiet(self) -> None:
        if self._quiet is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._quiet(_SETTLE_S), _QUIET_WAIT_S)
        if self._closed:
            return
        self._discard()
        try:
            self._spare = self._spawn()
        except OSError as exc:
            log.warning("could not start a spare runner: %s", exc)
            return
        asyncio.get_running_loop().add_reader(self._spare.channel, self._readable, self._spare)
        log.debug("started a spare runner (pid %d)", self._spare.process.pid)

    def _spawn(self) -> _Spare:
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            with open(self.log_dir / "runner-spare.log", "ab") as log_file:
                # -P as for every runner: the working directory never shadows the package.
                command = [sys.executable, "-P", "-m", "localllm.daemon.runner"]
                process = subprocess.Popen(
                    [*command, "--spare-fd", str(theirs.fileno())],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=log_file,
                    cwd=str(self.log_dir),
                    pass_fds=(theirs.fileno(),),
                    start_new_session=True,
                )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        return _Spare(process, ours, env)

    def _readable(self, spare: _Spare) -> None:
        """The spare wrote (``spare``: it is ready) or its socket ended (it died)."""
        try:
            data = spare.channel.recv(64)
        except OSError:
            data = b""
        spare.settled.set()
        if data.startswith(b"spare"):
            spare.ready = True
            log.info("spare runner ready (pid %d)", spare.process.pid)
            return
        spare.ended = True
        with contextlib.suppress(ValueError, OSError):
            asyncio.get_running_loop().remove_reader(spare.channel)
        code = spare.process.poll()
        log.warning(
            "the spare runner (pid %d) ended (status %s); see %s",
            spare.process.pid,
            code,
            self.log_dir / "runner-spare.log",
        )

    def _take(self, env: dict[str, str]) -> _Spare | None:
        """The ready spare when it runs in ``env``, out of the pool."""
        spare = self._spare
        if spare is None or not spare.ready or spare.ended or spare.process.poll() is not None:
            if spare is not None and (spare.ended or spare.process.poll() is not None):
                self._discard()
            return None
        if spare.env != env:
            return None
        self._spare = None
        with contextlib.suppress(ValueError, OSError):
            asyncio.get_running_loop().remove_reader(spare.channel)
        return spare

    async def hand(
        self, argv: list[str], log_path: Path, env: dict[str, str] | None
    ) -> Handed | None:
        """Give the spare a runner's job (``argv``: the runner's arguments, without
        ``--ready-fd``), its log ``log_path``, for a runner whose environment is ``env``
        (None: the daemon's); None when it cannot take it (see the module docstring), and a
        fresh process must be started."""
        if not self.enabled or self._closed:
            return None
        spare = self._take(dict(os.environ) if env is None else env)
        if spare is None:
            return None
        job = {"argv": argv, "log": str(log_path), "cwd": str(log_path.parent)}
        line = json.dumps(job).encode() + b"\n"
        loop = asyncio.get_running_loop()
        try:
            early = await loop.run_in_executor(None, _give, spare.channel, line)
        except (OSError, ValueError) as exc:
            pid = spare.process.pid
            log.warning("the spare runner (pid %d) did not take its job: %s", pid, exc)
            await loop.run_in_executor(None, _end, spare, 0.0)
            return None
        log.info("runner pid %d is the spare started ahead", spare.process.pid)
        return Handed(spare.process, spare.channel.detach(), early)

    def _discard(self) -> None:
        """Forget the spare (reaped, its socket closed) without waiting for it."""
        spare, self._spare = self._spare, None
        if spare is None:
            return
        with contextlib.suppress(ValueError, OSError):
            asyncio.get_running_loop().remove_reader(spare.channel)
        spare.channel.close()
        with contextlib.suppress(ProcessLookupError):
            spare.process.kill()
        spare.process.poll()

    async def close(self) -> None:
        """Stop the spare (daemon shutdown); no other starts."""
        self._closed = True
        if self._refill is not None:
            self._refill.cancel()
            with contextlib.suppress(BaseException):
                await self._refill
        spare, self._spare = self._spare, None
        if spare is None:
            return
        with contextlib.suppress(ValueError, OSError):
            asyncio.get_running_loop().remove_reader(spare.channel)
        await asyncio.get_running_loop().run_in_executor(None, _end, spare, _STOP_S)


def _give(channel: socket.socket, line: bytes) -> bytes:
    """Send the job; once the spare answers ``go``, what came after it on the socket."""
    channel.settimeout(_GO_S)
    channel.sendall(line)
    read = _read_line(channel)
    if read is None:
        raise ValueError("it ended first")
    answer, rest = read
    if answer != b"go":
        raise ValueError(f"it answered {answer[:80]!r}")
    channel.settimeout(None)
    return rest


def _end(spare: _Spare, wait: float) -> None:
    """Close the spare's socket (its end of file: it exits), then make sure it did."""
    spare.channel.close()
    with contextlib.suppress(ProcessLookupError):
        spare.process.terminate()
    try:
        spare.process.wait(wait)
    except subprocess.TimeoutExpired:
        spare.process.kill()
        spare.process.wait()
