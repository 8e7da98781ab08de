"""The chat session that ``localllm run`` and its interactive chat share: what is sent with
each message (:class:`ChatConfig`), the conversation and the streamed answer
(:class:`ChatSession`), and :func:`ensure_model`, which pulls a model the store lacks.

``run MODEL PROMPT`` answers once through a session; the REPL of :mod:`localllm.cli.repl`
drives one message after another through the same session.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

from .._exceptions import APIError

if TYPE_CHECKING:
    from ..client import ChatMessage, Client, ShowResponse
    from ..settings import Settings

__all__ = ["ChatConfig", "ChatSession", "ensure_model"]


@dataclass
class ChatConfig:
    """What a chat sends with each message; ``/set`` changes it during a session."""

    model: str
    """The model answering."""
    options: dict[str, Any] = field(default_factory=dict)
    """Ollama options set for this session (``/set parameter``)."""
    system: str | None = None
    """A system prompt replacing the model's own (``/set system``)."""
    format: str | None = None
    """``json`` for JSON mode."""
    keep_alive: str | None = None
    """How long the daemon keeps the model loaded after each answer."""
    verbose: bool = False
    """Print the timing block after each answer."""
    wordwrap: bool = True
    """Wrap answers at the terminal width (only when stdout is a terminal)."""
    history: bool = True
    """Remember typed messages for the up arrow, across sessions (Ollama's ``/set history``)."""


def ensure_model(client: Client, name: str, *, insecure: bool = False) -> ShowResponse:
    """The model's ``show`` answer, pulling it first when the store does not have it."""
    from .models import pull_model

    try:
        return client.show(name)
    except APIError as exc:
        if exc.status_code != 404:
            raise
    pull_model(client, name, insecure=insecure)
    return client.show(name)


@contextlib.contextmanager
def _spinner(err: TextIO) -> Iterator[Any]:
    """A spinner on stderr while waiting (nothing when stderr is not a terminal); the
    yielded callable stops it early."""
    if not err.isatty():
        yield lambda: None
        return
    from rich.console import Console

    status = Console(file=err).status("", spinner="dots")
    stopped = False

    def stop() -> None:
        nonlocal stopped
        if not stopped:
            stopped = True
            status.stop()

    try:
        status.start()  # inside the try: a Ctrl-C while it starts still stops its thread
        yield stop
    finally:
        stop()


class ChatSession:
    """A conversation with one model through the daemon: its history, and answers streamed
    to ``out`` (timings to ``err``)."""

    def __init__(
        self,
        settings: Settings,
        client: Client,
        config: ChatConfig,
        *,
        out: TextIO | None = None,
        err: TextIO | None = None,
    ) -> None:
        self.settings = settings
        self.client = client
        self.config = config
        self.messages: list[ChatMessage] = []
        self.out = out or sys.stdout
        self.err = err or sys.stderr

    def reconnect(self) -> None:
        """A fresh connection (after Ctrl-C cut a stream, the old pool is not trusted)."""
        from ..client import Client

        self.client.close()
        self.client = Client(self.settings)

    def _width(self) -> int | None:
        if not self.config.wordwrap or self.config.format or not self.out.isatty():
            return None
        try:
            return os.get_terminal_size(self.out.fileno()).columns  # the terminal, as now
        except (AttributeError, ValueError, OSError):
            return shutil.get_terminal_size().columns

    def request_messages(self, prompt: str) -> list[ChatMessage]:
        """What is sent for ``prompt``: the system prompt, the conversation, the new message."""
        messages: list[ChatMessage] = []
        if self.config.system is not None:
            messages.append({"role": "system", "content": self.config.system})
        messages.extend(self.messages)
        messages.append({"role": "user", "content": prompt})
        return messages

    def load(self) -> None:
        """Load the model now, with a spinner, so the first answer starts quickly."""
        with _spinner(self.err):
            self.client.load(self.config.model, keep_alive=self.config.keep_alive)

    def answer(self, prompt: str, *, interactive: bool) -> str:
        """Stream the answer to ``prompt``; returns its text and adds the exchange to the
        conversation. Ctrl-C stops it (closing the stream cancels it in the daemon) and
        re-raises KeyboardInterrupt; the interrupted exchange is not kept."""
        from ..stream_wrap import StreamWrapper

        def write(text: str) -> None:
            self.out.write(text)
            self.out.flush()

        wrapper = StreamWrapper(write, self._width())
        pieces: list[str] = []
        final: dict[str, Any] = {}
        stream = self.client.chat_stream(
            self.config.model,
            self.request_messages(prompt),
            format=self.config.format,
            options=self.config.options or None,
            keep_alive=self.config.keep_alive,
        )
        try:
            with _spinner(self.err) as stop_spinner:
                for chunk in stream:
                    stop_spinner()
                    if chunk.get("done"):
                        final = dict(chunk)
                        break
                    text = (chunk.get("message") or {}).get("content") or ""
                    pieces.append(text)
                    wrapper.feed(text)
            wrapper.flush()
        except KeyboardInterrupt:
            stream.close()
            self.reconnect()
            raise
        finally:
            stream.close()
        answer = "".join(pieces)
        ending = "\n\n" if interactive else "\n"
        write(ending if answer and not answer.endswith("\n") else ending[:-1])
        if self.config.verbose and final:
            from ..run_stats import format_timings

            print(format_timings(final), file=self.err, flush=True)
            if interactive:
                print(file=self.err, flush=True)
        self.messages.append({"role": "user", "content": prompt})
        self.messages.append({"role": "assistant", "content": answer})
        return answer
