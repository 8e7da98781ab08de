"""The interactive chat of ``localllm run MODEL``: Ollama's ``>>>`` prompt and slash commands.

``/set parameter NAME VALUE``, ``/set system ...``, ``/set verbose|quiet``, ``/set
wordwrap|nowordwrap``, ``/set format json|noformat``, ``/set history|nohistory``, ``/set
think [low|medium|high]|nothink``; ``/show info|license|modelfile|parameters|system|template``;
``/load MODEL``, ``/save MODEL``, ``/clear``, ``/bye``; ``/? set|show|shortcuts``;
``/tools`` lists the chat's MCP servers and their tools;
``/image PATH`` attaches an image to the next message, as does an image path typed or pasted
(drag-and-drop) into a message;
``\"\"\"`` starts a multi-line message. Ctrl-C stops the answer being
written and keeps the session; Ctrl-D on an empty prompt (or ``/bye``) ends it. Line editing and
the up-arrow history come from ``readline`` when the platform has it; typed messages are kept in
a history file across sessions unless ``/set nohistory``.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._exceptions import DaemonUnavailableError, LocalLLMError
from .session import ChatSession, ensure_model

if TYPE_CHECKING:
    from ..client import Think

__all__ = ["HELP", "SET_HELP", "THINK_LEVELS", "Repl"]

HELP = """Available Commands:
  /set            Set session variables
  /show           Show model information
  /load <model>   Load a session or model
  /save <model>   Save your current session
  /clear          Clear session context
  /image <path>   Attach an image to the next message
  /tools          List the MCP servers and their tools
  /bye            Exit
  /?, /help       Help for a command
  /? shortcuts    Help for keyboard shortcuts

Use \"\"\" to begin a multi-line message.
"""

SET_HELP = """Available Commands:
  /set parameter ...     Set a parameter
  /set system <string>   Set system message
  /set history           Enable history
  /set nohistory         Disable history
  /set wordwrap          Enable wordwrap
  /set nowordwrap        Disable wordwrap
  /set format json       Enable JSON mode
  /set noformat          Disable formatting
  /set verbose           Show LLM stats
  /set quiet             Disable LLM stats
  /set think             Enable thinking
  /set think <level>     Think low, medium or high
  /set nothink           Disable thinking
