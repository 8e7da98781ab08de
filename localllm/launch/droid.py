"""Factory's Droid (``droid``), over the daemon's OpenAI chat completions.

What Droid reads, from its documentation (docs.factory.ai/cli/byok/overview, "Bring Your
Own Key", read 2026-12): ``~/.factory/settings.json``, a ``customModels`` list whose entries
have ``model``, ``displayName``, ``baseUrl``, ``apiKey``, ``provider``
(``generic-chat-completion-api`` for an OpenAI chat-completions server) and
``maxOutputTokens``; the model is then picked with ``/model`` in a session. Droid reads its
models from that file only, so a launch writes it too (the entry for this model replaced,
every other entry kept, a backup kept). Ollama's ``launch droid`` (cmd/launch/droid.go)
writes the same list.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._exceptions import LaunchError
from .base import OPENAI_CHAT, Target, Tool
from .configfile import Change, update_json

__all__ = ["Droid"]


class Droid(Tool):
    """Factory Droid."""

    name = "droid"
    title = "Droid (Factory)"
    commands = ("droid",)
    api = OPENAI_CHAT
    settings_only = True

    def config_files(self, target: Target) -> list[Path]:
        """``~/.factory/settings.json``."""
        return [target.home() / ".factory" / "settings.json"]

    def configure(self, target: Target) -> list[Change]:
        """This model's entry in ``customModels``."""
        entry = {
            "model": target.model,
            "displayName": target.label,
            "baseUrl": target.openai_url,
            "apiKey": target.token,
            "provider": "generic-chat-completion-api",
            "maxOutputTokens": target.output_tokens,
        }

        def edit(data: dict[str, Any]) -> list[str]:
            models = data.get("customModels", [])
            if not isinstance(models, list):
                raise LaunchError("customModels is not a list: fix it by hand")
            mine = [
                m
                for m in models
                if isinstance(m, dict) and m.get("displayName") == entry["displayName"]
            ]
            if mine == [entry]:
                return []
            data["customModels"] = [m for m in models if m not in mine] + [entry]
            verb = "replaced" if mine else "added"
            return [f"customModels: {verb} {entry['displayName']!r}"]

        return [update_json(self.config_files(target)[0], edit)]

    def after_configure(self, target: Target) -> str:
        """Where the model is picked."""
        return f"droid, then /model and {target.label}"
