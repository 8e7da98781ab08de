"""Running the daemon: one app on the Unix socket and on TCP, in one process and event loop.

:func:`serve` takes the per-home lock (a second daemon for the same home refuses to start and
says which process holds it), binds both listeners itself (so a busy port is reported
clearly), runs two uvicorn servers on one loop, and on SIGTERM/SIGINT stops accepting, lets
streams finish for a few seconds (then cancels them, which cancels them in the runners), stops
every runner and removes the socket.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import errno
import logging
import logging.handlers
import os
import queue
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import uvicorn

from localllm import __version__
from localllm._exceptions import LocalLLMError, SettingsError
from localllm._locks import claim
from localllm.settings import Settings
from localllm.starter import ensure_starter
from localllm.store.check import check_store

from .app import ACCESS_LOG, create_app
from .httphead import protocol_class
from .preload import preload
from .security import check_bind_allowed
from .state import DaemonState

__all__ = ["DaemonLockedError", "serve", "setup_logging", "stop_logging"]

log = logging.getLogger("localllm.daemon")

# Streams still running at shutdown get this long to finish before they are cancelled.
_GRACEFUL_SECONDS = 5
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


class DaemonLockedError(SettingsError):
    """Another daemon already serves this home."""


def setup_logging(settings: Settings) -> Path:
    """Send the daemon's and uvicorn's logs to ``daemon.log``, each answer's access line
    included (:data:`~.app.ACCESS_LOG`, written once the answer is over).

    A request's thread only queues its records (``QueueHandler``); one listener thread writes
    them to the file, so no log line's disk write sits between a request's arrival and its
    first byte (uvicorn's access line and ours were written synchronously before it).
    :func:`stop_logging` writes what is queued; :func:`serve` calls it on every exit and
    ``atexit`` on the way out of the interpreter.
    """
    settings.log_dir.mkdir(parents=True, exist_ok=True)
    path = settings.log_dir / "daemon.log"
    handler = logging.handlers.RotatingFileHandler(path, maxBytes=20 << 20, backupCount=3)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    level = logging.DEBUG if settings.debug else logging.INFO
    # A log that cannot be written (a full disk) is no reason to print tracebacks.
    logging.raiseExceptions = False
    stop_logging()
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    listener = logging.handlers.QueueListener(records, handler)
    listener.start()
    _listeners.append(listener)
    queued = logging.handlers.QueueHandler(records)
    for logger in (*map(logging.getLogger, ("localllm", "uvicorn", "uvicorn.error")), ACCESS_LOG):
        logger.handlers = [queued]
        logger.setLevel(level)
        logger.propagate = False
    return path


_listeners: list[logging.handlers.QueueListener] = []


def stop_logging() -> None:
    """Write every queued log record, stop the writer thread and close the file (records
    logged later are queued for no one: call :func:`setup_logging` again to log)."""
    while _listeners:
        listener = _listeners.pop()
        listener.stop()  # joins the thread after it wrote everything queued before
        for handler in listener.handlers:
            # A full disk fails the final flush: the lines are lost either way, and (as in
            # logging.shutdown) it is no reason for the daemon to exit with an error.
            with contextlib.suppress(OSError, ValueError):
                handler.close()


atexit.register(stop_logging)


def _unusable(settings: Settings, path: Path, exc: OSError) -> SettingsError:
    """One line naming the folder the daemon cannot write (a missing or read-only data root)."""
    return SettingsError(
        f"cannot write to {path} ({exc.strerror}); the data root is {settings.data_dir} "
        "(LOCALLLM_HOME): mount it, make it writable or choose another"
    )


@contextlib.contextmanager
def _daemon_lock(settings: Settings) -> Iterator[None]:
    runtime = settings.runtime_dir
    path = runtime / "daemon.lock"
    try:
        runtime.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise _unusable(settings, runtime, exc) from None
    try:
        holder = claim(fd, str(os.getpid()))
        if holder is not None:
            raise DaemonLockedError(
                f"another localllm daemon (pid {holder or 'unknown'}) is already running for "
                f"{settings.data_dir}; stop it first, or set LOCALLLM_HOME for a separate one"
            ) from None
        yield
    finally:
        os.close(fd)  # releases the lock


def _unix_socket(path: Path) -> socket.socket:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # a stale socket from a crashed daemon; the lock says none runs now
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)  # the socket is born 0600: no window where others can connect
    try:
        sock.bind(str(path))
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def _tcp_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, not left 0: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on
    # connections whose socket says TCP, and accepted ones inherit the listener's protocol
    # number. With Nagle on, a response written in two parts (headers, then body) waited for
    # the client's delayed ACK: every request after a kept-alive connection's first took
    # 40 ms more.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise SettingsError(
                f"{host}:{port} is already in use (another daemon or program?); "
                "set LOCALLLM_HOST to another port"
            ) from None
        raise SettingsError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signal handling to :func:`serve` (two share one loop)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _config(app: object, settings: Settings) -> uvicorn.Config:
    return uvicorn.Config(
        app,  # type: ignore[arg-type]
        # httptools (a dependency) where it imports, else h11: the same server either way;
        # a response's head leaves with its first body bytes (see .httphead).
        http=protocol_class(),
        lifespan="off",
        log_config=None,
        access_log=False,  # written by the app once each answer is over (app._CountRequests)
        timeout_graceful_shutdown=_GRACEFUL_SECONDS,
        timeout_keep_alive=30,
        server_header=False,
        proxy_headers=False,
    )


async def _run(settings: Settings, unix_sock: socket.socket, tcp_sock: socket.socket) -> None:
    state = DaemonState.create(settings)
    app = create_app(settings, state)
    servers = [_Server(_config(app, settings)), _Server(_config(app, settings))]
    loop = asyncio.get_running_loop()
    stop_requested = asyncio.Event()

    def request_stop(signum: int) -> None:
        log.info("received %s; shutting down", signal.Signals(signum).name)
        if stop_requested.is_set():
            for server in servers:
                server.force_exit = True
        stop_requested.set()
        for server in servers:
            server.should_exit = True

    for signum in _STOP_SIGNALS:
        loop.add_signal_handler(signum, request_stop, signum)
    # Signals that arrived since serve() blocked them are delivered now, to the handler above.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    try:
        # The bundled starter model appears on first use of a store, with no network. A
        # failure (a full disk, say) must not keep the daemon from serving what exists.
        # The CPU probe runs (or its cached decision is read) before any request needs it.
        state.scheduler.probe_cpu()
        await asyncio.to_thread(_check_store, state)
        try:
            await asyncio.to_thread(ensure_starter, state.store)
        except (LocalLLMError, OSError) as exc:
            log.warning("could not import the starter model: %s", exc)
        preloading = asyncio.create_task(preload(state)) if settings.preload else None
        probing = asyncio.create_task(_measure_speed(state))
        await asyncio.gather(servers[0].serve([unix_sock]), servers[1].serve([tcp_sock]))
        if preloading is not None and not preloading.done():
            preloading.cancel()
        probing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await probing
    finally:
        for signum in _STOP_SIGNALS:
            loop.remove_signal_handler(signum)
        await state.scheduler.close()
        log.info("daemon stopped")


async def _measure_speed(state: DaemonState) -> None:
    """This machine's speed at the first quiet moment (see :mod:`localllm.daemon.speed.watch`),
    once the CPU
    probe's decision (which the speed probe follows) is known."""
    try:
        await state.scheduler.cpu_paths()
        await state.speedwatch.run()
    except asyncio.CancelledError:
        raise
    except Exception:  # predictions are a convenience: never a reason for the daemon to stop
        log.exception("the speed probe could not be run")


def _check_store(state: DaemonState) -> None:
    """The start-up check (see :mod:`localllm.store.check`): temporary files of killed writes
    are removed; damaged models, unused blobs and a store that cannot be written are reported,
    in the log and, what needs the user, as one line each on stderr. The daemon serves on."""
    report = check_store(state.store)
    log.info("%s", report.summary())
    for line in report.lines():
        log.warning("store: %s", line)
    damaged = [line for line in report.lines() if line.startswith("model ")]
    for line in [report.error, report.warning, *damaged]:
        if line:
            print(f"localllm: {line}", file=sys.stderr, flush=True)


def serve(settings: Settings, *, announce: bool = True) -> int:
    """Run the daemon in the foreground until SIGTERM/SIGINT. Returns an exit status.

    Raises SettingsError (including :class:`DaemonLockedError`) when it cannot start: a
    non-loopback address without an API key, another daemon for this home, a busy port.
    """
    check_bind_allowed(settings)
    try:
        log_path = setup_logging(settings)
    except OSError as exc:
        raise _unusable(settings, settings.log_dir, exc) from None
    try:
        socket_path = settings.socket_path
        # From the announcement on, a SIGTERM must mean a clean shutdown, not death by the default
        # action: hold the signals until the event loop's handlers are in place.
        signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        with _daemon_lock(settings):
            tcp_sock = _tcp_socket(settings.bind_host, settings.bind_port)
            unix_sock = _unix_socket(socket_path)
            log.info(
                "localllm %s daemon (pid %d) listening on %s and %s",
                __version__,
                os.getpid(),
                socket_path,
                settings.base_url,
            )
            if announce:
                print(
                    f"localllm daemon listening on {settings.base_url} and {socket_path} "
                    f"(log: {log_path})",
                    file=sys.stderr,
                    flush=True,
                )
            try:
                asyncio.run(_run(settings, unix_sock, tcp_sock))
            finally:
                unix_sock.close()
                tcp_sock.close()
                with contextlib.suppress(FileNotFoundError):
                    socket_path.unlink()
    finally:
        stop_logging()  # every queued line on disk before the process ends
    return 0
