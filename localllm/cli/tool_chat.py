"""``localllm run`` as an MCP host: the chat's answers through the agent loop of
:mod:`localllm.mcp.loop`, written to the terminal.

Each model step streams as any answer does (:class:`~localllm.cli.session.AnswerPrinter`);
each call the model makes is shown (server · tool, then its arguments) and asked about
before it runs: ``y`` runs it, ``n`` does not, ``a`` runs it and every later call of that
tool in this chat, ``s`` stops the loop (Ctrl-C too); ``--yes`` skips the question. Where no
terminal can be asked (a piped prompt), a call that was not approved is not run, and the
line says to use ``--yes``. Results show as one dim line (cut notes included). ``--verbose``
adds where the time went: each model step's TTFT, prefill and decode, each call's time, the
time spent waiting for the person, then the usual timing block of the last step.

The loop is asynchronous (the MCP SDK is); it runs in one :class:`asyncio.Runner` that lives
as long as the chat, so the servers it started stay up between messages and stop with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

from .._exceptions import LocalLLMError

if TYPE_CHECKING:
    from ..client import AsyncClient
    from ..mcp.host import ToolHost
    from ..mcp.loop import CallRecord, LoopResult
    from ..mcp.model import StepReply
    from .session import AnswerPrinter, ChatSession

__all__ = ["CliTools", "read_answer"]

_QUESTION = "Run it? [y]es, [n]o, [a]lways for this tool, [s]top: "
_ANSWERS = {"y": "yes", "yes": "yes", "n": "no", "no": "no", "a": "always", "always": "always"}
_ANSWERS.update({"s": "stop", "stop": "stop"})
_STATUS = {
    "done": "✓",
    "error": "✗",
    "timeout": "✗",
    "declined": "-",
    "skipped": "-",
    "stopped": "-",
}


def read_answer(prompt: str, out: TextIO) -> str | None:
    """One line from the terminal; None when there is none (stdin is not a terminal).

    Ctrl-C raises KeyboardInterrupt here even while the loop's runner holds SIGINT (it only
    cancels its task, and a read in progress would go on waiting)."""
    if sys.stdin is None or not sys.stdin.isatty():
        return None
    out.write(prompt)
    out.flush()
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        line = sys.stdin.readline()
    finally:
        signal.signal(signal.SIGINT, previous)
    if not line:
        raise EOFError
    return line.strip().lower()


class _Events:
    """The loop's events, written to the terminal."""

    def __init__(self, tools: CliTools, session: ChatSession, interactive: bool) -> None:
        self.tools = tools
        self.session = session
        self.interactive = interactive
        self.printer: AnswerPrinter | None = None
        self.interrupted = False
        """Ctrl-C at a question: the loop was stopped, and the chat says so after it."""

    def _say(self, text: str, *, dim: bool = True) -> None:
        err = self.session.err
        if dim and err.isatty():
            text = f"\x1b[2m{text}\x1b[0m"
        print(text, file=err, flush=True)

    def _close_printer(self) -> None:
        if self.printer is not None:
            self.printer.finish()
            if self.printer.content and not self.printer.content.endswith("\n"):
                self.session.out.write("\n")
                self.session.out.flush()
            self.printer = None

    async def step_started(self, number: int) -> None:
        from .session import AnswerPrinter

        self._close_printer()
        session = self.session
        self.printer = AnswerPrinter(
            session.out,
            session.width(),
            show_thinking=not session.config.hidethinking,
            styled=session.out.isatty(),
        )

    async def write(self, thinking: str, content: str) -> None:
        if self.printer is not None:
            self.printer.feed(thinking, content)

    async def step_finished(self, number: int, reply: StepReply) -> None:
        if reply.calls:
            self._close_printer()

    async def call_shown(self, record: CallRecord) -> None:
        arguments = json.dumps(record.arguments, ensure_ascii=False)
        if len(arguments) > 400:
            arguments = arguments[:400] + f"… ({len(arguments)} characters)"
        self._say(f"⚙ {record.title} {arguments}", dim=False)

    async def approve(self, record: CallRecord) -> str:
        return self._ask(_QUESTION)

    def _ask(self, question: str) -> str:
        read = self.tools.read
        while True:
            try:
                answer = read(question, self.session.err)
            except (KeyboardInterrupt, EOFError):
                self.session.err.write("\n")
                self.interrupted = True
                return "stop"
            if answer is None:
                self._say("  (no terminal to ask: not run; `localllm run --yes` approves calls)")
                return "no"
            if answer in _ANSWERS:
                return _ANSWERS[answer]

    async def call_finished(self, record: CallRecord) -> None:
        outcome = record.outcome
        text = " ".join((outcome.text if outcome else "").split())
        if len(text) > 160:
            text = text[:160] + "…"
        took = f" ({record.seconds * 1000:.0f} ms)" if record.status in ("done", "error") else ""
        mark = _STATUS.get(record.status, "?")
        self._say(f"{mark} {record.title} {record.status}{took}: {text}")
        for note in outcome.notes if outcome else []:
            self._say(f"  note: {note}")

    async def approve_sampling(self, server: str, preview: str) -> str:
        shown = preview if len(preview) <= 400 else "…" + preview[-400:]
        self._say(f"⚙ {server} asks the model: {shown}", dim=False)
        return self._ask("Let it? [y]es, [n]o, [a]lways for this server: ")

    async def notice(self, text: str) -> None:
        self._close_printer()
        self._say(text)


