"""Placeholder; filled in by a later issue."""
