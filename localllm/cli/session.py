"""The chat session that ``localllm run`` and its interactive chat share: what is sent with
each message (:class:`ChatConfig`), the conversation and the streamed answer
(:class:`ChatSession`, written out by :class:`AnswerPrinter`), and :func:`ensure_model`,
which pulls a model the store lacks.

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
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from .._exceptions import APIError, LocalLLMError
from ..stream_wrap import StreamWrapper

if TYPE_CHECKING:
    from rich.style import Style

    from ..client import ChatMessage, Client, ShowResponse, Think
    from ..settings import Settings

__all__ = [
    "THINKING_CLOSING",
    "THINKING_OPENING",
    "AnswerPrinter",
    "ChatConfig",
    "ChatSession",
    "ToolAnswers",
    "ensure_model",
    "truncation_line",
    "user_message",
]

THINKING_OPENING = "Thinking..."
"""The line above an answer's reasoning (Ollama's words)."""
THINKING_CLOSING = "...done thinking."
"""The line under it."""


class ToolAnswers(Protocol):
    """Answers through MCP tools (:class:`~localllm.cli.tool_chat.CliTools` is one)."""

    def answer(
        self, session: ChatSession, prompt: str, images: list[str] | None, *, interactive: bool
    ) -> str | None:
        """The answer to ``prompt`` through the tool loop; None: no tool is on offer."""
        ...

    def describe(self) -> str:
        """The servers and their tools, for ``/tools``."""
        ...

    def close(self) -> None:
        """Stop the servers."""
        ...


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
    think: Think | None = None
    """``think`` sent with each message (``--think``, ``/set think``); None sends nothing, so
    the model's template decides."""
    hidethinking: bool = False
    """Do not print the reasoning (``--hidethinking``); it is still asked for and kept."""


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


