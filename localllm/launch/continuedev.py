"""Continue (the ``cn`` CLI; the VS Code and JetBrains extensions read the same file), over
the daemon's OpenAI chat completions.

What Continue reads, from its documentation (docs.continue.dev/reference, the
``config.yaml`` reference, and docs.continue.dev/cli/configuration, read 2026-12):
``~/.continue/config.yaml`` with the required ``name``, ``version`` and ``schema: v1``, and
``models``, each with ``name``, ``provider`` (``openai`` for an OpenAI-compatible server),
``model``, ``apiBase``, ``apiKey``, ``roles`` (default chat, edit, apply, summarize),
``capabilities`` (``tool_use``) and ``defaultCompletionOptions.contextLength`` /
``maxTokens``. ``cn`` takes another file with ``--config PATH``. A launch writes a config of
localllm's own and passes it with ``--config``; ``--config`` adds the model to
``~/.continue/config.yaml`` (an entry of the same name is replaced, the others kept).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .base import OPENAI_CHAT, Target, Tool
from .configfile import Change, update_yaml

__all__ = ["Continue"]

_EMPTY = {"name": "localllm", "version": "1.0.0", "schema": "v1"}


class Continue(Tool):
    """Continue."""

    name = "continue"
    title = "Continue"
    commands = ("cn",)
    api = OPENAI_CHAT

    def _entry(self, target: Target) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "name": target.label,
            "provider": "openai",
            "model": target.model,
            "apiBase": target.openai_url,
            "apiKey": target.token,
            "roles": ["chat", "edit", "apply", "summarize"],
            "defaultCompletionOptions": {
                "contextLength": target.context,
                "maxTokens": target.output_tokens,
            },
        }
        if target.tools:
            entry["capabilities"] = ["tool_use"]
        return entry

    def _edit(self, target: Target) -> Any:
        entry = self._entry(target)

        def edit(data: Any) -> list[str]:
            lines = [f"{key} = {value!r}" for key, value in _EMPTY.items() if key not in data]
            for key, value in _EMPTY.items():
                data.setdefault(key, value)
            models = data.get("models")
            if models is None:
                data["models"] = models = []
            for index, existing in enumerate(models):
                if isinstance(existing, dict) and existing.get("name") == entry["name"]:
                    if dict(existing) == entry:
                        return lines
                    models[index] = entry
                    return [*lines, f"models: replaced {entry['name']!r}"]
            models.append(entry)
            return [*lines, f"models: added {entry['name']!r}"]

        return edit

    def _own_config(self, target: Target) -> Path:
        return target.state_dir / "continue.yaml"

    def prepare(self, target: Target) -> list[Change]:
        """A config of localllm's own holding the model."""
        return [update_yaml(self._own_config(target), self._edit(target), _EMPTY)]

    def arguments(self, target: Target, extra: Sequence[str]) -> list[str]:
        """``--config FILE`` and the user's own arguments."""
        return ["--config", str(self._own_config(target)), *extra]

    def config_files(self, target: Target) -> list[Path]:
        """``~/.continue/config.yaml``."""
        return [target.home() / ".continue" / "config.yaml"]

    def configure(self, target: Target) -> list[Change]:
        """The model added to the global config."""
        return [update_yaml(self.config_files(target)[0], self._edit(target), _EMPTY)]
