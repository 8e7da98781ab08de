"""The TUI's screens: chat, models, dashboard (the app's modes), help and dialogs."""

from __future__ import annotations

__all__: list[str] = []
