"""Zed (``zed``; ``zeditor`` where a distribution renames it), over the daemon's OpenAI chat
completions.

What Zed reads, from its documentation (zed.dev/docs/ai/llm-providers, "OpenAI API
Compatible", and zed.dev/docs/ai/agent-settings, read 2026-12): ``settings.json`` in
``~/.config/zed`` (``XDG_CONFIG_HOME``), JSON with comments; a provider under
``language_models.openai_compatible.<name>`` with ``api_url`` and ``available_models``, each
with ``name``, ``display_name``, ``max_tokens`` (the context) and ``capabilities``
(``tools``, ``images``, ``parallel_tool_calls``, ``prompt_cache_key``); the API key from the
variable named after the provider, ``<NAME>_API_KEY`` (``LOCALLLM_API_KEY`` here); and
``agent.default_model`` ``{provider, model}``. Zed reads its model settings from that file
only, so a launch writes it too (merged; a backup kept), then starts Zed with the key in its
environment.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._exceptions import LaunchError
from .base import OPENAI_CHAT, PROVIDER, Target, Tool
from .configfile import Change, set_key, update_json

__all__ = ["Zed"]


class Zed(Tool):
    """Zed."""

    name = "zed"
    title = "Zed"
    commands = ("zed", "zeditor")
    api = OPENAI_CHAT
    settings_only = True

    def config_files(self, target: Target) -> list[Path]:
        """``settings.json``."""
        return [target.config_home() / "zed" / "settings.json"]

    def configure(self, target: Target) -> list[Change]:
        """The provider and its model (other models kept), and the agent's default model."""
        model = {
            "name": target.model,
            "display_name": target.label,
            "max_tokens": target.context,
            "max_output_tokens": target.output_tokens,
            "capabilities": {
                "tools": target.tools,
                "images": False,
                "parallel_tool_calls": target.tools,
                "prompt_cache_key": False,
            },
        }

        def edit(data: dict[str, Any]) -> list[str]:
            base = ["language_models", "openai_compatible", PROVIDER]
            lines = set_key(data, [*base, "api_url"], target.openai_url)
            provider = data["language_models"]["openai_compatible"][PROVIDER]
            models = provider.get("available_models", [])
            if not isinstance(models, list):
                raise LaunchError(
                    f"{'.'.join(base)}.available_models is not a list: fix it by hand"
                )
            others = [
                m for m in models if not (isinstance(m, dict) and m.get("name") == target.model)
            ]
            if [*others, model] != models:
                provider["available_models"] = [*others, model]
                lines.append(f"{'.'.join(base)}.available_models: {target.model} set")
            default = {"provider": PROVIDER, "model": target.model}
            lines += set_key(data, ["agent", "default_model"], default)
            return lines

        return [update_json(self.config_files(target)[0], edit)]

    def environment(self, target: Target) -> dict[str, str]:
        """The key Zed reads for the provider named ``localllm``."""
        return {"LOCALLLM_API_KEY": target.token}

    def after_configure(self, target: Target) -> str:
        """Zed with the provider's key in its environment."""
        if target.api_key:
            return "zed, with LOCALLLM_API_KEY set to the daemon's key"
        return f"LOCALLLM_API_KEY={target.token} zed"
