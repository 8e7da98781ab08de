"""``localllm tui``: the terminal UI of :mod:`localllm.tui` (chat, models, live dashboard)."""

from __future__ import annotations

import argparse
from importlib import import_module

from .commands import EXIT_OK
from .common import UsageError, connect

__all__ = ["cmd_tui"]


def cmd_tui(args: argparse.Namespace) -> int:
    """``tui``: the terminal UI (chat, models, live dashboard)."""
    try:
        app = import_module("localllm.tui.app")
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.startswith("localllm.tui"):
            raise UsageError(
                "the terminal UI is not installed yet (localllm.tui.app is missing)"
            ) from None
        raise UsageError(f"the terminal UI cannot start: {exc}") from None
    entry = getattr(app, "main", None) or getattr(app, "run", None)
    if entry is None:
        raise UsageError("the terminal UI has no main() or run() entry point")
    connect().close()  # start the daemon first, so a failure is reported here, in plain text
    result = entry()
    return result if isinstance(result, int) else EXIT_OK