"""

THINK_LEVELS: dict[str, Think] = {"low": "low", "medium": "medium", "high": "high"}
"""The levels ``/set think LEVEL`` takes (Ollama's)."""

PARAMETER_HELP = """Available Parameters:
  /set parameter seed <int>             Random number seed
  /set parameter num_predict <int>      Max number of tokens to predict
  /set parameter top_k <int>            Pick from top k num of tokens
  /set parameter top_p <float>          Pick token based on sum of probabilities
  /set parameter min_p <float>          Pick token based on top token probability * min_p
  /set parameter num_ctx <int>          Set the context size
  /set parameter temperature <float>    Set creativity level
  /set parameter repeat_penalty <float> How strongly to penalize repetitions
  /set parameter repeat_last_n <int>    Set how far back to look for repetitions
  /set parameter mirostat <int>         Mirostat sampling (1 or 2; 0 turns it off)
  /set parameter mirostat_tau <float>   Mirostat's target surprise (lower: more focused)
  /set parameter stop <string> <string> ...   Set the stop parameters
"""

SHOW_HELP = """Available Commands:
  /show info         Show details for this model
  /show license      Show model license
  /show modelfile    Show Modelfile for this model
  /show parameters   Show parameters for this model
  /show system       Show system message
  /show template     Show prompt template
"""

SHORTCUTS = """Available keyboard shortcuts:
  Ctrl + a            Move to the beginning of the line (Home)
  Ctrl + e            Move to the end of the line (End)
  Ctrl + k            Delete the sentence after the cursor
  Ctrl + u            Delete the sentence before the cursor
  Ctrl + w            Delete the word before the cursor
  Up / Down           Previous / next message typed in this session

  Ctrl + c            Stop the answer being written
  Ctrl + d            Exit (on an empty line)
"""

_TRIPLE = '"' * 3
_TOGGLES = {
    "verbose": ("verbose", True, "Set 'verbose' mode."),
    "quiet": ("verbose", False, "Set 'quiet' mode."),
    "wordwrap": ("wordwrap", True, "Set 'wordwrap' mode."),
    "nowordwrap": ("wordwrap", False, "Set 'nowordwrap' mode."),
    "history": ("history", True, "Set history."),
    "nohistory": ("history", False, "Set 'nohistory' mode."),
}


class _Exit(Exception):
    """``/bye``."""


_COMMANDS = frozenset(
    (
        "/set",
        "/show",
        "/load",
        "/save",
        "/clear",
        "/image",
        "/tools",
        "/bye",
        "/exit",
        "/?",
        "/help",
    )
)


class Repl:
    """The read-eval-print loop around a :class:`~localllm.cli.session.ChatSession`."""

    def __init__(
        self,
        session: ChatSession,
        read: Callable[[str], str] = input,
        *,
        history_file: Path | None = None,
    ) -> None:
        self.session = session
        self._read = read
        self._history_file = history_file
        self._readline: Any = None
        self._daemon_lost = False
        self.pending_images: list[str] = []
        """Images (base64) attached with /image or a lone pasted path, sent with the next
        message."""

    def _start_history(self) -> None:
        try:
            import readline  # line editing and history for input()
        except ImportError:
            return
        self._readline = readline
        readline.set_history_length(1000)
        if self._history_file is not None:
            with contextlib.suppress(OSError):
                readline.read_history_file(self._history_file)

    def _save_history(self) -> None:
        if self._readline is None or self._history_file is None:
            return
        with contextlib.suppress(OSError):
            self._history_file.parent.mkdir(parents=True, exist_ok=True)
            self._readline.write_history_file(self._history_file)

    def _set_history(self, enabled: bool) -> None:
        if self._readline is not None:
            self._readline.set_auto_history(enabled)

    # -- the loop -------------------------------------------------------------------------

    def run(self) -> int:
        """Chat until ``/bye`` or Ctrl-D; returns the exit status."""
        self._start_history()
        try:
            return self._loop()
        finally:
            self._save_history()

    def _loop(self) -> int:
        self.session.load()
        while True:
            try:
                line = self._read_message()
            except KeyboardInterrupt:
                print("\nUse Ctrl + d or /bye to exit.")
                continue
            except EOFError:
                print()
                return 0
            if line is None:
                continue
            try:
                if line.startswith("/") and not self._starts_with_image(line):
                    self.command(line)
                elif line.strip():
                    self._message(line)
            except _Exit:
                return 0
            except KeyboardInterrupt:
                print()  # the answer was stopped; the session goes on
            except LocalLLMError as exc:
                # the daemon went away (stopped, crashed): start one again before the next message
                self._daemon_lost = isinstance(exc, DaemonUnavailableError)
                print(f"Error: {exc}\n")

    @staticmethod
    def _starts_with_image(line: str) -> bool:
        """A dragged-in absolute path (``/home/me/cat.png``) is a message, not a command."""
        from ..images import extract_image_paths

        if line.split(" ", 1)[0] in _COMMANDS:
            return False
        return bool(extract_image_paths(line)[1])

    def _message(self, line: str) -> None:
        """Send a typed message with its images; a line of image paths alone holds them for
        the next message (a drag-and-drop, then the question)."""
        text, images = self.session.attach_images(line)
        if not text.strip():
            self.pending_images.extend(images)
            return
        images, self.pending_images = [*self.pending_images, *images], []
        if self._daemon_lost:
            self._restart_daemon()
        self.session.answer(text, interactive=True, images=images or None)

    def _attach(self, rest: str) -> None:
        """``/image PATH``: read the file now, send it with the next message."""
        from ..images import encode_image

        try:
            words = shlex.split(rest)
        except ValueError:
            words = [rest]
        if len(words) != 1:
            print("Usage: /image <path>")
            return
        path = Path(words[0]).expanduser()
        try:
            data = path.read_bytes()
        except OSError as exc:
            print(f"Error: cannot read {words[0]}: {exc.strerror or exc}")
            return
        self.pending_images.append(encode_image(data))
        print(f"Added image '{words[0]}'", file=self.session.err, flush=True)

    def _restart_daemon(self) -> None:
        from ..autostart import ensure_daemon
        from .common import notice

        ensure_daemon(self.session.settings, on_start=lambda text: notice(f"{text}..."))
        self.session.reconnect()
        self._daemon_lost = False

    def _read_message(self) -> str | None:
        """One message; a line starting with three double quotes reads until the closing ones."""
        line = self._read(">>> ")
        if not line.lstrip().startswith(_TRIPLE):
            return line
        text = line.lstrip()[3:]
        if text.endswith(_TRIPLE):
            return text[:-3]
        lines = [text]
        while True:
            more = self._read("... ")
            if more.rstrip().endswith(_TRIPLE):
                lines.append(more.rstrip()[:-3])
                return "\n".join(lines).strip("\n")
            lines.append(more)

    # -- slash commands -------------------------------------------------------------------

    def command(self, line: str) -> None:
        """Run one ``/command``."""
        name, _, rest = line.strip().partition(" ")
        rest = rest.strip()
        if name in ("/bye", "/exit"):
            raise _Exit
        if name in ("/?", "/help"):
            # Ollama's: a command's own help by its name (/? set), else the list of commands
            topics = {"set": SET_HELP, "show": SHOW_HELP}
            topics.update(shortcut=SHORTCUTS, shortcuts=SHORTCUTS)
            print(topics.get(rest.removeprefix("/"), HELP))
        elif name == "/set":
            self._set(rest)
        elif name == "/show":
            self._show(rest)
        elif name == "/image":
            self._attach(rest)
        elif name == "/tools":
            tools = self.session.tools
            print(tools.describe() if tools is not None else "No MCP tools in this chat.")
        elif name == "/clear":
            self.session.messages.clear()
            self.pending_images.clear()
            print("Cleared session context")
        elif name == "/load":
            self._load(rest)
        elif name == "/save":
            self._save(rest)
        else:
            print(f"Unknown command '{name}'. Type /? for help")

    def _set(self, rest: str) -> None:
        config = self.session.config
        what, _, value = rest.partition(" ")
        value = value.strip()
        if what in _TOGGLES:
            attribute, flag, message = _TOGGLES[what]
            setattr(config, attribute, flag)
            if attribute == "history":
                self._set_history(flag)
            print(message)
        elif what == "parameter":
            self._set_parameter(value)
        elif what == "system":
            if not value:
                print("Usage: /set system <message>")
                return
            config.system = value.strip('"')
            print("Set system message.")
        elif what == "format":
            if value != "json":
                print("Invalid or missing format. For 'json' mode use '/set format json'")
                return
            config.format = "json"
            print("Set format to 'json' mode.")
        elif what == "noformat":
            config.format = None
            print("Disabled format.")
        elif what == "think":
            self._set_think(value)
        elif what == "nothink":
            config.think = False
            print("Set 'nothink' mode.")
        else:
            print(SET_HELP)

    def _set_think(self, level: str) -> None:
        config = self.session.config
        if level and level not in THINK_LEVELS:
            print(f"Invalid think level '{level}': use low, medium or high.")
            return
        config.think = THINK_LEVELS[level] if level else True
        print(f"Set 'think' mode to '{level}'." if level else "Set 'think' mode.")
        self._warn_without_thinking()

    def _warn_without_thinking(self) -> None:
        """Say so when the model cannot think (as Ollama does): its answers would be refused."""
        session = self.session
        try:
            capabilities = session.client.show(session.config.model).get("capabilities")
        except LocalLLMError:
            return  # the next message reports what is wrong
        if capabilities is not None and "thinking" not in capabilities:
            print(
                f'warning: model "{session.config.model}" does not support thinking output',
                file=sys.stderr,
            )

    def _set_parameter(self, text: str) -> None:
        from ..store.modelfile import ModelfileError, coerce_parameter

        try:
            parts = shlex.split(text)
        except ValueError:
            parts = text.split()
        if len(parts) < 2:
            print(PARAMETER_HELP)
            return
        name, values = parts[0].lower(), parts[1:]
        try:
            if name == "stop":
                value: object = values
            else:
                value = coerce_parameter(name, " ".join(values))
        except ModelfileError as exc:
            print(f"Couldn't set parameter: {exc}")
            return
        self.session.config.options[name] = value
        shown = ", ".join(values) if name == "stop" else values[0]
        print(f"Set parameter '{name}' to '{shown}'")

    def _show(self, what: str) -> None:
        session = self.session
        if what not in ("info", "license", "modelfile", "parameters", "system", "template"):
            print(SHOW_HELP)
            return
        data = session.client.show(session.config.model)
        if what == "info":
            from .models import render_show

            print(render_show(data))
        elif what == "parameters":
            print("Model defined parameters:")
            print(str(data.get("parameters") or "No parameters were specified for this model."))
            if session.config.options:
                print("\nUser defined parameters:")
                for key, value in session.config.options.items():
                    print(f"{key:<30} {json.dumps(value)}")
            print()
        elif what == "system":
            text = session.config.system or data.get("system")
            print(f"{text}\n" if text else "No system message was specified for this model.\n")
        else:
            text = str(data.get(what) or "")
            missing = f"No {what} was specified for this model."
            print(f"{text.rstrip()}\n" if text else f"{missing}\n")

    def _load(self, name: str) -> None:
        session = self.session
        if not name:
            print("Usage:\n  /load <modelname>")
            return
        ensure_model(session.client, name)
        print(f"Loading model '{name}'")
        session.config.model = name
        session.messages.clear()
        session.load()

    def _save(self, name: str) -> None:
        session = self.session
        if not name:
            print("Usage:\n  /save <modelname>")
            return
        config = session.config
        lines = session.client.create(
            name,
            from_=config.model,
            system=config.system,
            parameters=config.options or None,
            messages=list(session.messages) or None,
        )
        for _ in lines:
            pass
        print(f"Created new model '{name}'")
