"""Many daemons behind one endpoint: the gateway that ``localllm gateway`` starts.

The router is not ours. It is the Shepherd Model Gateway (``smg`` on PyPI, the SGLang
router's successor; ``pip install "localllm[fleet]"``): a Rust binary that keeps an
approximate prefix tree of the prompts it has routed and sends each request to the worker
most likely to hold its prefix in its KV cache (``cache_aware``), or round-robin. This module
only decides how to start it in front of localllm daemons and checks the workers first:

* **Workers** are daemon URLs (``http://host:port``; ``host`` alone means port 11435), given
  on the command line or in a file (one a line, ``#`` comments). Each is checked before the
  gateway starts: it must answer ``GET /`` as localllm (see :meth:`Client.identify`) and list
  its models. One that is down is still handed to the gateway, which registers it when it
  comes up; one that answers as something else, or refuses the API key, is left out. Either
  way :func:`describe_problems` names them in one line.
* **What smg reads from a daemon**: ``GET /health`` (its health check, every
  ``health_interval`` seconds; a worker failing twice takes no requests until it answers
  again), ``GET /v1/models`` (the models it routes there), ``GET /v1/loads`` (the daemon's
  running and waiting requests, slots and KV use, every ``load_interval`` seconds, see
  ``localllm.daemon.api.fleet``). It also probes ``/version``, ``/server_info`` and
  ``/model_info`` to recognise vLLM and SGLang; a daemon answers 404 there, and smg treats
  it as a generic OpenAI-compatible engine.
* **Names**: smg matches ``model`` exactly against ``/v1/models``, where a daemon lists
  ``name:tag``. For each ``name:latest`` on a worker that answered, the gateway is told that
  ``name`` means the same (``--model-alias``), as a daemon itself reads it.
* **API key**: ``api_key`` is sent to the workers and required from the gateway's clients
  (smg's ``--api-key`` does both). A gateway listening beyond loopback needs one. The key
  reaches the smg process on its stdin, not its command line (which other users can read).
* **Process**: ``python -m localllm.gateway`` reads the smg arguments and the key from stdin
  and runs smg's own launcher; its log goes to ``gateway.log`` in the log dir. While it runs,
  ``gateway.json`` in the runtime dir says where it listens, for ``localllm ps --all``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit

from ._exceptions import APIError, DaemonUnavailableError, LocalLLMError
from ._process import pid_alive
from .settings import DEFAULT_PORT, Settings

if TYPE_CHECKING:
    from .client import GatewayClient

__all__ = [
    "DEFAULT_GATEWAY_PORT",
    "POLICIES",
    "Gateway",
    "GatewayConfig",
    "GatewayError",
    "GatewayState",
    "WorkerCheck",
    "check_worker",
    "check_workers",
    "describe_problems",
    "model_aliases",
    "parse_worker_url",
    "read_gateway_state",
    "read_worker_file",
    "smg_arguments",
    "state_path",
]

DEFAULT_GATEWAY_PORT = 11440
"""Where ``localllm gateway`` listens unless ``--port`` says otherwise (its Prometheus
metrics one port above)."""

POLICIES = ("cache_aware", "round_robin", "power_of_two")
"""Routing policies offered: smg's prefix-tree routing, plain rotation, and the less loaded of
two random workers (by the load each daemon reports at ``/v1/loads``)."""


class GatewayError(LocalLLMError):
    """The gateway cannot start: no smg, no usable worker, a bad address, or smg exited."""


# -- workers ---------------------------------------------------------------------------------


def parse_worker_url(text: str) -> str:
    """``http://host:port`` for a worker written as a URL, ``host:port`` or ``host`` (port
    11435). Raises :class:`GatewayError` for anything else (a path, another scheme)."""
    raw = text.strip()
    parts = urlsplit(raw if "://" in raw else f"http://{raw}")
    if parts.scheme not in ("http", "https"):
        raise GatewayError(f"worker {text!r}: use http://host:port")
    if parts.path not in ("", "/") or parts.query or parts.fragment or not parts.hostname:
        raise GatewayError(f"worker {text!r}: give the daemon's address only (http://host:port)")
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError:
        raise GatewayError(f"worker {text!r}: invalid port") from None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}:{port}"


def read_worker_file(path: Path) -> list[str]:
    """Worker URLs from ``path``: one a line; blank lines and ``#`` comments are skipped."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise GatewayError(f"cannot read the workers file {path}: {exc.strerror or exc}") from exc
    urls = []
    for line in text.splitlines():
        entry = line.split("#", 1)[0].strip()
        if entry:
            urls.append(parse_worker_url(entry))
    return urls


