"""``localllm mcp add|list|rm``: the MCP servers that ``localllm run`` and the TUI use.

``mcp add NAME -- COMMAND ARGS...`` adds a server started as a child process (stdio; ``--env
K=V`` and ``--cwd DIR`` for it), ``mcp add NAME --url URL`` a remote one (Streamable HTTP,
``--header 'K: V'``); ``--timeout SECONDS`` sets its own call timeout. ``mcp list``
starts each server once and shows its state and tools, prompts and resources (``--json``
for scripts, ``--no-start`` to only read the file); ``mcp rm NAME`` removes one. The file is
``mcp.json`` in the user's config dir (``LOCALLLM_MCP_CONFIG``), in the ``mcpServers`` shape
other MCP hosts read too; entries added by hand or by another host are kept as they are.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from .common import UsageError, load_settings, print_json

if TYPE_CHECKING:
    from ..mcp.config import ToolConfig
    from ..settings import Settings

__all__ = ["add_mcp_arguments", "cmd_mcp"]


def add_mcp_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's arguments: an action (add, list, rm) and its own."""
    actions = parser.add_subparsers(dest="mcp_action", metavar="ACTION")
    add = actions.add_parser(
        "add",
        help="add a server: NAME -- COMMAND ARGS... (stdio) or NAME --url URL (HTTP)",
        description="Add an MCP server to the chat's config file.",
    )
    add.add_argument("name", metavar="NAME")
    add.add_argument("--url", help="a remote server's Streamable HTTP endpoint")
    add.add_argument(
        "--header", action="append", default=[], metavar="'K: V'", help="an HTTP header (--url)"
    )
    add.add_argument(
        "--env", action="append", default=[], metavar="K=V", help="a variable for the command"
    )
    add.add_argument("--cwd", metavar="DIR", help="where the command starts")
    add.add_argument("--timeout", type=float, metavar="SECONDS", help="to start and for each call")
    add.add_argument("--replace", action="store_true", help="replace a server of that name")
    add.add_argument(
        "extra", nargs="*", metavar="COMMAND", help="after --: the command and its arguments"
    )
    show = actions.add_parser(
        "list",
        aliases=["ls"],
        help="each server's state and tools",
        description="Start each MCP server once and show its state, tools, prompts and resources.",
    )
    show.add_argument("--json", action="store_true", help="print JSON")
    show.add_argument("--no-start", action="store_true", help="only read the config file")
    remove = actions.add_parser(
        "rm", aliases=["remove"], help="remove a server", description="Remove an MCP server."
    )
    remove.add_argument("name", metavar="NAME")


def _pairs(values: list[str], separator: str, what: str) -> dict[str, str]:
    pairs = {}
    for value in values:
        key, found, rest = value.partition(separator)
        if not found or not key.strip():
            raise UsageError(f"{what} {value!r} must look like KEY{separator}VALUE")
        pairs[key.strip()] = rest.strip() if separator == ":" else rest
    return pairs


def _config(settings: Settings) -> ToolConfig:
    from ..mcp.config import load_config

    return load_config(settings.mcp_config_path)


def _add(args: argparse.Namespace, settings: Settings) -> int:
    command = list(args.extra)
    if args.url and command:
        raise UsageError("give either --url URL or -- COMMAND ARGS..., not both")
    if not args.url and not command:
        raise UsageError(
            "give the server's command after --, e.g. localllm mcp add time -- uvx "
            "mcp-server-time, or --url URL for a remote server"
        )
    entry: dict[str, Any] = {}
    if args.url:
        entry["url"] = args.url
        if args.header:
            entry["headers"] = _pairs(args.header, ":", "--header")
    else:
        entry["command"], entry["args"] = command[0], command[1:]
        if args.env:
            entry["env"] = _pairs(args.env, "=", "--env")
        if args.cwd:
            entry["cwd"] = args.cwd
    if (args.header and not args.url) or ((args.env or args.cwd) and args.url):
        raise UsageError("--header goes with --url; --env and --cwd with a command")
    if args.timeout is not None:
        if args.timeout <= 0:
            raise UsageError("--timeout must be a positive number of seconds")
        entry["timeout"] = args.timeout
    config = _config(settings)
    server = config.add(args.name, entry, replace=args.replace)
    print(f"Added MCP server {server.name!r} ({server.describe()}) to {config.path}")
    return 0


def _remove(args: argparse.Namespace, settings: Settings) -> int:
    config = _config(settings)
    config.remove(args.name)
    print(f"Removed MCP server {args.name!r} from {config.path}")
    return 0


def _listing(settings: Settings, config: ToolConfig, start: bool) -> list[dict[str, Any]]:
    """Each server as ``mcp list`` shows it (started once when ``start``)."""
    rows: list[dict[str, Any]] = []
    for name, problem in config.problems.items():
        rows.append({"name": name, "state": "invalid", "error": problem})
    servers = list(config.servers.values())
    for server in servers:
        state = "disabled" if server.disabled else "not started"
        rows.append({"name": server.name, "transport": server.describe(), "state": state})
    wanted = [s for s in servers if not s.disabled]
    if not start or not wanted:
        return rows
    import asyncio

    from ..mcp.servers import ServerManager

    async def run() -> dict[str, Any]:
        manager = ServerManager(wanted, timeout=settings.mcp_timeout, log_dir=settings.log_dir)
        try:
            await manager.ensure_started()
            return dict(manager.handles)
        finally:
            await manager.close()

    handles = asyncio.run(run())
    for row in rows:
        handle = handles.get(row["name"])
        if handle is None:
            continue
        listing = handle.listing
        row["state"] = "ok" if not handle.error else handle.state
        if handle.error:
            row["error"] = handle.error
        else:
            row["tools"] = [{"name": t.name, "description": t.description} for t in listing.tools]
            row["prompts"] = [p.name for p in listing.prompts]
            row["resources"] = [str(r.uri) for r in listing.resources]
            row["start_seconds"] = round(handle.start_seconds, 3)
        if listing.skipped:
            row["warnings"] = list(listing.skipped)
    return rows


def _list(args: argparse.Namespace, settings: Settings) -> int:
    config = _config(settings)
    rows = _listing(settings, config, start=not args.no_start)
    if args.json:
        print_json({"config": str(config.path), "servers": rows})
        return 0
    if not rows:
        print(f"No MCP servers in {config.path}: add one with `localllm mcp add NAME -- COMMAND`")
        return 0
    print(f"MCP servers in {config.path}:")
    for row in rows:
        print(f"\n{row['name']}  {row.get('transport', '')}".rstrip())
        print(f"  state: {row['state']}{': ' + row['error'] if row.get('error') else ''}")
        for tool in row.get("tools", []):
            first = (tool["description"] or "").strip().splitlines()
            print(f"  tool {tool['name']}{'  ' + first[0] if first else ''}")
        if row.get("prompts"):
            print(f"  prompts: {', '.join(row['prompts'])}")
        if row.get("resources"):
            print(f"  resources: {', '.join(row['resources'])}")
        for warning in row.get("warnings", []):
            print(f"  warning: {warning}", file=sys.stderr)
    return 0


def cmd_mcp(args: argparse.Namespace) -> int:
    """``mcp add|list|rm``."""
    settings = load_settings()
    action = args.mcp_action
    if action == "add":
        return _add(args, settings)
    if action in ("rm", "remove"):
        return _remove(args, settings)
    if action in ("list", "ls", None):
        if action is None:
            args.json, args.no_start = False, False
        return _list(args, settings)
    raise UsageError(f"unknown action {action!r}: add, list or rm")
