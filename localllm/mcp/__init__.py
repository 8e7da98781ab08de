"""MCP (Model Context Protocol) tools in the chat: ``localllm run`` and the TUI as MCP hosts.

- :mod:`.config`: the servers file (``mcp.json``, the ``mcpServers`` shape), read and written
  without the SDK (``localllm mcp add|list|rm``);
- :mod:`.servers`: a chat's servers through the official SDK's client, started on first need,
  stopped with the chat, every wait bounded;
- :mod:`.tools`: tools as the model sees them (unique names, schemas checked, arguments
  checked); :mod:`.results`: results as the model gets them (cut past a limit, with a note);
- :mod:`.model`: one model step through the daemon; :mod:`.loop`: the agent loop with its
  approvals and sampling; :mod:`.timings`: where the time went;
- :mod:`.host`: one chat's servers, tools, approvals and loops.

Only :mod:`.config` is light; the rest imports the MCP SDK (about a second), so the CLI
imports it only for a chat that uses tools.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__all__ = [
    "AgentLoop",
    "Approvals",
    "CallRecord",
    "Decision",
    "LoopEvents",
    "LoopRequest",
    "LoopResult",
    "ServerConfig",
    "ToolConfig",
    "ToolHost",
    "ToolOutcome",
    "ToolSpec",
    "load_config",
]

_WHERE = {
    "AgentLoop": ".loop",
    "Approvals": ".loop",
    "CallRecord": ".loop",
    "Decision": ".loop",
    "LoopEvents": ".loop",
    "LoopRequest": ".loop",
    "LoopResult": ".loop",
    "ServerConfig": ".config",
    "ToolConfig": ".config",
    "ToolHost": ".host",
    "ToolOutcome": ".results",
    "ToolSpec": ".tools",
    "load_config": ".config",
}


def __getattr__(name: str) -> Any:
    # Imported on first use: the loop and the host bring the MCP SDK, which a command that
    # only reads the config file must not pay for.
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(_WHERE[name], __name__), name)
    globals()[name] = value
    return value
