"""The chat screen as an MCP host: its servers (from the MCP config, started when a chat first
needs them, stopped when the screen closes), which of them and of their tools each chat has
on (:class:`ToolsDialog`, Ctrl+G), an answer through the agent loop drawn into the transcript
(:class:`TranscriptEvents`: each step's text, each call a :class:`ToolCallBlock`, the
approval a prompt in the chat), the servers' prompts as slash commands and their resources
attached like files, and what the loop said saved as messages that reload as they were.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Label, SelectionList, Static
from textual.widgets.selection_list import Selection

from localllm._exceptions import LocalLLMError

from ..chats import Attachment, Chat, StoredMessage
from ..widgets.message import MessageView
from ..widgets.toolcall import ApprovalPrompt, ToolCallBlock
from .dialogs import _Dialog

if TYPE_CHECKING:
    from textual.app import App
    from textual.containers import VerticalScroll
    from textual.widget import Widget

    from localllm.mcp.host import ToolHost
    from localllm.mcp.loop import AgentLoop, Approvals, CallRecord, LoopResult
    from localllm.mcp.model import StepReply
    from localllm.mcp.tools import ToolSpec

    from ..host import Host


class ChatSurface(Protocol):
    """What the MCP side needs of the chat screen (:class:`~.chat.ChatScreen` is one)."""

    @property
    def llm(self) -> Host:
        """The app, as the screens see it."""
        ...

    @property
    def app(self) -> App[Any]:
        """The running app."""
        ...

    def transcript(self, chat: Chat | None = None) -> VerticalScroll:
        """A chat's transcript."""
        ...

    def query_one(self, selector: str) -> Widget:
        """A widget of the screen."""
        ...

    def notify(self, message: str, **kwargs: Any) -> None:
        """A notification."""
        ...

    def show_attachments(self) -> None:
        """Show what goes with the next message."""
        ...


__all__ = [
    "ChatSurface",
    "ChatTools",
    "ToolsDialog",
    "TranscriptEvents",
    "loop_messages",
    "tool_view",
]


def tool_view(message: StoredMessage) -> ToolCallBlock:
    """A saved tool result as the block it was."""
    tool = message.tool or {}
    title = f"{tool.get('server', '?')} · {tool.get('tool', tool.get('name', '?'))}"
    result = (
        message.content,
        str(tool.get("status", "done")),
        float(tool.get("seconds", 0.0)),
        list(tool.get("notes", [])),
    )
    return ToolCallBlock(
        title, tool.get("arguments"), call_id=str(tool.get("call_id", "")), result=result
    )


def loop_messages(result: LoopResult) -> list[StoredMessage]:
    """What a loop added to the conversation, as messages to save: each step's answer (with
    its calls and timings), each call's result with what its block shows."""
    steps = [step for step in result.timings.steps if step.kind == "model"]
    calls = {record.id: record for record in result.calls}
    saved: list[StoredMessage] = []
    for message in result.messages:
        if message["role"] == "assistant":
            final = steps.pop(0).final if steps else None
            stats = dict(final) if final else None
            tool = {"calls": message["tool_calls"]} if message.get("tool_calls") else None
            saved.append(
                StoredMessage(
                    "assistant",
                    message.get("content", ""),
                    stats,
                    thinking=message.get("thinking", ""),
                    tool=tool,
                )
            )
            continue
        record = calls.get(message.get("tool_call_id", ""))
        outcome = record.outcome if record is not None else None
        images = [
            Attachment(f"image {i + 1}", data) for i, data in enumerate(message.get("images", []))
        ]
        saved.append(
            StoredMessage(
                "tool",
                message.get("content", ""),
                images=images,
                tool={
                    "call_id": message.get("tool_call_id", ""),
                    "name": message.get("tool_name", ""),
                    "server": record.tool.server if record and record.tool else "",
                    "tool": record.tool.name
                    if record and record.tool
                    else message.get("tool_name", ""),
                    "arguments": record.arguments if record else None,
                    "status": record.status if record else "done",
                    "seconds": round(record.seconds, 4) if record else 0.0,
                    "notes": list(outcome.notes) if outcome else [],
                },
            )
        )
    # the last answer carries the loop's summary: time in the model vs in tools
    for message in reversed(saved):
        if message.role == "assistant" and message.stats is not None:
            if result.calls:
                message.stats["loop"] = result.timings.summary().removeprefix("loop: ")
            break
    return saved


