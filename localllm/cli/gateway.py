"""``localllm gateway``: many daemons behind one endpoint.

``localllm gateway --worker URL ...`` checks the workers, starts the Shepherd Model Gateway in
front of them (see :mod:`localllm.gateway`) and runs until Ctrl-C or SIGTERM. ``localllm ps
--all`` (:mod:`~localllm.cli.ps`) asks that gateway for its workers.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
from pathlib import Path
from types import FrameType

from .commands import EXIT_OK
from .common import UsageError, load_settings

__all__ = ["add_gateway_arguments", "cmd_gateway"]


def add_gateway_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``gateway`` command's options."""
    from ..gateway import DEFAULT_GATEWAY_PORT, POLICIES

    parser.add_argument(
        "--worker",
        action="append",
        default=[],
        metavar="URL",
        help="a daemon to route to (http://host:port; repeat for each)",
    )
    parser.add_argument(
        "--workers-file",
        type=Path,
        metavar="FILE",
        help="more workers: one URL a line, # comments",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)"
    )
    parser.add_argument(
        "--port",
        type=int,
        default=DEFAULT_GATEWAY_PORT,
        help=f"port to listen on (default: {DEFAULT_GATEWAY_PORT}; metrics one above)",
    )
    parser.add_argument(
        "--metrics-port", type=int, metavar="PORT", help="Prometheus port (default: PORT+1)"
    )
    parser.add_argument(
        "--policy",
        choices=POLICIES,
        default="cache_aware",
        help="routing: to the worker holding the prompt's prefix (default), in turn, or the "
        "less loaded of two",
    )
    parser.add_argument(
        "--api-key",
        metavar="KEY",
        help="sent to the workers and required from clients (default: LOCALLLM_API_KEY; "
        "needed beyond loopback)",
    )
    parser.add_argument(
        "--health-interval",
        type=int,
        default=5,
        metavar="SECONDS",
        help="seconds between worker health checks (default: 5)",
    )
    parser.add_argument(
        "--shutdown-grace",
        type=int,
        default=10,
        metavar="SECONDS",
        help="on Ctrl-C or SIGTERM, wait this long for streams in flight (default: 10)",
    )


def _worker_urls(args: argparse.Namespace) -> list[str]:
    from ..gateway import parse_worker_url, read_worker_file

    urls = [parse_worker_url(url) for url in args.worker]
    if args.workers_file is not None:
        urls += read_worker_file(args.workers_file)
    if not urls:
        raise UsageError("no worker: give --worker URL (repeatable) or --workers-file FILE")
    return list(dict.fromkeys(urls))


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def cmd_gateway(args: argparse.Namespace) -> int:
    """``gateway``: check the workers, start smg in front of them, run until stopped."""
    from ..gateway import (
        Gateway,
        GatewayConfig,
        GatewayError,
        check_workers,
        describe_problems,
        model_aliases,
        state_path,
    )

    settings = load_settings()
    api_key = args.api_key if args.api_key is not None else settings.api_key
    urls = _worker_urls(args)
    config = GatewayConfig(  # checked (address, key, intervals) before any worker is asked
        workers=tuple(urls),
        host=args.host,
        port=args.port,
        metrics_port=args.metrics_port,
        policy=args.policy,
        api_key=api_key or None,
        health_interval=args.health_interval,
        shutdown_grace=args.shutdown_grace,
    )
    checks = check_workers(urls, api_key)
    problems = describe_problems(checks)
    if problems:
        print(f"Warning: {problems}", file=sys.stderr, flush=True)
    workers = tuple(c.url for c in checks if c.joins)
    if not workers:
        raise GatewayError("no worker is a localllm daemon (nor down): nothing to route to")
    config = dataclasses.replace(config, workers=workers, aliases=model_aliases(checks))
    gateway = Gateway.start(config, settings.log_dir / "gateway.log")
    # SIGTERM (a service manager) stops it as Ctrl-C does: the gateway ends its streams.
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    path = None
    try:
        up = sum(1 for c in checks if c.status == "ok")
        healthy = gateway.wait_workers(up, timeout=30.0)
        path = gateway.write_state(settings)
        print(
            f"gateway listening on {config.url} ({config.policy}, {healthy} of "
            f"{len(workers)} workers up); log: {gateway.log_path}; Ctrl-C stops it",
            flush=True,
        )
        status = gateway.process.wait()
        raise GatewayError(
            f"the gateway exited with status {status}; its log ends with:\n{gateway.log_tail()}"
        )
    except KeyboardInterrupt:
        return EXIT_OK
    finally:
        signal.signal(signal.SIGTERM, previous)
        gateway.stop()
        if path is not None:
            state_path(settings).unlink(missing_ok=True)
