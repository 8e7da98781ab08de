"""Widgets of the TUI's screens."""

from __future__ import annotations

__all__: list[str] = []
