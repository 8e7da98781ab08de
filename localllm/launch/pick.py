"""Asking which tool and which model, when the command line does not say.

The tools offered are the supported ones installed (found on ``PATH``); the models, the
local ones that generate text, each with what it can do (``tools`` first: coding agents work
by calling tools). The list is numbered on standard error and the answer read from standard
input; without a terminal there is no one to ask, and the error lists the choices instead.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

from .._exceptions import LaunchError
from . import TOOLS, Tool, executable

if TYPE_CHECKING:
    from ..client import Client

__all__ = ["ModelChoice", "ask", "installed_tools", "local_models", "pick_model", "pick_tool"]


@dataclass(frozen=True)
class ModelChoice:
    """A local model and what it can do (``/api/show``'s ``capabilities``)."""

    name: str
    capabilities: tuple[str, ...]

    @property
    def calls_tools(self) -> bool:
        """Whether its template has tool calls."""
        return "tools" in self.capabilities


def installed_tools(environ: Mapping[str, str]) -> list[tuple[Tool, str]]:
    """The supported tools found on ``PATH``, with their executables."""
    found = []
    for tool in TOOLS.values():
        path = executable(tool, environ)
        if path is not None:
            found.append((tool, path))
    return found


def local_models(client: Client) -> list[ModelChoice]:
    """Local models that generate text, those that call tools first."""
    out = []
    for summary in client.list_models():
        name = summary.get("name") or summary.get("model") or ""
        capabilities = tuple(client.show(name).get("capabilities", ()))
        if "completion" in capabilities or "tools" in capabilities:
            out.append(ModelChoice(name, capabilities))
    return sorted(out, key=lambda m: (not m.calls_tools, m.name))


def ask(
    title: str,
    labels: Sequence[str],
    *,
    read: Callable[[str], str] = input,
    out: TextIO | None = None,
    interactive: bool | None = None,
) -> int:
    """The index of the label picked (numbered from 1 on screen)."""
    out = out or sys.stderr
    if interactive is None:
        interactive = sys.stdin is not None and sys.stdin.isatty()
    if not interactive:
        raise LaunchError(f"{title}: no terminal to ask on; name one of: {', '.join(labels)}")
    print(title, file=out)
    for number, label in enumerate(labels, 1):
        print(f"  {number}. {label}", file=out)
    while True:
        answer = read(f"[1-{len(labels)}]: ").strip()
        if answer.isdigit() and 1 <= int(answer) <= len(labels):
            return int(answer) - 1
        print(f"type a number from 1 to {len(labels)}", file=out)


def pick_tool(environ: Mapping[str, str], **kwargs: object) -> Tool:
    """The tool to launch, picked among the installed ones."""
    found = installed_tools(environ)
    if not found:
        names = ", ".join(f"{t.title} ({t.commands[0]})" for t in TOOLS.values())
        raise LaunchError(f"none of the supported tools is on PATH: install one of {names}")
    labels = [f"{tool.name:<9} {tool.title} — {tool.api}" for tool, _ in found]
    return found[ask("Which tool?", labels, **kwargs)][0]  # type: ignore[arg-type]


def pick_model(models: Sequence[ModelChoice], **kwargs: object) -> ModelChoice:
    """The model to use, picked among the local ones."""
    if not models:
        raise LaunchError(
            "no local model generates text; pull one first (localllm pull NAME), one whose "
            "template calls tools, such as qwen3"
        )
    labels = [
        f"{m.name:<32} {', '.join(m.capabilities)}"
        + ("" if m.calls_tools else "  (no tool calls: agents cannot act with it)")
        for m in models
    ]
    return models[ask("Which model?", labels, **kwargs)]  # type: ignore[arg-type]