class CliTools:
    """The tools of one ``localllm run`` chat: its servers, the loop's runner, the client."""

    def __init__(
        self,
        host: ToolHost,
        *,
        required: bool = False,
        read: Callable[[str, TextIO], str | None] = read_answer,
    ) -> None:
        self.host = host
        """The chat's servers, tools and approvals."""
        self.required = required
        """``--tools required``: each message's first step must call a tool."""
        self.read = read
        """Reads the answer to a question (None: nobody to ask)."""
        self._runner = asyncio.Runner()
        self._client: AsyncClient | None = None
        self._started = False

    def start(self, err: TextIO) -> None:
        """Start the servers not running yet, saying what failed."""
        manager = self.host.manager
        if self._started and all(
            h.state in ("running", "failed") for h in manager.handles.values()
        ):
            return  # nothing to start: no spinner, no wait
        with _status(err, "starting MCP servers"):
            problems = self._runner.run(self.host.start())
        self._started = True
        for line in problems:
            print(f"warning: {line}", file=err, flush=True)

    def describe(self) -> str:
        """What ``/tools`` prints: each server's state and tools."""
        if not self._started:
            self.start(sys.stderr)
        lines = []
        for handle in self.host.manager.handles.values():
            why = f": {handle.error}" if handle.error else ""
            lines.append(f"{handle.name}: {handle.state}{why}")
            for tool in handle.listing.tools:
                off = " (off)" if tool.key in self.host.disabled else ""
                lines.append(f"  {tool.name}{off}  {tool.description.strip()[:60]}")
        return "\n".join(lines) or "no MCP servers"

    def _client_now(self) -> AsyncClient:
        if self._client is None:
            from ..client import AsyncClient

            self._client = AsyncClient(self.host.settings)
        return self._client

    def answer(
        self, session: ChatSession, prompt: str, images: list[str] | None, *, interactive: bool
    ) -> str | None:
        """The answer to ``prompt`` through the loop (None: no tool is on offer, answer as
        usual). The exchange (calls and results included) joins the conversation, also when
        Ctrl-C stops it, up to what was complete."""
        from ..mcp.loop import LoopRequest

        # every message: the first starts the servers, later ones start again any that
        # exited since (one that failed to start is not tried again in this chat)
        self.start(session.err)
        tools = self.host.tools()
        if not tools:
            if self.required:
                raise LocalLLMError("--tools required, but no MCP server offers a tool")
            return None
        config, settings = session.config, session.settings
        request = LoopRequest(
            model=config.model,
            messages=session.request_messages(prompt, images),
            tools=tools,
            options=dict(config.options),
            keep_alive=config.keep_alive,
            think=config.think,
            format=config.format,
            required=self.required,
            max_steps=settings.mcp_max_steps,
            max_result=settings.mcp_max_result,
            vision=session.vision,
        )
        events = _Events(self, session, interactive)
        loop = self.host.loop(self._client_now(), request, events)
        try:
            result = self._runner.run(loop.run())
        except KeyboardInterrupt:
            events._close_printer()
            self._keep(session, prompt, images, loop.result)
            client, self._client = self._client, None  # a cut stream: the pool is not trusted
            if client is not None:
                with contextlib.suppress(Exception):
                    self._runner.run(client.close())
            raise
        finally:
            events._close_printer()
        self._keep(session, prompt, images, result)
        self._report(session, result, interactive)
        if events.interrupted:
            raise KeyboardInterrupt
        return result.content

    @staticmethod
    def _keep(
        session: ChatSession, prompt: str, images: list[str] | None, result: LoopResult
    ) -> None:
        from .session import user_message

        if result.messages:
            session.messages.append(user_message(prompt, images))
            session.messages.extend(result.messages)  # type: ignore[arg-type]

    def _report(self, session: ChatSession, result: LoopResult, interactive: bool) -> None:
        final = result.final
        if final.get("truncated_messages") or final.get("truncated_tokens"):
            session.say_truncated(final)
        if session.config.verbose and final:
            from ..run_stats import format_timings

            if result.calls:
                print("\n".join(result.timings.lines()), file=session.err, flush=True)
            print(format_timings(final), file=session.err, flush=True)
        if interactive:
            session.out.write("\n")
            session.out.flush()

    def close(self) -> None:
        """Stop the servers and the runner."""
        try:
            if self._client is not None:
                with contextlib.suppress(Exception):
                    self._runner.run(self._client.close())
            with contextlib.suppress(Exception):
                self._runner.run(self.host.close())
        finally:
            self._runner.close()


@contextlib.contextmanager
def _status(err: TextIO, text: str) -> Any:
    """A spinner with ``text`` on stderr while servers start (nothing off a terminal)."""
    if not err.isatty():
        yield
        return
    from rich.console import Console

    with Console(file=err).status(f"{text}..."):
        yield
