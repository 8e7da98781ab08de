"""The commands about the daemon itself: ``serve`` (run it in the foreground) and ``version``."""

from __future__ import annotations

import argparse
import sys

from .commands import EXIT_OK

__all__ = ["cmd_serve", "cmd_version"]


def cmd_serve(args: argparse.Namespace) -> int:
    """``serve``: run the daemon in the foreground until SIGTERM or Ctrl-C."""
    from ..daemon.server import serve
    from .common import load_settings

    return serve(load_settings())


def cmd_version(args: argparse.Namespace) -> int:
    """``version``: this version, and the daemon's when a running one differs."""
    from .. import __version__

    print(f"localllm version {__version__}")
    from ..client import Client
    from .common import load_settings

    with Client(load_settings()) as client:
        if client.is_running():
            daemon_version = client.version()
            if daemon_version != __version__:
                print(f"Warning: the running daemon is version {daemon_version}", file=sys.stderr)
    return EXIT_OK