class AnswerPrinter:
    """Writes one streamed answer to ``out``: its reasoning first, between the lines
    :data:`THINKING_OPENING` and :data:`THINKING_CLOSING` (dim when ``styled``, plain
    otherwise) unless ``show_thinking`` is False, then the answer. Both wrap at ``width``
    (None: no wrapping). Call :meth:`finish` when the stream ends."""

    def __init__(
        self, out: TextIO, width: int | None, *, show_thinking: bool = True, styled: bool = False
    ) -> None:
        from rich.style import Style

        self.out = out
        """Where the answer goes."""
        self.show_thinking = show_thinking
        """Whether the reasoning is printed."""
        self.thinking_parts: list[str] = []
        """The reasoning received so far (printed or not)."""
        self.content_parts: list[str] = []
        """The answer received so far."""
        self._width = width
        # rich's styles give the escape codes: dim as Ollama's grey, bold for the two lines
        self._dim = Style(dim=True) if styled else None
        self._heading = Style(dim=True, bold=True) if styled else None
        self._answer = StreamWrapper(self._write, width)
        self._thoughts: StreamWrapper | None = None
        """The reasoning's wrapper while its block is open on screen (its own columns: the
        answer starts on a fresh line after it)."""

    @property
    def thinking(self) -> str:
        """All the reasoning received."""
        return "".join(self.thinking_parts)

    @property
    def content(self) -> str:
        """All the answer received."""
        return "".join(self.content_parts)

    def _write(self, text: str, style: Style | None = None) -> None:
        if text:
            self.out.write(style.render(text) if style is not None else text)
            self.out.flush()

    def _write_dim(self, text: str) -> None:
        self._write(text, self._dim)

    def feed(self, thinking: str, content: str) -> None:
        """Take the next chunk's reasoning and answer pieces (either may be empty)."""
        if thinking:
            self.thinking_parts.append(thinking)
            if self.show_thinking:
                if self._thoughts is None:
                    self._write(THINKING_OPENING, self._heading)
                    self._write("\n")
                    self._thoughts = StreamWrapper(self._write_dim, self._width)
                self._thoughts.feed(thinking)
        if content:
            self.content_parts.append(content)
            self._close_thinking(answer_follows=True)
            self._answer.feed(content)

    def _close_thinking(self, *, answer_follows: bool) -> None:
        if self._thoughts is None:
            return
        self._thoughts.flush()
        self._thoughts = None
        # on a line of its own, and a blank line before the answer as Ollama prints it
        self._write("" if self.thinking.endswith("\n") else "\n")
        self._write(THINKING_CLOSING, self._heading)
        self._write("\n\n" if answer_follows else "\n")

    def finish(self) -> None:
        """The stream ended: close the reasoning block if it is open, write what is held."""
        self._close_thinking(answer_follows=False)
        self._answer.flush()


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
        self.tools: ToolAnswers | None = None
        """The chat's MCP tools (``run`` with servers configured), None without."""
        self.vision = False
        """The model sees images (a tool's images then go to it as images)."""

    def reconnect(self) -> None:
        """A fresh connection (after Ctrl-C cut a stream, the old pool is not trusted)."""
        from ..client import Client

        self.client.close()
        self.client = Client(self.settings)

    def say_truncated(self, final: dict[str, Any]) -> None:
        """One dim line on stderr: the daemon dropped the oldest turns to fit the context."""
        line = truncation_line(final)
        if self.err.isatty():
            line = f"\x1b[2m{line}\x1b[0m"
        print(line, file=self.err, flush=True)

    def width(self) -> int | None:
        """Columns to wrap answers at (None: no wrapping)."""
        if not self.config.wordwrap or self.config.format or not self.out.isatty():
            return None
        try:
            return os.get_terminal_size(self.out.fileno()).columns  # the terminal, as now
        except (AttributeError, ValueError, OSError):
            return shutil.get_terminal_size().columns

    def attach_images(self, prompt: str) -> tuple[str, list[str]]:
        """Image files named in ``prompt`` (``./photo.png``, a quoted or ``~`` path, a pasted
        one), as Ollama's CLI attaches them: each is read, "Added image 'PATH'" goes to
        stderr, and its path leaves the text. Returns the text and the images' base64."""
        from ..images import encode_image, extract_image_paths

        text, found = extract_image_paths(prompt)
        images = []
        for typed, path in found:
            try:
                data = path.read_bytes()
            except OSError as exc:
                raise LocalLLMError(f"cannot read {typed}: {exc.strerror or exc}") from None
            images.append(encode_image(data))
            print(f"Added image '{typed}'", file=self.err, flush=True)
        return text, images

    def request_messages(self, prompt: str, images: list[str] | None = None) -> list[ChatMessage]:
        """What is sent for ``prompt``: the system prompt, the conversation, the new message
        (with ``images``, base64, when some are attached)."""
        messages: list[ChatMessage] = []
        if self.config.system is not None:
            messages.append({"role": "system", "content": self.config.system})
        messages.extend(self.messages)
        messages.append(user_message(prompt, images))
        return messages

    def load(self) -> None:
        """Load the model now, with a spinner, so the first answer starts quickly."""
        with _spinner(self.err):
            self.client.load(
                self.config.model,
                options=self.config.options or None,
                keep_alive=self.config.keep_alive,
            )

    def answer(self, prompt: str, *, interactive: bool, images: list[str] | None = None) -> str:
        """Stream the answer to ``prompt`` (with ``images``, base64, attached); returns its
        text and adds the exchange, images included as Ollama keeps them, to the
        conversation. Ctrl-C stops it (closing the stream cancels it in the daemon) and
        re-raises KeyboardInterrupt; the interrupted exchange is not kept. With MCP tools
        (:attr:`tools`), the answer goes through the agent loop of
        :mod:`~localllm.cli.tool_chat` instead."""

        def write(text: str) -> None:
            self.out.write(text)
            self.out.flush()

        if self.tools is not None:
            answered = self.tools.answer(self, prompt, images, interactive=interactive)
            if answered is not None:
                return answered
        config = self.config
        printer = AnswerPrinter(
            self.out,
            self.width(),
            show_thinking=not config.hidethinking,
            styled=self.out.isatty(),
        )
        final: dict[str, Any] = {}
        stream = self.client.chat_stream(
            config.model,
            self.request_messages(prompt, images),
            format=config.format,
            options=config.options or None,
            keep_alive=config.keep_alive,
            think=config.think,
        )
        try:
            with _spinner(self.err) as stop_spinner:
                for chunk in stream:
                    message = chunk.get("message") or {}
                    thinking = message.get("thinking") or ""
                    content = message.get("content") or ""
                    # hidden reasoning keeps the spinner going: the wait is not over yet
                    if content or (thinking and printer.show_thinking) or chunk.get("done"):
                        stop_spinner()
                    printer.feed(thinking, content)
                    if chunk.get("done"):
                        final = dict(chunk)
                        break
            printer.finish()
        except KeyboardInterrupt:
            stream.close()
            self.reconnect()
            raise
        except LocalLLMError:
            # What came is kept on screen; the error line the caller prints starts on its own.
            printer.finish()
            if printer.content or printer.thinking:
                write("\n")
            raise
        finally:
            stream.close()
        answer = printer.content
        ending = "\n\n" if interactive else "\n"
        write(ending if answer and not answer.endswith("\n") else ending[:-1])
        if final.get("truncated_messages") or final.get("truncated_tokens"):
            self.say_truncated(final)
        if self.config.verbose and final:
            from ..run_stats import format_timings

            print(format_timings(final), file=self.err, flush=True)
            if interactive:
                print(file=self.err, flush=True)
        self.messages.append(user_message(prompt, images))
        reply: ChatMessage = {"role": "assistant", "content": answer}
        if printer.thinking:
            reply["thinking"] = printer.thinking  # sent back with the history, as Ollama does
        self.messages.append(reply)
        return answer


def truncation_line(final: dict[str, Any]) -> str:
    """The one line that says a long conversation lost its oldest turns to fit the context."""
    messages = int(final.get("truncated_messages") or 0)
    tokens = int(final.get("truncated_tokens") or 0)
    what = f"{messages} older message{'s' if messages != 1 else ''} ({tokens} tokens)"
    if not messages:
        what = f"the first {tokens} tokens after the system prompt"
    return f"(the conversation is longer than the model's context: {what} left out)"


def user_message(prompt: str, images: list[str] | None) -> ChatMessage:
    """The user's message, with its images (base64) when some are attached."""
    message: ChatMessage = {"role": "user", "content": prompt}
    if images:
        message["images"] = list(images)
    return message