def _prompt_arguments(text: str, names: list[str]) -> dict[str, str] | None:
    """``key=value`` pairs of a prompt's arguments (a value runs to the next ``key=``), or
    the whole text for a prompt of one argument; None when the text cannot be read so."""
    if not text:
        return {}
    if names:
        keys = "|".join(re.escape(name) for name in names)
        found = list(re.finditer(rf"(?:^|\s)({keys})=", text))
        if found and found[0].start() == 0:
            ends = [m.start() for m in found[1:]] + [len(text)]
            return {
                m.group(1): text[m.end() : end].strip() for m, end in zip(found, ends, strict=True)
            }
    return {names[0]: text} if len(names) == 1 else None


class TranscriptEvents:
    """The loop's events, drawn into one chat's transcript."""

    def __init__(self, screen: ChatSurface, chat: Chat, view: MessageView) -> None:
        self.screen = screen
        self.chat = chat
        self.view: MessageView | None = view
        """The answer being streamed (one per model step)."""
        self.first = True
        self.blocks: dict[str, ToolCallBlock] = {}
        self._streams: tuple[Any, Any] | None = None
        self.parts: list[str] = []
        """The current step's text so far (kept when the loop is stopped)."""
        self.thinking: list[str] = []
        """The current step's reasoning so far."""
        self.step_open = False
        """A step is streaming (its answer is not whole yet)."""

    @property
    def transcript(self) -> VerticalScroll:
        """The chat's transcript."""
        return self.screen.transcript(self.chat)

    async def _mount(self, widget: Any) -> None:
        await self.transcript.mount(widget)
        self.transcript.anchor()

    async def step_started(self, number: int) -> None:
        """A new answer box for each step after the first (which was mounted with the
        question)."""
        if not self.first:
            self.view = MessageView("assistant", author=self.chat.model or "assistant")
            await self._mount(self.view)
        self.first = False
        assert self.view is not None
        self._streams = (self.view.thinking_stream(), self.view.stream())
        self.parts, self.thinking = [], []
        self.step_open = True

    async def write(self, thinking: str, content: str) -> None:
        """Stream into the step's box, as a plain answer streams."""
        assert self.view is not None and self._streams is not None
        thoughts, stream = self._streams
        if thinking:
            self.thinking.append(thinking)
            if not self.parts:
                await thoughts.write(thinking)
        if content:
            if not self.parts and self.thinking:
                await thoughts.stop()
                self.view.fold_thinking()
            self.parts.append(content)
            self.view.streamed_chunks += 1
            await stream.write(content)

    async def end_step(self, stats: dict[str, Any] | None, *, keep: bool = False) -> None:
        """Show the step's text whole with ``stats`` under it; a step that only called tools
        leaves no empty box (unless ``keep``: an error to show)."""
        self.step_open = False
        if self._streams is not None:
            for stream in self._streams:
                await stream.stop()
            self._streams = None
        view = self.view
        if view is None:
            return
        if not self.parts and not self.thinking and not keep:
            self.view = None
            await view.remove()
        elif stats is not None:
            view.stats = stats

    async def step_finished(self, number: int, reply: StepReply) -> None:
        """The step's answer is whole: shown with its timings (the last one's are set when
        the loop ends, with the loop's summary)."""
        self.step_open = False
        if reply.calls:
            await self.end_step(reply.final)

    async def call_shown(self, record: CallRecord) -> None:
        """The call's block, before it is asked about."""
        block = ToolCallBlock(record.title, record.arguments, call_id=record.id)
        self.blocks[record.id] = block
        await self._mount(block)
        block.set_status("pending")

    async def _ask(self, question: str, always: str) -> str:
        prompt = ApprovalPrompt(question, always=always)
        await self._mount(prompt)
        try:
            return await prompt.answer
        finally:
            await prompt.remove()
            self.screen.query_one("#prompt").focus()

    async def approve(self, record: CallRecord) -> str:
        """A prompt under the call's block."""
        self.blocks[record.id].set_status("asking", "? waiting for your answer")
        answer = await self._ask(f"Run {record.title}?", "Always for this tool")
        if answer in ("yes", "always"):
            self.blocks[record.id].set_status("running", "… running")
        return answer

    async def call_finished(self, record: CallRecord) -> None:
        """The result under the call (folded when long), and how it ended."""
        block = self.blocks.get(record.id)
        if block is None:  # not run at all (unknown tool, bad arguments, step limit)
            block = ToolCallBlock(record.title, record.arguments, call_id=record.id)
            self.blocks[record.id] = block
            await self._mount(block)
        outcome = record.outcome
        await block.show_result(
            outcome.text if outcome else "",
            record.status,
            record.seconds,
            list(outcome.notes) if outcome else [],
        )
        self.transcript.anchor()

    async def settle(self, records: list[CallRecord]) -> None:
        """After a stop: the blocks of calls that were still running or waiting show how
        they ended (stopped, not run)."""
        for record in records:
            block = self.blocks.get(record.id)
            if record.outcome is not None and (block is None or block.status != record.status):
                await self.call_finished(record)

    async def approve_sampling(self, server: str, preview: str) -> str:
        """The request shown, then a prompt."""
        shown = preview if len(preview) <= 600 else "…" + preview[-600:]
        block = ToolCallBlock(f"{server} asks the model", {"question": shown})
        await self._mount(block)
        answer = await self._ask(f"Let {server} use the model?", "Always for this server")
        status = "done" if answer in ("yes", "always") else "declined"
        block.set_status(status, "✓ allowed" if status == "done" else "– declined")
        return answer

    async def notice(self, text: str) -> None:
        """A line in the chat (and a notification)."""
        await self._mount(Static(text, classes="tool-notice", markup=False))
        self.screen.notify(text, severity="warning", markup=False)


