"""``localllm``: the command line, with Ollama's command names and habits.

:func:`main` (the console script) parses the arguments (:mod:`~localllm.cli.parser`) and
runs one command from the module that holds it with its arguments, imported only then so
``localllm --help`` and ``localllm list`` stay fast. :mod:`~localllm.cli.commands` lists every
command (the one place to add one) and the exit statuses:

- :mod:`~localllm.cli.daemon`: ``serve``, ``version``;
- :mod:`~localllm.cli.models`: ``list``, ``show``, ``rm``, ``cp``, ``create``, ``pull``,
  ``quantize``, ``stop``;
- :mod:`~localllm.cli.ps`: ``ps``, and ``ps --all`` (every worker behind the gateway);
- :mod:`~localllm.cli.run`: ``run``, with the interactive chat of :mod:`~localllm.cli.repl`;
  both go through the chat session of :mod:`~localllm.cli.session`;
- :mod:`~localllm.cli.gateway`: ``gateway`` (many daemons behind one endpoint);
- :mod:`~localllm.cli.worker`: ``worker`` (this machine's devices for another's models);
- :mod:`~localllm.cli.mcp`: ``mcp add|list|rm`` (the MCP servers whose tools chats use);
- :mod:`~localllm.cli.tui`: ``tui``;
- :mod:`~localllm.cli.doctor`: ``doctor``.

What the commands share (settings, the daemon connection, output helpers) is in
:mod:`~localllm.cli.common`. Commands reach the daemon through :mod:`localllm.client`,
starting it in the background when none answers. Errors print one line on stderr
(``Error: ...``) and exit with status 1, without a traceback.
"""

from .parser import build_parser, main

__all__ = ["build_parser", "main"]
