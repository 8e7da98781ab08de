"""``localllm run MODEL [PROMPT]``: one answer streamed to the terminal, or an interactive chat.

With a PROMPT, or text piped on stdin (both together: stdin first, as Ollama joins them), it
prints the streamed answer and exits. Without one, on a terminal, it opens the chat of
:mod:`localllm.cli.repl`. A model missing from the store is pulled first, with progress.
Answers wrap at the terminal's width (``--nowordwrap`` turns that off; output that is not a
terminal is never wrapped) and ``--verbose`` prints the timing block of
:mod:`localllm.run_stats` on stderr after each answer. ``--think[=low|medium|high|false]``
sends ``think`` with every message (without it the model's template decides), and the
reasoning prints before the answer unless ``--hidethinking``. Image files named in the prompt
(``./photo.png``, quoted, ``~/...``) are attached as Ollama's CLI attaches them. Both ways go
through the :class:`~localllm.cli.session.ChatSession` of :mod:`localllm.cli.session`.

With MCP servers in the config (``localllm mcp add``), the model may call their tools: each
call is shown and asked about (``--yes`` approves them all), through the agent loop of
:mod:`localllm.cli.tool_chat`; ``--mcp NAMES`` chooses the servers, ``--tools required``
makes each message's first step call a tool, ``--tools none`` turns them off. A model whose
template declares no tools is said at once.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from .common import UsageError, connect, load_settings
from .session import ChatConfig, ChatSession, ensure_model

if TYPE_CHECKING:
    from ..client import Think
    from ..settings import Settings

__all__ = ["THINK_VALUES", "TOOL_MODES", "add_run_arguments", "cmd_run", "think_value"]

THINK_VALUES = ("true", "false", "low", "medium", "high")
"""What ``run --think=VALUE`` takes (Ollama's values)."""
TOOL_MODES = ("auto", "required", "none")
"""What ``run --tools MODE`` takes."""


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


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``run`` command's arguments."""
    parser.add_argument("model", metavar="MODEL")
    parser.add_argument("prompt", nargs="*", metavar="PROMPT", help="answer this and exit")
    parser.add_argument("--format", choices=["json"], help="answer in JSON")
    parser.add_argument(
        "--keepalive", metavar="DURATION", help="keep the model loaded this long (5m, 1h, -1)"
    )
    parser.add_argument("--nowordwrap", action="store_true", help="do not wrap answers")
    parser.add_argument("--verbose", action="store_true", help="print timings after each answer")
    parser.add_argument("--insecure", action="store_true", help="plain HTTP for a pull")
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
        "--system-prompt",
        metavar="NAME",
        help="use the saved system prompt NAME (the terminal UI's prompt library, Ctrl+S; "
        "`localllm chats prompts` lists them)",
    )
    parser.add_argument(
        "--hidethinking",
        action="store_true",
        help="do not print the reasoning (a model that reasons still thinks)",
    )
    parser.add_argument(
        "--mcp",
        action="append",
        metavar="SERVERS",
        help="use these MCP servers (comma separated; default: every server of the MCP config "
        "that is not disabled; see `localllm mcp`)",
    )
    parser.add_argument(
        "--tools",
        choices=TOOL_MODES,
        default="auto",
        help="auto: the model may call the servers' tools; required: its first step in each "
        "message must call one; none: no tools",
    )
    parser.add_argument(
        "--yes",
        "-y",
        action="store_true",
        help="run every tool call (and sampling request) without asking",
    )


def think_value(flag: str | None) -> Think | None:
    """What ``--think[=VALUE]`` sends: None without the flag (the model decides)."""
    if flag is None:
        return None
    values: dict[str, Think] = {
        "true": True,
        "false": False,
        "low": "low",
        "medium": "medium",
        "high": "high",
    }
    return values[flag]  # the parser took only these


def _stdin_text() -> str | None:
    """Text piped on stdin, ``None`` when stdin is a terminal."""
    if sys.stdin is None or sys.stdin.isatty():
        return None
    return sys.stdin.read()