class ToolsDialog(_Dialog):
    """Which MCP servers, and which of their tools, the chat has on."""

    DEFAULT_CSS = """
    ToolsDialog > Vertical {
        width: 80%;
        height: 80%;
        border: thick $accent;
        background: $surface;
        padding: 1 2;
    }
    ToolsDialog SelectionList {
        height: 1fr;
    }
    ToolsDialog #tools-buttons {
        height: auto;
        align-horizontal: right;
    }
    """

    def __init__(self, host: ToolHost, chosen: list[str], off: set[str]) -> None:
        super().__init__()
        self.host = host
        self.chosen = chosen
        self.off = off

    def compose(self) -> ComposeResult:
        """Build the widget tree."""
        items: list[Selection[str]] = []
        for handle in self.host.manager.handles.values():
            state = handle.state if not handle.error else f"{handle.state}: {handle.error}"
            items.append(
                Selection(
                    f"{handle.name}  ({state})", f"server:{handle.name}", handle.name in self.chosen
                )
            )
            for tool in handle.listing.tools:
                first = (tool.description.strip().splitlines() or [""])[0][:50]
                items.append(
                    Selection(
                        f"    {tool.name}  {first}", f"tool:{tool.key}", tool.key not in self.off
                    )
                )
        with Vertical():
            yield Label("MCP servers and tools of this chat (Space toggles)")
            yield SelectionList[str](*items, id="tools-list")
            with Horizontal(id="tools-buttons"):
                yield Button("Save", id="save", variant="primary")
                yield Button("Cancel", id="cancel", classes="cancel")

    def on_mount(self) -> None:
        """Focus the list."""
        self.query_one(SelectionList).focus()

    @on(Button.Pressed, "#save")
    def _save(self) -> None:
        selected = set(self.query_one(SelectionList).selected)
        servers = [n for n in self.host.manager.handles if f"server:{n}" in selected]
        off = {
            tool.key
            for handle in self.host.manager.handles.values()
            for tool in handle.listing.tools
            if f"tool:{tool.key}" not in selected
        }
        self.dismiss((servers, sorted(off)))


