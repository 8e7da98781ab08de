"""The ``localllm`` argument parser and :func:`main`, the console script's entry point.

The commands are listed in :mod:`~localllm.cli.commands`; each lives in a module of
:mod:`localllm.cli` (``models``, ``run``...) with its arguments, and only the module of the
command that runs is imported, so ``localllm --help`` and ``localllm list`` stay fast. Errors
print one line on stderr (``Error: ...``) and exit with status 1, without a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Collection, Sequence
from importlib import import_module
from typing import Any

from .commands import COMMANDS, EXIT_INTERRUPTED, EXIT_OK, EXIT_USER_ERROR

__all__ = ["build_parser", "main"]


def _function(spec: str) -> Any:
    module, _, function = spec.partition(":")
    return getattr(import_module(f"localllm.cli.{module}"), function)


def build_parser(commands: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The ``localllm`` argument parser: with every command (None), or only those named in
    ``commands`` (names or aliases), whose modules are imported for their arguments. With no
    command named (``localllm --help``), every command is listed without its arguments."""
    parser = argparse.ArgumentParser(
        prog="localllm",
        description="Run large language models locally: pull, quantize, serve, chat.",
        epilog="Environment: LOCALLLM_HOME, LOCALLLM_HOST, LOCALLLM_KEEP_ALIVE, ... "
        "(see docs/configuration.md).",
    )
    parser.add_argument("-v", "--version", action="store_true", help="show the version and exit")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    # A parser per command costs about half a millisecond: build only the one that runs.
    named = [c for c in COMMANDS if commands is None or not set(c.names).isdisjoint(commands)]
    for command in named or COMMANDS:
        sub = subparsers.add_parser(
            command.name,
            help=command.help,
            description=command.help,
            aliases=list(command.aliases),
        )
        sub.set_defaults(handler=command.handler)
        if command.arguments is not None and command in named:
            _function(command.arguments)(sub)
    return parser


def _command_in(argv: Sequence[str]) -> str | None:
    """The command named on the command line: its first word that is not an option (the
    options before a command take no value)."""
    return next((word for word in argv if not word.startswith("-")), None)


def _quiet_stdout() -> None:
    """After a broken pipe (``localllm list | head -1``), drop further output quietly."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _allow_ctrl_c() -> None:
    """At a terminal, Ctrl-C stops an answer even when the parent ignored SIGINT.

    Shells start background work with SIGINT ignored and Python then installs no handler;
    a ``localllm run`` launched from such a script onto a terminal would not stop on Ctrl-C.
    """
    if sys.stdin is None or not sys.stdin.isatty():
        return
    import signal  # builds its enums: not on the path of a command run by a script

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``localllm`` console script."""
    words = list(sys.argv[1:] if argv is None else argv)
    named = _command_in(words)
    parser = build_parser(() if named is None else (named,))
    # argparse stops filling ``run``'s PROMPT words at the first option; the words after it
    # come back as extras and are the rest of the prompt (``run MODEL --verbose Why?``).
    args, extra = parser.parse_known_args(words)
    if extra:
        if isinstance(getattr(args, "prompt", None), list) and not any(
            word.startswith("-") for word in extra
        ):
            args.prompt += extra
        elif isinstance(getattr(args, "extra", None), list) and extra[0] == "--":
            # argparse fills ``launch``'s TOOL and ARGS together, before ``--``: the words
            # after it are the tool's own arguments
            args.extra += extra[1:]
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    spec = "daemon:cmd_version" if args.version else getattr(args, "handler", None)
    if spec is None:
        parser.print_help()
        return EXIT_OK
    from .._exceptions import LocalLLMError

    _allow_ctrl_c()
    try:
        return int(_function(spec)(args))
    except LocalLLMError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_OK
