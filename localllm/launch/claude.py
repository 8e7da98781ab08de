"""Claude Code (``claude``), over the daemon's Anthropic Messages API.

What Claude Code reads, from its documentation (code.claude.com/docs/en/env-vars,
/settings and /llm-gateway, read 2026-12): ``ANTHROPIC_BASE_URL`` (it appends
``/v1/messages``), ``ANTHROPIC_AUTH_TOKEN`` (sent as ``Authorization: Bearer``),
``ANTHROPIC_API_KEY`` (sent as ``x-api-key``, and preferred over a subscription: set empty
here so that a user's Anthropic key never goes to the daemon), ``ANTHROPIC_MODEL`` and the
model behind each alias, ``ANTHROPIC_DEFAULT_OPUS_MODEL`` / ``_SONNET_`` / ``_HAIKU_``, and
``CLAUDE_CODE_SUBAGENT_MODEL``; the same variables may be set in the ``env`` object of
``~/.claude/settings.json`` (``CLAUDE_CONFIG_DIR`` moves that folder), which ``--config``
merges them into. ``--model`` on its command line picks the session's model.
``CLAUDE_CODE_AUTO_COMPACT_WINDOW`` tells it the context to compact within (it assumes
200k for a model it does not know); it is not on the env-vars page read, but Ollama's
``launch claude`` (cmd/launch/claude.go) sets it the same way and Claude Code's releases
honour it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .base import Target, Tool
from .configfile import Change, set_keys, update_json

__all__ = ["ClaudeCode"]


class ClaudeCode(Tool):
    """Claude Code."""

    name = "claude"
    title = "Claude Code"
    commands = ("claude",)
    api = "Anthropic Messages (/v1/messages)"

    def environment(self, target: Target) -> dict[str, str]:
        """The variables that point Claude Code at the daemon and the model."""
        return {
            "ANTHROPIC_BASE_URL": target.base_url,
            "ANTHROPIC_AUTH_TOKEN": target.token,
            "ANTHROPIC_API_KEY": "",
            "ANTHROPIC_MODEL": target.model,
            "ANTHROPIC_DEFAULT_OPUS_MODEL": target.model,
            "ANTHROPIC_DEFAULT_SONNET_MODEL": target.model,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": target.model,
            "CLAUDE_CODE_SUBAGENT_MODEL": target.model,
            "CLAUDE_CODE_AUTO_COMPACT_WINDOW": str(target.context),
        }

    def arguments(self, target: Target, extra: Sequence[str]) -> list[str]:
        """``--model MODEL`` and the user's own arguments."""
        return ["--model", target.model, *extra]

    def config_files(self, target: Target) -> list[Path]:
        """``settings.json`` in Claude Code's config folder."""
        folder = target.folder("CLAUDE_CONFIG_DIR", target.home() / ".claude")
        return [folder / "settings.json"]

    def configure(self, target: Target) -> list[Change]:
        """The same variables in the ``env`` object of ``settings.json``."""
        variables = self.environment(target)

        def edit(data: dict[str, object]) -> list[str]:
            return set_keys(data, ["env"], variables)

        return [update_json(self.config_files(target)[0], edit)]