class ChatTools:
    """The MCP side of the chat screen."""

    def __init__(self, screen: ChatSurface) -> None:
        self.screen = screen
        self.host: ToolHost | None = None
        """The screen's servers (None until the config has been read)."""
        self.enabled: list[str] = []
        """The servers a chat has on unless its settings say otherwise."""
        self.approvals: dict[int, Approvals] = {}
        """What each chat approved for the rest of the chat."""
        self.resources: list[tuple[str, str]] = []
        """Resources attached to the next message: (URI, text)."""
        self._capabilities: dict[str, list[str]] = {}
        self._told: set[tuple[int, str]] = set()
        self._config_error: str | None = None

    def _load(self) -> ToolHost | None:
        if self.host is not None or self._config_error is not None:
            return self.host
        from localllm.mcp.config import load_config
        from localllm.mcp.host import ToolHost

        settings = self.screen.llm.settings
        try:
            config = load_config(settings.mcp_config_path)
        except LocalLLMError as exc:
            self._config_error = str(exc)
            self.screen.notify(str(exc), title="MCP", severity="error", markup=False)
            return None
        for problem in config.problems.values():
            self.screen.notify(problem, title="MCP", severity="warning", markup=False)
        self.enabled = [s.name for s in config.servers.values() if not s.disabled]
        self.host = ToolHost(settings, list(config.servers.values()))
        return self.host

    def servers_of(self, chat: Chat) -> list[str]:
        """The servers ``chat`` has on."""
        host = self._load()
        if host is None:
            return []
        chosen = chat.tools.get("servers")
        names = self.enabled if chosen is None else list(chosen)
        return [name for name in names if name in host.manager.handles]

    async def _capable(self, model: str) -> list[str]:
        if model not in self._capabilities:
            info = await self.screen.llm.client.show(model)
            self._capabilities[model] = list(info.get("capabilities") or [])
        return self._capabilities[model]

    async def start(self, chat: Chat) -> bool:
        """Start the chat's servers that are not running; False when it has none."""
        host = self._load()
        names = self.servers_of(chat)
        if host is None or not names:
            return False
        if any(host.manager.handle(n).state not in ("running", "failed") for n in names):
            self.screen.notify("Starting MCP servers…", title="MCP")
            for problem in await host.start(names):
                self.screen.notify(problem, title="MCP", severity="warning", markup=False)
        return True

    async def offer(self, chat: Chat) -> list[ToolSpec]:
        """The tools to offer ``chat``'s model now (none: answer as usual). A model that
        cannot call tools is said at once (once per chat and model)."""
        if not chat.model or not self.servers_of(chat):
            return []
        try:
            capabilities = await self._capable(chat.model)
        except LocalLLMError:
            return []  # the answer's own request reports what is wrong with the model
        if "tools" not in capabilities:
            if (chat.id, chat.model) not in self._told:
                self._told.add((chat.id, chat.model))
                self.screen.notify(
                    f"{chat.model} cannot call tools (its template declares none): "
                    "answering without the MCP servers",
                    title="MCP",
                    severity="warning",
                    markup=False,
                )
            return []
        if not await self.start(chat):
            return []
        assert self.host is not None
        return self.host.tools(self.servers_of(chat), chat.tools.get("off", []))

    async def prepare(
        self, chat: Chat, view: MessageView, tools: list[ToolSpec]
    ) -> tuple[AgentLoop, TranscriptEvents]:
        """The loop for the chat's last question, drawing into ``view`` and after it; the
        caller runs it and saves what it added (:func:`loop_messages`), also when stopped."""
        from localllm.mcp.loop import Approvals, LoopRequest

        assert self.host is not None and chat.model is not None
        settings = self.screen.llm.settings
        capabilities = await self._capable(chat.model)
        request = LoopRequest(
            model=chat.model,
            messages=chat.request_messages(),
            tools=tools,
            options=dict(chat.options),
            think=chat.think,
            max_steps=settings.mcp_max_steps,
            max_result=settings.mcp_max_result,
            vision="vision" in capabilities,
        )
        events = TranscriptEvents(self.screen, chat, view)
        approvals = self.approvals.setdefault(chat.id, Approvals())
        return self.host.loop(self.screen.llm.client, request, events, approvals), events

    # -- slash commands -------------------------------------------------------------------

    async def command(self, chat: Chat, text: str, send: Callable[[str], Any]) -> bool:
        """Run ``text`` if it is an MCP slash command (``/tools``, ``/prompts``,
        ``/resources``, ``/resource URI``, ``/PROMPT args``); False when it is not one."""
        word, _, rest = text.partition(" ")
        if word not in ("/tools", "/prompts", "/resources", "/resource"):
            host = self._load()
            if host is None or not self.servers_of(chat):
                return False
            await self.start(chat)
            found = host.find_prompt(word[1:], self.servers_of(chat))
            if found is None:
                return False
            await self._use_prompt(found, rest, send)
            return True
        if not await self.start(chat):
            self.screen.notify("No MCP servers are on in this chat (Ctrl+G)", severity="warning")
            return True
        assert self.host is not None
        servers = self.servers_of(chat)
        if word == "/tools":
            names = [
                f"{t.server}/{t.name}" for t in self.host.tools(servers, chat.tools.get("off", []))
            ]
            self.screen.notify("Tools: " + (", ".join(names) or "none"), markup=False)
        elif word == "/prompts":
            names = [f"/{p.name}" for _, p in self.host.prompts(servers)]
            self.screen.notify("Prompts: " + (", ".join(names) or "none"), markup=False)
        elif word == "/resources" or not rest.strip():
            uris = [str(r.uri) for _, r in self.host.resources(servers)]
            self.screen.notify("Resources: " + (", ".join(uris) or "none"), markup=False)
        else:
            try:
                uri, body, _ = await self.host.read_resource(rest.strip(), servers)
            except LocalLLMError as exc:
                self.screen.notify(str(exc), severity="error", markup=False)
                return True
            self.resources.append((uri, body))
            self.screen.show_attachments()
        return True

    async def _use_prompt(
        self, found: tuple[str, Any], rest: str, send: Callable[[str], Any]
    ) -> None:
        """Fill the prompt (``key=value`` words, or the whole rest for a prompt of one
        argument) and send its text as the question."""
        assert self.host is not None
        server, prompt = found
        names = [a.name for a in prompt.arguments or []]
        arguments = _prompt_arguments(rest.strip(), names)
        if arguments is None:
            self.screen.notify(
                f"Usage: /{prompt.name} " + " ".join(f"{n}=..." for n in names),
                severity="warning",
                markup=False,
            )
            return
        try:
            messages = await self.host.prompt_messages(f"{server}:{prompt.name}", arguments)
        except LocalLLMError as exc:
            self.screen.notify(str(exc), severity="error", markup=False)
            return
        text = "\n\n".join(m["content"] for m in messages if m.get("content"))
        await send(text)

    def take_resources(self, text: str) -> str:
        """``text`` with the attached resources after it (then forgotten)."""
        for uri, body in self.resources:
            text += f"\n\n--- {uri} ---\n{body}"
        self.resources = []
        return text

    async def settings(self, chat: Chat) -> tuple[list[str], list[str]] | None:
        """The tools dialog for ``chat`` (servers started first, to list their tools)."""
        host = self._load()
        if host is None or not host.manager.handles:
            path = self.screen.llm.settings.mcp_config_path
            self.screen.notify(
                f"No MCP servers in {path}: add one with `localllm mcp add`",
                severity="warning",
                markup=False,
            )
            return None
        self.screen.notify("Starting MCP servers…", title="MCP")
        for problem in await host.start(retry_failed=True):
            self.screen.notify(problem, title="MCP", severity="warning", markup=False)
        return await self.screen.app.push_screen_wait(
            ToolsDialog(host, self.servers_of(chat), set(chat.tools.get("off", [])))
        )

    async def close(self) -> None:
        """Stop the servers."""
        if self.host is not None:
            await asyncio.shield(self.host.close())
