"""``localllm launch [TOOL] [--model M] [--config] [-- ARGS...]``: a coding agent or editor
pointed at a local model, set up and started in one command.

With no TOOL, a picker of the supported tools found on ``PATH``; with no ``--model``, a
picker of the local models and what each can do. The model is loaded with the context the
tool needs (:mod:`localllm.launch.context`: 64k tokens where the memory plan allows,
otherwise the largest that fits, and the launcher says so). Then the tool starts with the
environment and arguments that point it at the daemon, after writing only the files it reads
its models from (each merged, a backup kept, every change printed); ``--config`` instead
writes the tool's own config so that it uses the model when started plainly, and starts
nothing. Everything the launcher says goes to standard error.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import Any

from .common import UsageError, connect, load_settings

__all__ = ["add_launch_arguments", "cmd_launch"]


def add_launch_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's arguments."""
    parser.add_argument(
        "tool",
        nargs="?",
        metavar="TOOL",
        help="claude, codex, opencode, continue, aider, zed or droid (default: pick one of "
        "those installed)",
    )
    parser.add_argument(
        "--model", "-m", metavar="MODEL", help="the local model (default: pick one)"
    )
    parser.add_argument(
        "--config",
        action="store_true",
        help="only write the tool's own config to use the model, do not start it",
    )
    parser.add_argument(
        "extra", nargs="*", metavar="ARGS", help="after --: arguments for the tool itself"
    )


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def cmd_launch(args: argparse.Namespace) -> int:
    """Set up the tool for the model and start it (or only configure it)."""
    from .._exceptions import APIError, LaunchError
    from ..launch import TOOLS, Target, executable
    from ..launch.context import choose_context
    from ..launch.pick import local_models, pick_model, pick_tool

    environ = dict(os.environ)
    if args.tool is None:
        tool = pick_tool(environ)
    elif args.tool in TOOLS:
        tool = TOOLS[args.tool]
    else:
        raise UsageError(f"unknown tool {args.tool!r}: one of {', '.join(TOOLS)}")
    found = executable(tool, environ)
    if found is None and not args.config:
        raise LaunchError(
            f"{tool.title} is not installed ({' or '.join(tool.commands)} is not on PATH); "
            f"install it, or write its config only with: localllm launch {tool.name} --config"
        )
    settings = load_settings()
    client = connect(settings)
    if args.model is None:
        choice = pick_model(local_models(client))
        model, capabilities = choice.name, choice.capabilities
    else:
        model = args.model
        try:
            capabilities = tuple(client.show(model).get("capabilities", ()))
        except APIError as exc:
            if exc.status_code == 404:
                raise LaunchError(
                    f"model {model!r} not found, try `localllm pull {model}`"
                ) from None
            raise
    if "tools" not in capabilities and tool.needs_tools:
        _say(
            f"Warning: {model}'s template has no tool calls; {tool.title} may not be able to "
            "act with it (pick a model whose capabilities list tools)"
        )
    chosen = choose_context(client, model, say=_say)
    for note in chosen.notes:
        _say(f"Note: {note}")
    _say(f"Loading {chosen.model} with a context of {chosen.context} tokens...")
    client.load(chosen.model)
    target = Target(
        model=chosen.model,
        context=chosen.context,
        base_url=settings.base_url,
        api_key=settings.api_key,
        tools="tools" in capabilities,
        environ=environ,
        state_dir=settings.data_dir / "launch",
    )
    if args.config:
        for change in tool.configure(target):
            _say(change.describe())
        start = tool.after_configure(target)
        _say(f"{tool.title} is set up for {chosen.model}; start it with: {start}")
        return 0
    for change in tool.prepare(target):
        _say(change.describe())
    assert found is not None
    command = [found, *tool.arguments(target, args.extra)]
    variables: dict[str, Any] = tool.environment(target)
    _say(f"Starting {tool.title} on {chosen.model} ({target.base_url})")
    try:
        return subprocess.run(command, env={**environ, **variables}, check=False).returncode
    except KeyboardInterrupt:  # the tool got the Ctrl-C too and decides for itself
        return 130
