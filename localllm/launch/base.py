"""What every coding tool that ``localllm launch`` knows has in common.

A :class:`Tool` says which executables it is (``commands``), which API of the daemon it
speaks, and three things for a :class:`Target` (the model, its context, the daemon's
address): the environment and arguments to start it with, the files a launch must write
because the tool reads its model settings from nowhere else (:meth:`Tool.prepare`), and the
config that ``launch --config`` writes so that the tool uses the model when started plainly
(:meth:`Tool.configure`). Files are edited through :mod:`.configfile`, which keeps what the
user had.

Config locations follow the tools' own rules, read from the environment the launcher was
started with (``Target.environ``: ``HOME``, ``XDG_CONFIG_HOME``, ``CODEX_HOME``...): these are
the tools' variables, not localllm settings, and they are read only here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from .configfile import Change

__all__ = ["OPENAI_CHAT", "PROVIDER", "Target", "Tool"]

PROVIDER = "localllm"
"""The provider name every tool's config gets for the daemon."""

OPENAI_CHAT = "OpenAI chat completions (/v1/chat/completions)"
""":attr:`Tool.api` of the tools that speak OpenAI's chat completions."""


@dataclass(frozen=True)
class Target:
    """The model a tool is pointed at, and where the daemon answers."""

    model: str
    """The model name the tool sends (a tag whose ``num_ctx`` is :attr:`context`)."""
    context: int
    """Context length, in tokens, the model is loaded with."""
    base_url: str
    """The daemon's HTTP address, ``http://127.0.0.1:11435`` (no trailing slash)."""
    api_key: str | None = None
    """``LOCALLLM_API_KEY`` when the daemon needs one."""
    tools: bool = True
    """Whether the model can call tools (its template has tool calls)."""
    environ: Mapping[str, str] = field(default_factory=dict)
    """The environment the tool is started from (config locations are read from it)."""
    state_dir: Path = Path()
    """A folder of localllm's own for files it generates for a tool."""

    @property
    def token(self) -> str:
        """What goes where a tool insists on an API key: the daemon's key, else a
        placeholder (the daemon on loopback without a key reads none)."""
        return self.api_key or PROVIDER

    @property
    def label(self) -> str:
        """The model's name in a tool's model list: ``MODEL (localllm)``."""
        return f"{self.model} ({PROVIDER})"

    @property
    def openai_url(self) -> str:
        """The base URL of the OpenAI-compatible routes."""
        return f"{self.base_url}/v1"

    @property
    def output_tokens(self) -> int:
        """The most a tool should ask for in one answer: a quarter of the context."""
        return max(self.context // 4, 1024)

    def home(self) -> Path:
        """The user's home folder (``HOME``)."""
        value = self.environ.get("HOME")
        return Path(value) if value else Path.home()

    def config_home(self) -> Path:
        """``XDG_CONFIG_HOME`` when set to an absolute path, else ``~/.config``."""
        value = self.environ.get("XDG_CONFIG_HOME", "")
        return Path(value) if value and Path(value).is_absolute() else self.home() / ".config"

    def folder(self, variable: str, default: Path) -> Path:
        """The folder a tool's own variable names (``CODEX_HOME``...), else ``default``."""
        value = self.environ.get(variable)
        return Path(value) if value else default


class Tool(ABC):
    """A coding agent or editor ``localllm launch`` can set up and start."""

    name: ClassVar[str]
    """The name on the command line (``claude``)."""
    title: ClassVar[str]
    """The tool's own name (``Claude Code``)."""
    commands: ClassVar[tuple[str, ...]]
    """Executables that start it, the usual first."""
    api: ClassVar[str]
    """Which of the daemon's APIs it speaks."""
    needs_tools: ClassVar[bool] = True
    """Whether it works by calling tools (agents do; Aider edits through plain text)."""
    settings_only: ClassVar[bool] = False
    """Whether it reads its models from its own config only, so that a launch must write it
    too (:meth:`prepare` then does what :meth:`configure` does)."""

    def config_files(self, target: Target) -> list[Path]:
        """The files :meth:`configure` writes."""
        return []

    @abstractmethod
    def configure(self, target: Target) -> list[Change]:
        """Write the tool's own config so that it uses ``target`` when started plainly."""

    def prepare(self, target: Target) -> list[Change]:
        """Files a launch must write before starting the tool: none for tools that take
        everything from their environment and arguments, the config for :attr:`settings_only`
        ones."""
        return self.configure(target) if self.settings_only else []

    def environment(self, target: Target) -> dict[str, str]:
        """Variables to start the tool with, on top of the launcher's environment."""
        return {}

    def arguments(self, target: Target, extra: Sequence[str]) -> list[str]:
        """The tool's command-line arguments (``extra``: what the user gave after ``--``)."""
        return list(extra)

    def after_configure(self, target: Target) -> str:
        """What to run after ``--config``."""
        return self.commands[0]