WorkerStatus = Literal["ok", "down", "foreign", "refused"]


@dataclass(frozen=True)
class WorkerCheck:
    """What a worker answered before the gateway started."""

    url: str
    """The worker's URL."""
    status: WorkerStatus
    """``ok`` (a localllm daemon), ``down`` (nothing answers), ``foreign`` (something that is
    not localllm answers) or ``refused`` (a daemon that refuses the API key)."""
    detail: str = ""
    """Why, when not ``ok``."""
    version: str | None = None
    """The daemon's version, when ``ok``."""
    models: tuple[str, ...] = ()
    """Its models (``/v1/models`` ids), when ``ok``."""

    @property
    def joins(self) -> bool:
        """Whether the gateway is given this worker (a down one joins when it answers)."""
        return self.status in ("ok", "down")


def _cause(exc: BaseException) -> str:
    cause = exc.__cause__
    text = str(cause) if cause is not None and str(cause) else ""
    return text or (cause.__class__.__name__ if cause is not None else str(exc))


def check_worker(url: str, api_key: str | None = None, timeout: float = 5.0) -> WorkerCheck:
    """Whether a localllm daemon answers at ``url``, with its version and models."""
    from .client import Client  # httpx: not on the path of ``localllm --help``

    with Client(base_url=url, api_key=api_key, timeout=timeout) as client:
        try:
            other = client.identify()
        except DaemonUnavailableError as exc:
            return WorkerCheck(url, "down", _cause(exc))
        if other is not None:
            return WorkerCheck(url, "foreign", other)
        try:
            version = client.version()
            models = tuple(str(m["id"]) for m in client.openai_models())
        except APIError as exc:
            status: WorkerStatus = "refused" if exc.status_code in (401, 403) else "foreign"
            return WorkerCheck(url, status, f"HTTP {exc.status_code}: {exc}")
        except DaemonUnavailableError as exc:
            return WorkerCheck(url, "down", _cause(exc))
    return WorkerCheck(url, "ok", version=version, models=models)


def check_workers(
    urls: Sequence[str], api_key: str | None = None, timeout: float = 5.0
) -> list[WorkerCheck]:
    """:func:`check_worker` for each URL, in order (duplicates are one worker), all at once:
    a fleet of unreachable hosts costs one ``timeout``, not one each."""
    from concurrent.futures import ThreadPoolExecutor

    unique = list(dict.fromkeys(urls))
    if not unique:
        return []
    with ThreadPoolExecutor(min(len(unique), 16)) as pool:
        return list(pool.map(lambda url: check_worker(url, api_key, timeout), unique))


_WHAT_HAPPENS = {
    "down": "it joins when it answers",
    "foreign": "left out",
    "refused": "left out",
}
_WHAT_IT_IS = {"down": "is down", "foreign": "is not localllm", "refused": "refuses the API key"}


def describe_problems(checks: Iterable[WorkerCheck]) -> str | None:
    """One line naming every worker that is not a localllm daemon answering now, or None."""
    checks = list(checks)
    bad = [c for c in checks if c.status != "ok"]
    if not bad:
        return None
    parts = [
        f"{c.url} {_WHAT_IT_IS[c.status]} ({c.detail}; {_WHAT_HAPPENS[c.status]})" for c in bad
    ]
    return f"{len(bad)} of {len(checks)} workers not serving: " + ", ".join(parts)


def model_aliases(checks: Iterable[WorkerCheck]) -> dict[str, str]:
    """``name`` → ``name:latest`` for every ``name:latest`` that answering workers list, when
    no worker lists a model called plain ``name`` (a daemon reads ``name`` as ``name:latest``,
    smg matches names exactly)."""
    models = {m for c in checks if c.status == "ok" for m in c.models}
    aliases = {}
    for model in sorted(models):
        base, _, tag = model.rpartition(":")
        if tag == "latest" and base and base not in models:
            aliases[base] = model
    return aliases


# -- the smg process -------------------------------------------------------------------------