def _run(session: ChatSession, args: argparse.Namespace) -> int:
    config = session.config
    info = ensure_model(session.client, config.model, insecure=args.insecure)
    if "completion" not in (info.get("capabilities") or ["completion"]):
        raise UsageError(f'"{config.model}" does not support generate (an embedding model?)')
    if args.hidethinking and args.think is None and "thinking" in (info.get("capabilities") or []):
        # --hidethinking alone: a model that reasons is asked to (the reasoning is hidden,
        # not skipped), and one that does not is asked nothing, so it is not refused
        config.think = True
    session.vision = "vision" in (info.get("capabilities") or [])
    session.tools = _tools(session, args, info.get("capabilities") or [])
    piped = _stdin_text()
    if piped is None and not args.prompt:
        from .repl import Repl

        return Repl(session, history_file=session.settings.data_dir / "history").run()
    # Only the typed prompt names images: piped text is data, whatever paths it mentions.
    typed, images = session.attach_images(" ".join(args.prompt))
    prompt = " ".join([*([piped] if piped else []), *([typed] if typed else [])])
    if not prompt.strip() and not images:
        # Ollama: just load (as the session's requests would find it)
        session.client.load(
            config.model, options=config.options or None, keep_alive=config.keep_alive
        )
        return 0
    session.answer(prompt, interactive=False, images=images)
    return 0


def _tools(session: ChatSession, args: argparse.Namespace, capabilities: list[str]) -> Any:
    """The chat's MCP tools (a :class:`~localllm.cli.tool_chat.CliTools`), or None: no
    server chosen or configured, ``--tools none``, or a model that cannot call tools (said at
    once; an error when tools were asked for by name)."""
    if args.tools == "none":
        if args.mcp:
            raise UsageError("--mcp names servers, but --tools none turns tools off")
        return None
    from ..mcp.config import load_config

    settings = session.settings
    config = load_config(settings.mcp_config_path)
    names = [n.strip() for value in args.mcp or [] for n in value.split(",") if n.strip()]
    if names:
        chosen = [config.server(name).name for name in names]
    else:
        chosen = [s.name for s in config.servers.values() if not s.disabled]
    asked = bool(names) or args.tools == "required"
    if not chosen:
        if asked:
            raise UsageError(
                f"no MCP servers in {config.path}: add one with `localllm mcp add NAME -- COMMAND`"
            )
        return None
    model = session.config.model
    if "tools" not in capabilities:
        why = (
            f'"{model}" cannot call tools (its template declares none; `localllm show {model}` '
            "lists what it can do)"
        )
        if asked:
            raise UsageError(why)
        print(f"note: {why}: the MCP servers of {config.path} are not used", file=session.err)
        return None
    from ..mcp.host import ToolHost
    from .tool_chat import CliTools

    host = ToolHost.from_settings(settings, chosen, auto_approve=args.yes, config=config)
    return CliTools(host, required=args.tools == "required")


def _saved_prompt(settings: Settings, name: str | None) -> str | None:
    """The text of the saved system prompt ``name`` (None without the flag)."""
    if name is None:
        return None
    from ..chats import open_store

    with open_store(settings) as store:
        return store.get_prompt(name).text


def cmd_run(args: argparse.Namespace) -> int:
    """``run MODEL [PROMPT...]``."""
    settings = load_settings()
    config = ChatConfig(
        model=args.model,
        format=args.format,
        keep_alive=args.keepalive,
        verbose=args.verbose,
        wordwrap=not args.nowordwrap,
        think=think_value(args.think),
        hidethinking=args.hidethinking,
        system=_saved_prompt(settings, args.system_prompt),
    )
    session = ChatSession(settings, connect(settings), config)
    try:
        return _run(session, args)
    finally:
        try:
            if session.tools is not None:
                session.tools.close()  # the chat's MCP servers stop with it
        finally:
            session.client.close()
