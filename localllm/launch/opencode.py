"""OpenCode (``opencode``), over the daemon's OpenAI chat completions.

What OpenCode reads, from its documentation (opencode.ai/docs/config and
opencode.ai/docs/providers, read 2026-12): JSON or JSONC config, merged from several places
in order: the global ``~/.config/opencode/opencode.json`` (under ``XDG_CONFIG_HOME``),
``OPENCODE_CONFIG``, the project's ``opencode.json``, and last the inline
``OPENCODE_CONFIG_CONTENT`` variable. A custom provider is an entry of ``provider`` with
``npm: "@ai-sdk/openai-compatible"``, ``options.baseURL`` (and ``apiKey``) and ``models``,
each with ``limit.context`` / ``limit.output`` (without a limit OpenCode does not compact);
``model`` is ``provider/model``, which ``--model`` also takes on the command line. A launch
passes the provider in ``OPENCODE_CONFIG_CONTENT`` (as Ollama's ``launch opencode`` does) and
writes no file; ``--config`` merges it into the global file (``opencode.jsonc`` when that is
the one present).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .base import OPENAI_CHAT, PROVIDER, Target, Tool
from .configfile import Change, set_key, set_keys, update_json

__all__ = ["OpenCode"]


class OpenCode(Tool):
    """OpenCode."""

    name = "opencode"
    title = "OpenCode"
    commands = ("opencode",)
    api = OPENAI_CHAT

    def _provider(self, target: Target) -> dict[str, Any]:
        model: dict[str, Any] = {
            "name": target.label,
            "tool_call": target.tools,
            "limit": {"context": target.context, "output": target.output_tokens},
        }
        return {
            "npm": "@ai-sdk/openai-compatible",
            "name": "localllm",
            "options": {"baseURL": target.openai_url, "apiKey": target.token},
            "models": {target.model: model},
        }

    def _qualified(self, target: Target) -> str:
        return f"{PROVIDER}/{target.model}"

    def environment(self, target: Target) -> dict[str, str]:
        """The provider, inline."""
        content = {
            "$schema": "https://opencode.ai/config.json",
            "provider": {PROVIDER: self._provider(target)},
            "model": self._qualified(target),
        }
        return {"OPENCODE_CONFIG_CONTENT": json.dumps(content)}

    def arguments(self, target: Target, extra: Sequence[str]) -> list[str]:
        """``--model localllm/MODEL`` and the user's own arguments."""
        return ["--model", self._qualified(target), *extra]

    def config_files(self, target: Target) -> list[Path]:
        """The global config file."""
        folder = target.config_home() / "opencode"
        jsonc = folder / "opencode.jsonc"
        return [
            jsonc
            if jsonc.exists() and not (folder / "opencode.json").exists()
            else folder / "opencode.json"
        ]

    def configure(self, target: Target) -> list[Change]:
        """The provider's model added (other models and providers kept), and selected."""
        provider = self._provider(target)

        def edit(data: dict[str, Any]) -> list[str]:
            lines = (
                set_key(data, ["$schema"], "https://opencode.ai/config.json")
                if "$schema" not in data
                else []
            )
            base = ["provider", PROVIDER]
            lines += set_keys(data, base, {k: provider[k] for k in ("npm", "name", "options")})
            lines += set_keys(data, [*base, "models"], provider["models"])
            lines += set_key(data, ["model"], self._qualified(target))
            return lines

        return [update_json(self.config_files(target)[0], edit)]