def _is_loopback(host: str) -> bool:
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class GatewayConfig:
    """How to start the gateway."""

    workers: tuple[str, ...]
    """Worker URLs handed to smg."""
    host: str = "127.0.0.1"
    """Address to listen on; beyond loopback it needs ``api_key``."""
    port: int = DEFAULT_GATEWAY_PORT
    """Port for clients."""
    metrics_port: int | None = None
    """Port of smg's Prometheus ``/metrics`` (on ``host``); None: ``port + 1``."""
    policy: str = "cache_aware"
    """One of :data:`POLICIES`."""
    api_key: str | None = None
    """Sent to the workers and required from clients."""
    aliases: dict[str, str] = field(default_factory=dict)
    """Extra model names: alias → the name workers list."""
    health_interval: int = 5
    """Seconds between health checks of each worker (and between tries to register a worker
    that was down)."""
    load_interval: int = 2
    """Seconds between polls of each worker's ``/v1/loads``."""
    shutdown_grace: int = 10
    """Seconds a stop waits for streams in flight (smg takes about half of it even when
    none is)."""

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise GatewayError(f"unknown policy {self.policy!r}: use {', '.join(POLICIES)}")
        if not self.workers:
            raise GatewayError("no worker: give --worker URL (or --workers-file FILE)")
        if not _is_loopback(self.host) and not self.api_key:
            raise GatewayError(
                f"refusing to listen on {self.host}: it is not a loopback address; give "
                "--api-key (or set LOCALLLM_API_KEY) so that clients must authenticate"
            )
        if min(self.health_interval, self.load_interval, self.shutdown_grace) < 1:
            raise GatewayError("intervals and the shutdown grace are whole seconds, at least 1")

    @property
    def url(self) -> str:
        """Where clients reach the gateway (0.0.0.0 through 127.0.0.1)."""
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self.host, self.host)
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"


# Why these differ from smg's defaults (sized for GPU servers with hundreds of slots):
# - a daemon has a few slots (LOCALLLM_NUM_PARALLEL, 4 by default), so a popular prefix
#   spills to another worker once its home has 8 requests more than the fleet's least
#   loaded one, not 64;
# - a daemon started later (or restarted) is registered whenever it answers, not given up on
#   after 30 minutes;
# - a worker's health is checked every few seconds, not every minute, and one failure
#   streak of two takes it out; one good answer brings it back;
# - shutdown waits 10 s for streams in flight (GatewayConfig.shutdown_grace), not 3 minutes.
_TUNING = {
    "--balance-abs-threshold": "8",
    "--worker-startup-timeout-secs": str(7 * 24 * 3600),
    "--health-failure-threshold": "2",
    "--health-success-threshold": "1",
    "--health-check-timeout-secs": "3",
    "--retry-max-retries": "3",
}


def smg_arguments(config: GatewayConfig) -> list[str]:
    """The ``smg launch`` arguments for ``config`` (without the API key, which travels on
    the launcher's stdin)."""
    metrics_port = config.metrics_port if config.metrics_port is not None else config.port + 1
    args = [
        "--worker-urls",
        *config.workers,
        "--host",
        config.host,
        "--port",
        str(config.port),
        "--policy",
        config.policy,
        # smg's metrics listener binds every interface by default; keep it with the gateway
        "--prometheus-host",
        config.host,
        "--prometheus-port",
        str(metrics_port),
        "--health-check-endpoint",
        "/health",
        "--health-check-interval-secs",
        str(config.health_interval),
        "--worker-startup-check-interval",
        str(config.health_interval),
        "--load-monitor-interval",
        str(config.load_interval),
        "--shutdown-grace-period-secs",
        str(config.shutdown_grace),
        "--log-level",
        "warn",
    ]
    for option, value in _TUNING.items():
        args += [option, value]
    for alias, model in sorted(config.aliases.items()):
        args += ["--model-alias", f"{alias}={model}"]
    return args


@dataclass(frozen=True)
class GatewayState:
    """``gateway.json`` in the runtime dir while a gateway started here runs."""

    url: str
    """Where clients reach it."""
    pid: int
    """The smg launcher's process id."""
    policy: str
    """Its routing policy."""
    workers: tuple[str, ...]
    """The worker URLs it was given."""
    started_at: float
    """When it became ready (epoch seconds)."""


def state_path(settings: Settings) -> Path:
    """Where a running gateway's :class:`GatewayState` is kept."""
    return settings.runtime_dir / "gateway.json"


