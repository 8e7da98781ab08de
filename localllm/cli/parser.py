"""The ``localllm`` argument parser and :func:`main`, the console script's entry point.

This module only parses arguments: each command lives in a module of :mod:`localllm.cli`
imported when the command runs (``models``, ``run``...), so ``localllm --help`` stays fast.
Errors print one line on stderr (``Error: ...``) and exit with status 1, without a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from importlib import import_module
from typing import Any

__all__ = ["EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USER_ERROR", "build_parser", "main"]

EXIT_OK = 0
"""Exit status of a command that did what was asked."""
EXIT_USER_ERROR = 1
"""Exit status after an ``Error: ...`` line (a :class:`~localllm.LocalLLMError`)."""
EXIT_INTERRUPTED = 130
"""Exit status after Ctrl-C (128 + SIGINT, as shells report it)."""

_QUANT_HELP = "q4_0, q4_K_S, q4_K_M (q4_K), q5_K_M, q6_K, q8_0, f16, f32"


# -- parser ----------------------------------------------------------------------------------


def _add_requantize(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allow-requantize",
        action="store_true",
        help="quantize an already quantized model (loses quality)",
    )


THINK_VALUES = ("true", "false", "low", "medium", "high")
"""What ``run --think=VALUE`` takes (Ollama's values)."""


class _ThinkAction(argparse.Action):
    """``--think`` alone is ``true``; ``--think=VALUE`` is one of :data:`THINK_VALUES`.

    The value only comes after ``=``, as with Ollama (whose flag has an optional value): a
    value separated by a space would swallow the prompt's first word
    (``run MODEL --think Why is the sky blue?``). So ``--think`` takes no argument, and each
    ``--think=VALUE`` is an option string of its own, which argparse matches whole before it
    splits at ``=``.
    """

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        """Store the value named by the option string."""
        setattr(namespace, self.dest, (option_string or "").partition("=")[2] or "true")


def _add_think(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--think",
        action=_ThinkAction,
        help="think before answering; --think=low|medium|high sets how much, --think=false "
        "turns it off (default: the model's own)",
    )
    # the same flag with its values, kept out of the help (the line above names them)
    parser.add_argument(
        *(f"--think={value}" for value in THINK_VALUES),
        dest="think",
        action=_ThinkAction,
        help=argparse.SUPPRESS,
    )
    parser.add_argument(
        "--hidethinking",
        action="store_true",
        help="do not print the reasoning (a model that reasons still thinks)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``localllm`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="localllm",
        description="Run large language models locally: pull, quantize, serve, chat.",
        epilog="Environment: LOCALLLM_HOME, LOCALLLM_HOST, LOCALLLM_KEEP_ALIVE, ... "
        "(see the README).",
    )
    parser.add_argument("-v", "--version", action="store_true", help="show the version and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    def add(
        name: str, handler: str, help_text: str, aliases: Sequence[str] = ()
    ) -> argparse.ArgumentParser:
        sub = commands.add_parser(
            name, help=help_text, description=help_text, aliases=list(aliases)
        )
        sub.set_defaults(handler=handler)
        return sub

    add("serve", "daemon:cmd_serve", "Start the daemon in the foreground")

    sub = add("run", "run:cmd_run", "Run a model: answer a prompt, or chat")
    sub.add_argument("model", metavar="MODEL")
    sub.add_argument("prompt", nargs="*", metavar="PROMPT", help="answer this and exit")
    sub.add_argument("--format", choices=["json"], help="answer in JSON")
    sub.add_argument(
        "--keepalive", metavar="DURATION", help="keep the model loaded this long (5m, 1h, -1)"
    )
    sub.add_argument("--nowordwrap", action="store_true", help="do not wrap answers")
    sub.add_argument("--verbose", action="store_true", help="print timings after each answer")
    sub.add_argument("--insecure", action="store_true", help="plain HTTP for a pull")
    _add_think(sub)

    sub = add("pull", "models:cmd_pull", "Pull a model (hf.co/<user>/<repo> or a registry)")
    sub.add_argument("model", metavar="MODEL", help="smollm2:135m, hf.co/<user>/<repo>[:<quant>]")
    sub.add_argument(
        "--quant",
        metavar="QUANT",
        help="which quantization of an hf.co repository (default: the best that fits here)",
    )
    sub.add_argument("--quantize", "-q", metavar="QUANT", help="quantize after pulling")
    sub.add_argument("--insecure", action="store_true", help="allow plain HTTP to the registry")

    sub = add("search", "search:cmd_search", "Search Hugging Face for GGUF models")
    sub.add_argument("query", nargs="*", metavar="WORDS", help="words the repository name has")
    sub.add_argument(
        "--sort",
        default="downloads",
        metavar="ORDER",
        help="downloads (default), likes, updated, trending or created",
    )
    sub.add_argument("--limit", type=int, default=20, help="results per page (default 20)")
    sub.add_argument("--page", type=int, default=1, help="which page (from 1)")
    sub.add_argument("--json", action="store_true", help="machine-readable output")

    sub = add("list", "models:cmd_list", "List models", aliases=["ls"])
    sub.add_argument("--json", action="store_true", help="machine-readable output")

    sub = add("ps", "models:cmd_ps", "List running models")
    sub.add_argument("--json", action="store_true", help="machine-readable output")
    sub.add_argument("--watch", "-w", action="store_true", help="refresh until Ctrl-C")
    sub.add_argument(
        "--all", action="store_true", help="every worker behind the gateway (localllm gateway)"
    )
    sub.add_argument(
        "--gateway", metavar="URL", help="with --all: this gateway (default: the one started here)"
    )

    sub = add("show", "models:cmd_show", "Show information for a model")
    sub.add_argument("model", metavar="MODEL")
    group = sub.add_mutually_exclusive_group()
    group.add_argument("--json", action="store_true", help="machine-readable output")
    group.add_argument("--modelfile", action="store_true", help="show the Modelfile")
    group.add_argument("--parameters", action="store_true", help="show the parameters")
    group.add_argument("--template", action="store_true", help="show the template")
    group.add_argument("--system", action="store_true", help="show the system message")
    group.add_argument("--license", action="store_true", help="show the license")
    sub.add_argument("--verbose", action="store_true", help="with --json: long metadata too")
    sub.add_argument(
        "--hub",
        action="store_true",
        help="hf.co names: the repository's quantizations on the Hub, even once pulled",
    )

    sub = add("rm", "models:cmd_rm", "Remove one or more models")
    sub.add_argument("models", nargs="+", metavar="MODEL")

    sub = add("cp", "models:cmd_cp", "Copy a model")
    sub.add_argument("source", metavar="SOURCE")
    sub.add_argument("destination", metavar="DESTINATION")

    sub = add("create", "models:cmd_create", "Create a model from a Modelfile or a GGUF file")
    sub.add_argument("model", metavar="MODEL", help="name of the new model")
    source = sub.add_mutually_exclusive_group()
    source.add_argument(
        "--file", "-f", metavar="MODELFILE", help="a Modelfile (default: ./Modelfile)"
    )
    source.add_argument(
        "--from", dest="source", metavar="FILE|MODEL", help="a .gguf file or a model name"
    )
    sub.add_argument("--quantize", "-q", metavar="QUANT", help=f"quantize to {_QUANT_HELP}")
    _add_requantize(sub)

    sub = add("stop", "models:cmd_stop", "Stop (unload) a running model")
    sub.add_argument("model", metavar="MODEL")

    sub = add("quantize", "models:cmd_quantize", "Quantize a model or GGUF into a new model")
    sub.add_argument("source", metavar="SOURCE", help="a model name or a .gguf file")
    sub.add_argument("target", metavar="TARGET", help="name of the new model")
    sub.add_argument(
        "--quantize", "-q", metavar="QUANT", required=True, help=f"target: {_QUANT_HELP}"
    )
    _add_requantize(sub)

    sub = add("import", "importer:cmd_import", "Import models from Ollama without downloading")
    sub.add_argument("source", choices=["ollama"], help="where from: ollama")
    sub.add_argument("models", nargs="*", metavar="MODEL", help="only these (default: all)")
    sub.add_argument(
        "--models",
        dest="models_dir",
        metavar="DIR",
        help="Ollama's models folder (default: OLLAMA_MODELS, ~/.ollama/models, "
        "/usr/share/ollama/.ollama/models)",
    )

    sub = add(
        "worker",
        "worker:cmd_worker",
        "Serve this machine's devices to other machines' models (llama.cpp RPC)",
    )
    sub.add_argument("--host", default="127.0.0.1", help="IPv4 address to listen on (loopback)")
    sub.add_argument("--port", type=int, default=50052, help="TCP port (default 50052)")
    sub.add_argument("--threads", type=int, default=0, help="CPU threads (0: physical cores)")
    sub.add_argument(
        "--device",
        action="append",
        default=[],
        metavar="DEVICE",
        help="devices to serve, comma separated (CPU, CUDA0, ...); default: the GPUs, else the CPU",
    )
    sub.add_argument(
        "--no-cache",
        action="store_true",
        help="do not keep received tensors on disk (rpc-cache/ under the data root)",
    )

    from .gateway import add_arguments as add_gateway_arguments

    add_gateway_arguments(
        add("gateway", "gateway:cmd_gateway", "Route to many daemons by prompt prefix (smg)")
    )

    from .launch import add_arguments as add_launch_arguments

    add_launch_arguments(
        add(
            "launch",
            "launch:cmd_launch",
            "Set up a coding agent or editor for a local model and start it",
        )
    )

    from .bench import add_arguments as add_bench_arguments

    add_bench_arguments(add("bench", "bench:cmd_bench", "Measure throughput and latency"))
    add("version", "daemon:cmd_version", "Show the version")
    sub = add(
        "doctor",
        "doctor:cmd_doctor",
        "Show what a bug report needs: versions, llama.cpp's view of this machine, the CPU "
        "probe's decision, the data root and the daemon's endpoints",
    )
    sub.add_argument("--json", action="store_true", help="machine-readable output")
    add("tui", "tui:cmd_tui", "Open the terminal UI")
    return parser


def _handler(spec: str) -> Any:
    module, _, function = spec.partition(":")
    return getattr(import_module(f"localllm.cli.{module}"), function)


def _quiet_stdout() -> None:
    """After a broken pipe (``localllm list | head -1``), drop further output quietly."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _allow_ctrl_c() -> None:
    """At a terminal, Ctrl-C stops an answer even when the parent ignored SIGINT.

    Shells start background work with SIGINT ignored and Python then installs no handler;
    a ``localllm run`` launched from such a script onto a terminal would not stop on Ctrl-C.
    """
    import signal

    at_terminal = sys.stdin is not None and sys.stdin.isatty()
    if at_terminal and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``localllm`` console script."""
    parser = build_parser()
    # argparse stops filling ``run``'s PROMPT words at the first option; the words after it
    # come back as extras and are the rest of the prompt (``run MODEL --verbose Why?``).
    args, extra = parser.parse_known_args(argv)
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
    if args.version:
        from .daemon import cmd_version

        return cmd_version(args)
    spec = getattr(args, "handler", None)
    if spec is None:
        parser.print_help()
        return EXIT_OK
    from .._exceptions import LocalLLMError

    _allow_ctrl_c()
    try:
        return int(_handler(spec)(args))
    except LocalLLMError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_OK
