"""``localllm launch``: coding agents and editors pointed at a local model in one command.

Each supported tool has a module saying what it reads (from its own documentation) and how
to start it; :mod:`.configfile` edits config files without losing what the user had;
:mod:`.context` picks the context the model is loaded with; :mod:`.pick` asks which tool
and model when the command line does not say.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping

from .aider import Aider
from .base import PROVIDER, Target, Tool
from .claude import ClaudeCode
from .codex import Codex
from .continuedev import Continue
from .droid import Droid
from .opencode import OpenCode
from .zed import Zed

__all__ = ["PROVIDER", "TOOLS", "Target", "Tool", "executable"]

TOOLS: dict[str, Tool] = {
    tool.name: tool
    for tool in (ClaudeCode(), Codex(), OpenCode(), Continue(), Aider(), Zed(), Droid())
}
"""Every tool ``launch`` knows, by its command-line name."""


def executable(tool: Tool, environ: Mapping[str, str]) -> str | None:
    """The path of the tool's executable on ``PATH``, if it is installed."""
    for command in tool.commands:
        found = shutil.which(command, path=environ.get("PATH"))
        if found:
            return found
    return None
