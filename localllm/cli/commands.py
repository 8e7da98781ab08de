"""Every ``localllm`` command, in one table, and the exit statuses the commands return.

A command is one :class:`Command` line in :data:`COMMANDS`: its name, its help, and where its
code is, as ``"module:function"`` inside :mod:`localllm.cli`. Nothing here imports a command's
module: the parser imports the one that runs (its arguments and its handler), so a command
costs nothing to the others' start. To add a command, write its module (a handler
``cmd_NAME(args) -> int`` and, when it takes arguments, ``add_NAME_arguments(parser)``) and add
its line below.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = [
    "COMMANDS",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USER_ERROR",
    "Command",
]

EXIT_OK = 0
"""Exit status of a command that did what was asked."""
EXIT_USER_ERROR = 1
"""Exit status after an ``Error: ...`` line (a :class:`~localllm.LocalLLMError`)."""
EXIT_INTERRUPTED = 130
"""Exit status after Ctrl-C (128 + SIGINT, as shells report it)."""


class Command(NamedTuple):
    """One command: ``handler`` runs it, ``arguments`` (when it takes any) adds them to its
    parser; both are ``"module:function"`` in :mod:`localllm.cli`, imported when needed."""

    name: str
    help: str
    handler: str
    arguments: str | None = None
    aliases: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        """The name and its aliases."""
        return (self.name, *self.aliases)


COMMANDS: tuple[Command, ...] = (
    Command("serve", "Start the daemon in the foreground", "daemon:cmd_serve"),
    Command(
        "run",
        "Run a model: answer a prompt, or chat",
        "run:cmd_run",
        "run:add_run_arguments",
    ),
    Command(
        "pull",
        "Pull a model (hf.co/<user>/<repo> or a registry)",
        "models:cmd_pull",
        "models:add_pull_arguments",
    ),
    Command(
        "search",
        "Search Hugging Face for GGUF models",
        "search:cmd_search",
        "search:add_search_arguments",
    ),
    Command("list", "List models", "models:cmd_list", "models:add_list_arguments", aliases=("ls",)),
    Command("ps", "List running models", "ps:cmd_ps", "ps:add_ps_arguments"),
    Command("show", "Show information for a model", "models:cmd_show", "models:add_show_arguments"),
    Command("rm", "Remove one or more models", "models:cmd_rm", "models:add_rm_arguments"),
    Command("cp", "Copy a model", "models:cmd_cp", "models:add_cp_arguments"),
    Command("prune", "Remove blobs and partial downloads no model uses", "models:cmd_prune"),
    Command(
        "create",
        "Create a model from a Modelfile or a GGUF file",
        "models:cmd_create",
        "models:add_create_arguments",
    ),
    Command(
        "stop", "Stop (unload) a running model", "models:cmd_stop", "models:add_stop_arguments"
    ),
    Command(
        "quantize",
        "Quantize a model or GGUF into a new model",
        "models:cmd_quantize",
        "models:add_quantize_arguments",
    ),
    Command(
        "import",
        "Import models from Ollama without downloading",
        "importer:cmd_import",
        "importer:add_import_arguments",
    ),
    Command(
        "worker",
        "Serve this machine's devices to other machines' models (llama.cpp RPC)",
        "worker:cmd_worker",
        "worker:add_worker_arguments",
    ),
    Command(
        "gateway",
        "Route to many daemons by prompt prefix (smg)",
        "gateway:cmd_gateway",
        "gateway:add_gateway_arguments",
    ),
    Command(
        "launch",
        "Set up a coding agent or editor for a local model and start it",
        "launch:cmd_launch",
        "launch:add_launch_arguments",
    ),
    Command(
        "mcp",
        "Add, list or remove the MCP servers whose tools chats use",
        "mcp:cmd_mcp",
        "mcp:add_mcp_arguments",
    ),
    Command(
        "bench",
        "Measure throughput and latency",
        "bench:cmd_bench",
        "bench:add_bench_arguments",
    ),
    Command("version", "Show the version", "daemon:cmd_version"),
    Command(
        "doctor",
        "Show what a bug report needs: versions, llama.cpp's view of this machine, the CPU "
        "probe's decision, its speed figures, the data root, the model store (every blob "
        "re-hashed) and the daemon's endpoints",
        "doctor:cmd_doctor",
        "doctor:add_doctor_arguments",
    ),
    Command("tui", "Open the terminal UI", "tui:cmd_tui"),
    Command(
        "chats",
        "List, search and export the terminal UI's chats; list its saved system prompts",
        "chats:cmd_chats",
        "chats:add_chats_arguments",
    ),
)
"""The commands, in the order ``localllm --help`` lists them."""