def read_gateway_state(settings: Settings) -> GatewayState | None:
    """The gateway started here, if one still runs (a stale file is ignored)."""
    try:
        data = json.loads(state_path(settings).read_text(encoding="utf-8"))
        state = GatewayState(
            url=str(data["url"]),
            pid=int(data["pid"]),
            policy=str(data["policy"]),
            workers=tuple(str(w) for w in data["workers"]),
            started_at=float(data["started_at"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return state if pid_alive(state.pid) else None


def smg_installed() -> bool:
    """Whether the smg package (the ``fleet`` extra) can be imported."""
    import importlib.util

    return importlib.util.find_spec("smg") is not None


class Gateway:
    """A running smg process started by :meth:`start`; stop it with :meth:`stop`."""

    def __init__(self, config: GatewayConfig, process: subprocess.Popen[bytes], log: Path) -> None:
        self.config = config
        self.process = process
        self.log_path = log
        from .client import GatewayClient

        self.client: GatewayClient = GatewayClient(config.url, api_key=config.api_key)

    @classmethod
    def start(cls, config: GatewayConfig, log_path: Path) -> Gateway:
        """Start smg for ``config``, logging to ``log_path``; returns once it answers."""
        if not smg_installed():
            raise GatewayError(
                "the gateway is not installed: pip install 'localllm[fleet]' (it adds smg, "
                "the Shepherd Model Gateway)"
            )
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "localllm.gateway"],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        assert process.stdin is not None
        launch = {"args": smg_arguments(config), "api_key": config.api_key}
        process.stdin.write(json.dumps(launch).encode() + b"\n")
        process.stdin.close()
        gateway = cls(config, process, log_path)
        try:
            gateway.wait_answering()
        except BaseException:
            gateway.stop()
            raise
        return gateway

    def log_tail(self, lines: int = 5) -> str:
        """The last lines of its log (why it exited)."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def _check_running(self) -> None:
        if self.process.poll() is not None:
            raise GatewayError(
                f"the gateway exited with status {self.process.returncode}; its log "
                f"({self.log_path}) ends with:\n{self.log_tail()}"
            )

    def wait_answering(self, timeout: float = 60.0) -> None:
        """Wait until smg answers ``/readiness`` (ready or not)."""
        deadline = time.monotonic() + timeout
        while True:
            self._check_running()
            try:
                self.client.readiness()
                return
            except (DaemonUnavailableError, APIError):
                if time.monotonic() > deadline:
                    raise GatewayError(
                        f"the gateway did not answer at {self.config.url} within {timeout:.0f} "
                        f"s; its log ({self.log_path}) ends with:\n{self.log_tail()}"
                    ) from None
            time.sleep(0.1)

    def wait_workers(self, count: int, timeout: float = 60.0) -> int:
        """Wait until ``count`` workers are healthy (registered and answering); returns how
        many are, which is fewer only when ``timeout`` passed first."""
        deadline = time.monotonic() + timeout
        healthy = 0
        while True:
            self._check_running()
            with contextlib.suppress(DaemonUnavailableError, APIError):
                healthy = int(self.client.readiness().get("healthy_workers", 0))
            if healthy >= count or time.monotonic() > deadline:
                return healthy
            time.sleep(0.1)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, wait (streams in flight get smg's grace period), SIGKILL after
        ``timeout``; returns the exit status."""
        self.client.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return int(self.process.returncode)

    def write_state(self, settings: Settings) -> Path:
        """Record where it listens for ``localllm ps --all``; returns the file."""
        state = GatewayState(
            url=self.config.url,
            pid=self.process.pid,
            policy=self.config.policy,
            workers=self.config.workers,
            started_at=time.time(),
        )
        path = state_path(settings)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(state)) + "\n", encoding="utf-8")
        tmp.replace(path)
        return path


def _exit_with_parent(parent: int) -> None:
    # smg serves until a signal; if whoever started it dies without sending one (SIGKILL),
    # it must not outlive it holding the port.
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def _launch_from_stdin() -> None:
    """The gateway process: smg's launcher with the arguments (and key) read from stdin."""
    from smg.launch_router import launch_router, parse_router_args

    launch = json.loads(sys.stdin.readline())
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    router_args = parse_router_args(list(launch["args"]))
    if launch.get("api_key"):
        router_args.api_key = launch["api_key"]
    launch_router(router_args)


if __name__ == "__main__":
    _launch_from_stdin()
