"""Codex CLI (``codex``), over the daemon's Responses API (``/v1/responses``).

What Codex reads, from its documentation (developers.openai.com/codex/config-advanced,
"Custom model providers", "Profiles" and "OSS mode", and /codex/config-reference, read
2026-12): ``$CODEX_HOME/config.toml`` (``CODEX_HOME`` defaults to ``~/.codex``); a provider
is a ``[model_providers.<id>]`` table with ``name``, ``base_url`` (Codex appends
``/responses``), ``wire_api = "responses"`` (the only value current releases accept) and
``env_key`` (the variable holding the key, when one is needed); ``model_provider`` and
``model`` pick the provider and model; ``model_context_window`` gives a model's context
(Codex assumes one for models it does not know); ``web_search`` (``disabled``, ``cached``,
``live``) says whether Codex offers the model OpenAI's hosted web search, which a local
daemon cannot run (it answers a 400 naming the tool). Any key can be given for one run with
``-c key=value`` (the value in TOML) and the model with ``-m``: a launch passes everything
that way and writes no file. ``--config`` writes the provider table and selects it at the
top level of ``config.toml``. The ids ``openai``, ``ollama`` and ``lmstudio`` are reserved;
``localllm`` is not.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .base import PROVIDER, Target, Tool
from .configfile import Change, set_keys, update_toml

__all__ = ["Codex"]

_KEY_VARIABLE = "LOCALLLM_API_KEY"


class Codex(Tool):
    """Codex CLI."""

    name = "codex"
    title = "Codex CLI"
    commands = ("codex",)
    api = "OpenAI Responses (/v1/responses)"

    def _provider(self, target: Target) -> dict[str, Any]:
        provider: dict[str, Any] = {
            "name": "localllm",
            "base_url": target.openai_url,
            "wire_api": "responses",
        }
        if target.api_key:
            provider["env_key"] = _KEY_VARIABLE
        return provider

    def _settings(self, target: Target) -> dict[str, Any]:
        return {
            "model_provider": PROVIDER,
            "model": target.model,
            "model_context_window": target.context,
            # web search is a hosted tool (it runs at OpenAI): the daemon refuses it
            "web_search": "disabled",
        }

    def environment(self, target: Target) -> dict[str, str]:
        """The daemon's key, where the provider names it."""
        return {_KEY_VARIABLE: target.api_key} if target.api_key else {}

    def arguments(self, target: Target, extra: Sequence[str]) -> list[str]:
        """``-c`` overrides defining the provider and selecting it, ``-m MODEL``."""
        overrides = {
            f"model_providers.{PROVIDER}.{k}": v for k, v in self._provider(target).items()
        }
        overrides.update(self._settings(target))
        overrides.pop("model")
        args: list[str] = []
        for key, value in overrides.items():
            # a TOML value: JSON's string and integer forms are TOML's too
            args += ["-c", f"{key}={json.dumps(value)}"]
        return [*args, "-m", target.model, *extra]

    def config_files(self, target: Target) -> list[Path]:
        """``config.toml`` in ``CODEX_HOME``."""
        return [target.folder("CODEX_HOME", target.home() / ".codex") / "config.toml"]

    def configure(self, target: Target) -> list[Change]:
        """The provider table, and the model selected at the top level."""
        provider = self._provider(target)
        settings = self._settings(target)

        def edit(document: Any) -> list[str]:
            lines = set_keys(document, [], settings)
            return lines + set_keys(document, ["model_providers", PROVIDER], provider)

        return [update_toml(self.config_files(target)[0], edit)]
