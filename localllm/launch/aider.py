"""Aider (``aider``), over the daemon's OpenAI chat completions.

What Aider reads, from its documentation (aider.chat/docs/llms/openai-compat.html,
/docs/config/adv-model-settings.html, /docs/config/aider_conf.html and
/docs/config/dotenv.html, read 2026-12): ``OPENAI_API_BASE`` and ``OPENAI_API_KEY`` for an
OpenAI-compatible endpoint, with the model named ``openai/<model>`` (``--model``); a model's
context from a ``.aider.model.metadata.json`` file (in the home folder, the repository or the
current folder, or one named by ``--model-metadata-file``) mapping ``openai/<model>`` to
``max_input_tokens``, ``max_output_tokens``, ``litellm_provider`` and ``mode``; and the same
settings as ``model``, ``openai-api-base`` and ``openai-api-key`` in ``~/.aider.conf.yml``.
A launch passes the variables and a metadata file of localllm's own; ``--config`` merges the
settings into ``~/.aider.conf.yml`` and the model's entry into
``~/.aider.model.metadata.json``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .base import OPENAI_CHAT, Target, Tool
from .configfile import Change, set_key, set_keys, update_json, update_yaml

__all__ = ["Aider"]


class Aider(Tool):
    """Aider."""

    name = "aider"
    title = "Aider"
    commands = ("aider",)
    api = OPENAI_CHAT
    needs_tools = False

    def _model(self, target: Target) -> str:
        return f"openai/{target.model}"

    def _metadata(self, target: Target) -> dict[str, Any]:
        return {
            "max_tokens": target.output_tokens,
            "max_input_tokens": target.context,
            "max_output_tokens": target.output_tokens,
            "input_cost_per_token": 0,
            "output_cost_per_token": 0,
            "litellm_provider": "openai",
            "mode": "chat",
        }

    def _metadata_edit(self, target: Target) -> Any:
        def edit(data: dict[str, Any]) -> list[str]:
            return set_key(data, [self._model(target)], self._metadata(target))

        return edit

    def _own_metadata(self, target: Target) -> Path:
        return target.state_dir / "aider.model.metadata.json"

    def prepare(self, target: Target) -> list[Change]:
        """The model's context in a metadata file of localllm's own."""
        return [update_json(self._own_metadata(target), self._metadata_edit(target))]

    def environment(self, target: Target) -> dict[str, str]:
        """The endpoint and key."""
        return {"OPENAI_API_BASE": target.openai_url, "OPENAI_API_KEY": target.token}

    def arguments(self, target: Target, extra: Sequence[str]) -> list[str]:
        """``--model openai/MODEL --model-metadata-file FILE`` and the user's arguments."""
        metadata = str(self._own_metadata(target))
        return ["--model", self._model(target), "--model-metadata-file", metadata, *extra]

    def config_files(self, target: Target) -> list[Path]:
        """``~/.aider.conf.yml`` and ``~/.aider.model.metadata.json``."""
        return [target.home() / ".aider.conf.yml", target.home() / ".aider.model.metadata.json"]

    def configure(self, target: Target) -> list[Change]:
        """The model and endpoint in the YAML config, its context in the metadata file."""
        conf, metadata = self.config_files(target)
        values = {
            "model": self._model(target),
            "openai-api-base": target.openai_url,
            "openai-api-key": target.token,
        }

        def edit(data: Any) -> list[str]:
            return set_keys(data, [], values)

        return [update_yaml(conf, edit), update_json(metadata, self._metadata_edit(target))]
