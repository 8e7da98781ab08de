"""Widgets of the TUI's screens."""
