"""The chat screen: several chats (a list on the left), a model per chat, answers streamed as
Markdown with their timings underneath and the model's reasoning folded above them, chats saved
across restarts. With MCP servers configured, the model may call their tools (each call a
block in the chat, asked about first): :mod:`.chat_tools`."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any, ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.reactive import reactive
from textual.widgets import ContentSwitcher, Footer, Label, OptionList, Select
from textual.widgets.option_list import Option
from textual.worker import Worker

from localllm._exceptions import DaemonError
from localllm.chats import EXPORT_FORMATS
from localllm.images import ImageError, ImageLimits, check_image, encode_image, extract_image_paths

from ..chats import Attachment, Chat, SearchHit, StoredMessage
from ..dom import settle
from ..format import chat_title
from ..widgets.message import MessageView, ThrottledMarkdownStream
from ..widgets.prompt import PromptArea
from ..widgets.status import StatusBar
from .base import MainScreen
from .branches import Branches
from .chat_tools import ChatTools, loop_messages, tool_view
from .compare import Compared, CompareScreen
from .dialogs import ChatOptionsDialog, ConfirmDialog
from .find import ExportDialog, SearchDialog, default_export_path, write_export
from .library import PromptLibrary

__all__ = ["ChatScreen", "Transcript"]

_NEW_CHAT = "New chat"
_CURRENT_KEY = "current_chat"
# Fields of the final chunk that are not timings.
_NOT_STATS = ("message", "model", "created_at", "done")


class Transcript(VerticalScroll):
    """The messages of one chat, kept scrolled to the newest while an answer streams."""

    def __init__(self, chat: Chat) -> None:
        super().__init__(id=f"chat-{chat.id}", classes="transcript")
        self.chat = chat
        """The chat shown."""

    def compose(self) -> ComposeResult:
        """Build the widget tree."""
        labels = self.chat.branch_labels()
        carried: int | None = None  # a branch whose first message is not shown
        for message in self.chat.messages:
            if message.role == "tool":
                yield tool_view(message)
            elif message.tool and not (message.content or message.thinking):
                # a step that only called tools: its calls show as blocks, and the answer
                # after them shows which branch this is
                if message.id in labels and carried is None:
                    carried = message.id
            else:
                label = labels.get(message.id or 0, "")
                told: int | None = None
                if carried is not None and not label and message.role == "assistant":
                    told, label, carried = carried, labels[carried], None
                view = _view_for(self.chat, message, label)
                view.label_of = told
                yield view

    def on_mount(self) -> None:
        """Keep the newest message in view."""
        self.anchor()


def _view_for(chat: Chat, message: StoredMessage, branch: str | None = None) -> MessageView:
    author = "You" if message.role == "user" else (message.model or chat.model or "assistant")
    return MessageView(
        message.role,
        message.content,
        author=author,
        stats=message.stats,
        thinking=message.thinking,
        attachments=[image.name for image in message.images],
        message_id=message.id,
        branch=chat.branch_label(message) if branch is None else branch,
    )


# How the options line names a chat's think setting (nothing for the model's default).
_THINK_SUMMARY = {True: "thinking", False: "no thinking"}


def _options_summary(chat: Chat) -> str:
    parts = []
    if "temperature" in chat.options:
        parts.append(f"temp {chat.options['temperature']:g}")
    if "num_ctx" in chat.options:
        parts.append(f"ctx {chat.options['num_ctx']}")
    if "num_predict" in chat.options:
        parts.append(f"max {chat.options['num_predict']}")
    if chat.think is not None:
        parts.append(_THINK_SUMMARY.get(chat.think, f"thinking {chat.think}"))
    if chat.system.strip():
        parts.append("system prompt")
    servers = chat.tools.get("servers")
    if servers is not None:
        parts.append(f"tools: {', '.join(servers)}" if servers else "no tools")
    return " · ".join(parts) or "default options"


class ChatScreen(MainScreen):
    """Talk to a model."""

    MODE = "chat"
    CSS_PATH = "chat.tcss"
    RELOAD_ON_RESUME = True
    BINDINGS: ClassVar[list[BindingType]] = [
        # Quit first: the chat's footer is the longest, and at 100 columns the app's own Quit
        # (shown after every screen key) fell off its end.
        Binding("ctrl+q", "app.quit", "Quit", id="chat.quit"),
        Binding("escape", "stop", "Stop", id="chat.stop"),
        Binding("ctrl+n", "new_chat", "New", id="chat.new"),
        Binding("ctrl+l", "pick_model", "Model", id="chat.model"),
        Binding("ctrl+o", "chat_options", "Options", id="chat.options"),
        Binding("ctrl+r", "regenerate", "Regenerate", id="chat.regenerate"),
        Binding("ctrl+b", "edit", "Edit", id="chat.edit"),
        Binding("alt+left", "branch(-1)", "Branch ◀", id="chat.branch_previous"),
        Binding("alt+right", "branch(1)", "Branch ▶", id="chat.branch_next"),
        Binding("f12", "compare", "Compare", id="chat.compare"),
        Binding("ctrl+f", "search", "Search", id="chat.search"),
        Binding("ctrl+s", "prompts", "Prompts", id="chat.prompts"),
        Binding("f10", "export", "Export", id="chat.export"),
        Binding("f5", "copy_answer", "Copy", id="chat.copy"),
        Binding("f8", "delete_chat", "Delete", id="chat.delete"),
        Binding("ctrl+g", "tools", "Tools (MCP)", show=False, id="chat.tools"),
        Binding("ctrl+up", "switch_chat(-1)", "Previous chat", show=False, id="chat.previous"),
        Binding("ctrl+down", "switch_chat(1)", "Next chat", show=False, id="chat.next"),
        Binding("alt+up", "select(-1)", "Pick message above", show=False, id="chat.select_up"),
        Binding("alt+down", "select(1)", "Pick message below", show=False, id="chat.select_down"),
    ]

    answering: reactive[bool] = reactive(False)
    """True while the current chat's answer is streaming."""

    def __init__(self) -> None:
        super().__init__()
        self.chats: dict[int, Chat] = {}
        """Every chat, by id, in list order."""
        self.current: Chat | None = None
        """The chat shown."""
        self.answers: dict[int, Worker[None]] = {}
        """Answers streaming now, by chat id."""
        self.models: list[str] = []
        """Model names offered in the picker."""
        self.attachments: list[Attachment] = []
        """Images attached (``/image PATH`` or a pasted path) for the next message."""
        self.tools = ChatTools(self)
        """The MCP servers, tools, prompts and resources of the chats."""
        self.branches = Branches(self)
        """Regenerate, edit and the branches of the chats."""
        self._starting: set[int] = set()

    def compose(self) -> ComposeResult:
        """Build the widget tree."""
        yield StatusBar(self.MODE)
        with Horizontal(id="chat-body"):
            yield OptionList(id="chat-list")
            with Vertical(id="chat-main"):
                with Horizontal(id="chat-top"):
                    yield Select[str]([], prompt="Pick a model (Ctrl+L)", id="model", compact=True)
                    yield Label("", id="chat-options")
                yield ContentSwitcher(id="transcripts")
                yield Label("", id="attachments")
                yield PromptArea(id="prompt", placeholder="Message (Enter sends, Ctrl+J new line)")
        yield Footer(compact=True, show_command_palette=False)

    async def on_mount(self) -> None:
        """Load the saved chats and show the one open last time."""
        store = self.llm.chats
        chats = await asyncio.to_thread(store.list_chats)
        if not chats:
            chats = [await asyncio.to_thread(store.create_chat, _NEW_CHAT)]
        self.chats = {chat.id: chat for chat in chats}
        self.query_one("#chat-list", OptionList).set_options(
            Option(chat.title, id=str(chat.id)) for chat in chats
        )
        saved = await asyncio.to_thread(store.get_meta, _CURRENT_KEY)
        current = self.chats.get(int(saved)) if saved and saved.isdigit() else None
        await self.show_chat(current or chats[-1])

    # -- the daemon -----------------------------------------------------------------------

    async def on_daemon_connected(self) -> None:
        """Offer the store's models in the picker."""
        names = await self.offer_models(self.query_one("#model", Select))
        if names is None:
            return
        self.models = names
        if self.current is not None:
            if self.current.model is None and self.models:
                self.current.model = self.models[0]
                await asyncio.to_thread(self.llm.chats.update_chat, self.current)
            self._show_model(self.current)

    def _show_model(self, chat: Chat) -> None:
        select = self.query_one("#model", Select)
        with select.prevent(Select.Changed):
            if chat.model in self.models:
                select.value = chat.model
            else:
                select.clear()

    @on(Select.Changed, "#model")
    async def _model_picked(self, event: Select.Changed) -> None:
        chat = self.current
        if chat is None or not isinstance(event.value, str) or event.value == chat.model:
            return
        chat.model = event.value
        # Loading starts now, while the first message is still being typed.
        self.run_worker(self._load(event.value, chat.options), group="load", exclusive=True)
        await asyncio.to_thread(self.llm.chats.update_chat, chat)
        self.query_one("#prompt").focus()

    async def _load(self, model: str, options: dict[str, Any] | None) -> None:
        """Load ``model`` as the chat's requests will want it (its options); a model that
        cannot load is said now, rather than at the first message."""
        try:
            await self.llm.client.load(model, options=options or None)
        except DaemonError as exc:
            self.report(exc, f"Could not load {model}")

    # -- chats ----------------------------------------------------------------------------

    async def show_chat(self, chat: Chat) -> None:
        """Switch to ``chat`` (building its transcript the first time)."""
        self.current = chat
        switcher = self.query_one("#transcripts", ContentSwitcher)
        if not switcher.query(f"#chat-{chat.id}"):
            await switcher.mount(Transcript(chat))
        switcher.current = f"chat-{chat.id}"
        chat_list = self.query_one("#chat-list", OptionList)
        chat_list.highlighted = chat_list.get_option_index(str(chat.id))
        self.query_one("#chat-options", Label).update(_options_summary(chat))
        self._show_model(chat)
        self.answering = chat.id in self.answers
        self.query_one("#prompt").focus()
        await asyncio.to_thread(self.llm.chats.set_meta, _CURRENT_KEY, str(chat.id))

    def transcript(self, chat: Chat | None = None) -> Transcript:
        """A chat's transcript (the current chat's by default)."""
        chat = chat or self.current
        assert chat is not None
        return self.query_one(f"#chat-{chat.id}", Transcript)

    @on(OptionList.OptionSelected, "#chat-list")
    async def _chat_selected(self, event: OptionList.OptionSelected) -> None:
        chat = self.chats.get(int(event.option.id or 0))
        if chat is not None and chat is not self.current:
            await self.show_chat(chat)

    async def action_switch_chat(self, step: int) -> None:
        """Show the previous (-1) or next (+1) chat in the list."""
        ids = list(self.chats)
        if self.current is None or not ids:
            return
        index = (ids.index(self.current.id) + step) % len(ids)
        await self.show_chat(self.chats[ids[index]])

    async def action_new_chat(self) -> None:
        """Start an empty chat with the current chat's model, options and think setting."""
        model = self.current.model if self.current else (self.models or [None])[0]
        system = self.current.system if self.current else ""
        options = dict(self.current.options) if self.current else {}
        think = self.current.think if self.current else None
        tools = dict(self.current.tools) if self.current else {}
        chat = await asyncio.to_thread(
            self.llm.chats.create_chat, _NEW_CHAT, model, system, options, think, tools
        )
        self.chats[chat.id] = chat
        self.query_one("#chat-list", OptionList).add_option(Option(chat.title, id=str(chat.id)))
        await self.show_chat(chat)

    @work(exclusive=True, group="dialog")
    async def action_delete_chat(self) -> None:
        """Delete the current chat, after asking."""
        chat = self.current
        if chat is None:
            return
        question = f"Delete the chat “{chat.title}” and its {len(chat.messages)} messages?"
        if not await self.app.push_screen_wait(ConfirmDialog(question, "Delete")):
            return
        if (worker := self.answers.get(chat.id)) is not None:
            worker.cancel()
            await worker.wait()
        await asyncio.to_thread(self.llm.chats.delete_chat, chat.id)
        del self.chats[chat.id]
        self.query_one("#chat-list", OptionList).remove_option(str(chat.id))
        await settle(self.transcript(chat).remove())
        if self.chats:
            await self.show_chat(list(self.chats.values())[-1])
        else:
            self.current = None
            await self.action_new_chat()

    @work(exclusive=True, group="dialog")
    async def action_chat_options(self) -> None:
        """Edit the current chat's system prompt, temperature, context, answer length and
        thinking."""
        chat = self.current
        if chat is None:
            return
        result = await self.app.push_screen_wait(
            ChatOptionsDialog(chat.system, chat.options, chat.think)
        )
        if result is None:
            return
        chat.system, chat.options, chat.think = result
        await asyncio.to_thread(self.llm.chats.update_chat, chat)
        self.query_one("#chat-options", Label).update(_options_summary(chat))

    @work(exclusive=True, group="dialog")
    async def action_prompts(self) -> None:
        """Open the library of saved system prompts; the one picked becomes the chat's."""
        chat = self.current
        if chat is None:
            return
        picked = await self.app.push_screen_wait(PromptLibrary(self.llm.chats, chat.system))
        if picked is None:
            return
        chat.system = picked.text
        await asyncio.to_thread(self.llm.chats.update_chat, chat)
        self.query_one("#chat-options", Label).update(_options_summary(chat))
        self.notify(f"This chat's system prompt is now “{picked.name}”")

    @work(exclusive=True, group="dialog")
    async def action_compare(self) -> None:
        """Ask two or three models the message box's question at once, side by side; the
        answer picked continues the chat, the others are kept as its branches."""
        chat = self.current
        if chat is None:
            return
        if chat.id in self.answers:
            self.notify("Wait for the answer, or press Esc to stop it", severity="warning")
            return
        if not chat.model or len(self.models) < 2:
            self.notify("Comparing needs a model picked and another one in the store")
            return
        prompt = self.query_one("#prompt", PromptArea)
        screen = CompareScreen(self.llm.client, chat, self.models, prompt.text.strip())
        result = await self.app.push_screen_wait(screen)
        if result is not None:
            prompt.clear()
            await self.keep_compared(chat, result)

    async def keep_compared(self, chat: Chat, result: Compared) -> None:
        """Save the compared question and every answer (as branches under it); the picked
        one is on screen, and the chat goes on from it."""
        store = self.llm.chats
        question = await asyncio.to_thread(
            store.add_message, chat.id, StoredMessage("user", result.question)
        )
        for answer in result.answers:
            await asyncio.to_thread(store.add_message, chat.id, answer, parent=question.id)
        picked = result.answers[result.picked]
        await asyncio.to_thread(store.set_head, chat.id, picked.id)
        chat.messages.append(question)
        chat.others.extend(result.answers)
        chat.show_branch(picked.id)
        if chat.title == _NEW_CHAT:
            chat.title = chat_title(result.question)
            self.query_one("#chat-list", OptionList).replace_option_prompt(str(chat.id), chat.title)
            await asyncio.to_thread(store.update_chat, chat)
        await self.rebuild_transcript(chat)

    @work(exclusive=True, group="dialog")
    async def action_search(self, text: str = "") -> None:
        """Search every chat's messages; the one picked is shown on its branch."""
        hit = await self.app.push_screen_wait(SearchDialog(self.llm.chats, text))
        if hit is not None:
            await self.open_hit(hit)

    async def open_hit(self, hit: SearchHit) -> None:
        """Show the chat of ``hit`` on the branch of its message, the message picked."""
        chat = self.chats.get(hit.chat_id)
        if chat is None:
            return
        if chat is not self.current:
            await self.show_chat(chat)
        message = next((m for m in chat.all_messages() if m.id == hit.message_id), None)
        if message is None:
            return
        if message not in chat.messages:
            if chat.id in self.answers:
                self.notify("Its branch shows once the answer ends", severity="warning")
                return
            chat.show_branch(chat.leaf_under(message).id)
            await asyncio.to_thread(self.llm.chats.set_head, chat.id, chat.head)
            await self.rebuild_transcript(chat)
        self.branches.selected = message.id
        self.branches.show_selection(chat)

    @work(exclusive=True, group="dialog")
    async def action_export(self) -> None:
        """Export the branch on screen to Markdown or to JSON (OpenAI messages)."""
        chat = self.current
        if chat is None:
            return
        chosen = await self.app.push_screen_wait(ExportDialog(chat))
        if chosen is not None:
            await self.export(chat, *chosen)

    async def export(self, chat: Chat, form: str, path: Path) -> bool:
        """Write ``chat``'s branch on screen to ``path``; says where, or why not."""
        try:
            written = await write_export(chat, form, path)
        except OSError as exc:
            self.notify(f"Cannot write {path}: {exc.strerror or exc}", severity="error")
            return False
        self.notify(f"Exported {len(chat.messages)} messages to {written}", markup=False)
        return True

    async def _command(self, chat: Chat, text: str) -> bool:
        """``/search [TEXT]`` and ``/export [md|json] [PATH]``; False for other text."""
        word, _, rest = text.partition(" ")
        if word == "/compare":
            self.query_one("#prompt", PromptArea).text = rest.strip()
            self.action_compare()
            return True
        if word == "/search":
            self.action_search(rest.strip())
        elif word == "/export":
            form, _, path = rest.strip().partition(" ")
            if form and form not in EXPORT_FORMATS:
                self.notify("Usage: /export [md|json] [PATH]", severity="warning")
                return True
            form = form or "md"
            await self.export(
                chat, form, Path(path.strip()) if path.strip() else default_export_path(chat, form)
            )
        else:
            return False
        self.query_one("#prompt", PromptArea).clear()
        return True

    @work(exclusive=True, group="dialog")
    async def action_tools(self) -> None:
        """Choose the current chat's MCP servers and tools."""
        chat = self.current
        if chat is None:
            return
        result = await self.tools.settings(chat)
        if result is None:
            return
        servers, off = result
        chat.tools = {"servers": servers, "off": off}
        await asyncio.to_thread(self.llm.chats.update_chat, chat)
        self.query_one("#chat-options", Label).update(_options_summary(chat))

    def action_pick_model(self) -> None:
        """Open the model picker."""
        select = self.query_one("#model", Select)
        select.focus()
        select.action_show_overlay()

    def action_copy_answer(self) -> None:
        """Copy the last answer of the chat to the clipboard."""
        answer = self.current.last_answer() if self.current else None
        if not answer:
            self.notify("No answer to copy yet", severity="warning")
            return
        self.app.copy_to_clipboard(answer)
        self.notify(f"Copied the last answer ({len(answer)} characters)")

    # -- asking and answering -----------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Show Stop only while an answer streams (or a question is edited), the branch keys
        where there are branches, Regenerate and Edit once there is something to redo."""
        chat = self.current
        if action == "stop":
            return self.answering or self.branches.editing is not None
        if action == "branch":
            return self.branches.has_branches(chat)
        if action in ("regenerate", "edit"):
            if chat is None or not any(m.role == "user" for m in chat.messages):
                return False
            return None if self.answering else True  # shown, greyed while answering
        return True

    def watch_answering(self) -> None:
        """Show or hide Stop in the footer."""
        # No CSS class for it: a class change on the screen restyles every widget of a long
        # chat (a third of a second with a few dozen messages), twice per answer.
        self.refresh_bindings()

    @on(PromptArea.Submitted, "#prompt")
    async def _send(self, event: PromptArea.Submitted) -> None:
        await self.send(event.text)

    async def attach(self, typed: str, path: Path) -> bool:
        """Attach the image at ``path`` to the next message; False (and says why) when it is
        no image this daemon would take."""
        limits = ImageLimits.from_settings(self.llm.settings)
        try:
            data = await asyncio.to_thread(path.read_bytes)
            check_image(data, path.name, limits)
        except OSError as exc:
            self.notify(
                f"Cannot read {typed}: {exc.strerror or exc}", severity="error", markup=False
            )
            return False
        except ImageError as exc:
            self.notify(str(exc), severity="error", markup=False)
            return False
        self.attachments.append(Attachment(path.name, encode_image(data)))
        self.show_attachments()
        return True

    def show_attachments(self) -> None:
        """Show what goes with the next message: images, MCP resources."""
        label = self.query_one("#attachments", Label)
        names = [f"🖼 {image.name}" for image in self.attachments]
        names += [f"📎 {uri}" for uri, _ in self.tools.resources]
        text = f"{', '.join(names)} (sent with your next message)" if names else ""
        if self.branches.editing is not None:
            text = "Editing: Enter sends it as a new branch (the old one is kept), Esc cancels" + (
                f" · {text}" if text else ""
            )
        label.update(text)
        label.display = bool(text)

    async def _take_images(self, text: str) -> str | None:
        """``/image PATH`` or image paths typed or pasted into ``text`` become attachments;
        the text left to send, or None when nothing is left to send now."""
        if text.startswith("/image"):
            typed = text.removeprefix("/image").strip().strip("'\"")
            if not typed:
                self.notify("Usage: /image PATH", severity="warning")
            else:
                await self.attach(typed, Path(typed).expanduser())
            self.query_one("#prompt", PromptArea).clear()
            return None
        rest, found = extract_image_paths(text)
        for typed, path in found:
            if not await self.attach(typed, path):
                return None
        if found and not rest.strip():
            self.query_one("#prompt", PromptArea).clear()  # a pasted path alone: ask next
            return None
        return rest

    async def send(self, text: str) -> bool:
        """Ask the current chat's model ``text``; the answer streams into the transcript.
        Returns False (and says why) when it cannot be sent now. ``/image PATH``, or image
        paths in the text, attach images to the message (see :meth:`attach`)."""
        chat = self.current
        text = text.strip()
        if chat is None or not text:
            return False
        if await self._command(chat, text):
            return False
        if text.startswith("/") and not text.startswith("/image") and chat.id not in self.answers:
            self.query_one("#prompt", PromptArea).clear()
            if await self.tools.command(chat, text, self.send):
                return False
            self.query_one("#prompt", PromptArea).text = text  # not ours: sent as typed
        taken = await self._take_images(text)
        if taken is None:
            return False
        text = taken
        if chat.id in self.answers:
            self.notify("Wait for the answer, or press Esc to stop it", severity="warning")
            return False
        if not chat.model:
            self.notify("Pick a model first (Ctrl+L)", severity="warning")
            return False
        if chat.id in self._starting:
            return False  # its servers are starting for the message sent just before
        self._starting.add(chat.id)
        try:
            tools = await self.tools.offer(chat)
        finally:
            self._starting.discard(chat.id)
        self.query_one("#prompt", PromptArea).clear()
        text = self.tools.take_resources(text)
        await self.branches.fork(chat)
        question = StoredMessage("user", text, images=self.attachments)
        self.attachments = []
        self.show_attachments()
        branch = self.branches.new_label(chat, chat.head)
        chat.messages.append(question)
        if chat.title == _NEW_CHAT:
            chat.title = chat_title(text)
            self.query_one("#chat-list", OptionList).replace_option_prompt(str(chat.id), chat.title)
            await asyncio.to_thread(self.llm.chats.update_chat, chat)
        await asyncio.to_thread(self.llm.chats.add_message, chat.id, question)
        self.branches.selected = None  # the picked message was for what came before
        self.branches.show_selection(chat)
        transcript = self.transcript(chat)
        view = MessageView("assistant", author=chat.model)
        await transcript.mount_all([_view_for(chat, question, branch), view])
        transcript.anchor()
        self._start_answer(chat, view, tools)
        return True

    async def answer_last(self, chat: Chat, tools: bool = True) -> None:
        """Answer the last question on ``chat``'s branch on screen again: a new answer, the
        next branch beside the others (Regenerate)."""
        assert chat.model is not None
        offered = await self.tools.offer(chat) if tools else []
        view = MessageView(
            "assistant", author=chat.model, branch=self.branches.new_label(chat, chat.head)
        )
        transcript = self.transcript(chat)
        await transcript.mount(view)
        transcript.anchor()
        self._start_answer(chat, view, offered)

    def _start_answer(self, chat: Chat, view: MessageView, tools: list[Any]) -> None:
        assert chat.model is not None
        answering = (
            self._answer_with_tools(chat, view, tools)
            if tools
            else self._answer(chat, chat.model, chat.request_messages(), view)
        )
        self.answers[chat.id] = self.run_worker(
            answering, name=f"answer-{chat.id}", group="answers"
        )
        self.answering = True

    def action_stop(self) -> None:
        """Stop the current chat's answer (what came so far is kept), or stop editing."""
        if self.current is not None and (worker := self.answers.get(self.current.id)):
            worker.cancel()
        elif self.branches.editing is not None:
            self.branches.editing = None
            self.query_one("#prompt", PromptArea).clear()
            self.show_attachments()

    # -- branches -------------------------------------------------------------------------

    async def action_regenerate(self) -> None:
        """Answer the last question again, as a new branch (the old answer is kept)."""
        await self.branches.regenerate()

    def action_edit(self) -> None:
        """Put the picked question (or the last) into the message box: what is sent then
        forks the chat there (the old branch is kept)."""
        message = self.branches.edit()
        if message is None:
            return
        prompt = self.query_one("#prompt", PromptArea)
        prompt.text = message.content
        prompt.move_cursor(prompt.document.end)
        self.attachments = list(message.images)
        self.show_attachments()
        self.refresh_bindings()
        prompt.focus()

    async def action_branch(self, step: int) -> None:
        """Show the previous (-1) or next (+1) branch where the picked message (or the last
        that has branches) parts."""
        await self.branches.switch(step)

    def action_select(self, step: int) -> None:
        """Pick the message above (-1) or below (+1), for Edit and the branch keys."""
        self.branches.select(step)

    async def rebuild_transcript(self, chat: Chat) -> None:
        """Show ``chat``'s branch on screen again, from scratch (after a switch or a cut)."""
        switcher = self.query_one("#transcripts", ContentSwitcher)
        await settle(self.transcript(chat).remove())
        await switcher.mount(Transcript(chat))
        if self.current is chat:
            switcher.current = None  # the same id again: shown only when it changes
            switcher.current = f"chat-{chat.id}"
        else:
            self.transcript(chat).display = False
        self.branches.show_selection(chat)
        self.refresh_bindings()
        self.query_one("#prompt").focus()  # the transcript that had it is gone

    async def _answer(
        self, chat: Chat, model: str, messages: list[dict[str, Any]], view: MessageView
    ) -> None:
        # Throttled: the answer re-renders a few times a second, not once per token.
        stream = view.stream()
        thoughts = view.thinking_stream()
        parts: list[str] = []
        thinking: list[str] = []
        stats: dict[str, Any] = {"done_reason": "stopped"}
        try:
            async for chunk in self.llm.client.chat_stream(
                model, messages, options=chat.options or None, think=chat.think
            ):
                message = chunk.get("message", {})
                if reasoning := message.get("thinking", ""):
                    thinking.append(reasoning)
                    if not parts:  # once the answer began, its box is finished: kept, not shown
                        view.streamed_chunks += 1
                        await thoughts.write(reasoning)
                piece = message.get("content", "")
                if piece:
                    if not parts and thinking:
                        # the answer begins: the reasoning shown whole, then folded away
                        await thoughts.stop()
                        view.fold_thinking()
                    parts.append(piece)
                    view.streamed_chunks += 1
                    await stream.write(piece)
                if chunk.get("done"):
                    stats = {k: v for k, v in chunk.items() if k not in _NOT_STATS}
        except DaemonError as exc:
            stats = {"error": str(exc)}
            self.report(exc, f"{model} could not answer")
        except Exception as exc:  # a broken connection must not take the whole UI down
            stats = {"error": f"{exc.__class__.__name__}: {exc}"}
            self.notify(f"{model} could not answer: {exc}", severity="error")
        finally:
            # Runs on Esc (cancellation) too: keep what arrived, shown whole and saved.
            answer = StoredMessage("assistant", "".join(parts), stats, thinking="".join(thinking))
            await self._finish_answer(chat, view, (thoughts, stream), answer)

    async def _answer_with_tools(self, chat: Chat, view: MessageView, tools: list[Any]) -> None:
        """The answer through the MCP agent loop: each step's text, each call a block, the
        approvals prompts in the chat; Esc stops it (a running call ends), and what it did
        so far is saved."""
        loop, events = await self.tools.prepare(chat, view, tools)
        error: str | None = None
        try:
            await loop.run()
        except DaemonError as exc:
            error = str(exc)
            self.report(exc, f"{chat.model} could not answer")
        except Exception as exc:  # a broken server or connection must not take the UI down
            error = f"{exc.__class__.__name__}: {exc}"
            self.notify(f"{chat.model} could not answer: {exc}", severity="error", markup=False)
        finally:
            try:
                saved = loop_messages(loop.result)
                await events.settle(loop.result.calls)
                if events.step_open:  # stopped or failed in the middle of an answer
                    stats = {"error": error} if error else {"done_reason": "stopped"}
                    partial = "".join(events.parts)
                    if partial or events.thinking or error:
                        thinking = "".join(events.thinking)
                        saved.append(StoredMessage("assistant", partial, stats, thinking=thinking))
                    await events.end_step(stats, keep=bool(error))
                elif saved and saved[-1].role == "assistant" and not saved[-1].tool:
                    await events.end_step(saved[-1].stats)
                for message in saved:
                    chat.messages.append(message)
                    await asyncio.to_thread(self.llm.chats.add_message, chat.id, message)
                if saved and events.view is view:
                    view.message_id = saved[0].id
                elif saved and events.view is not None:
                    # the first step only called tools (its box is gone): the last answer's
                    # box tells the branch, which began with that step
                    events.view.message_id = saved[-1].id
                    events.view.label_of = saved[0].id
                self._saved(chat)
            finally:
                self.answers.pop(chat.id, None)
                if self.current is chat:
                    self.answering = False

    async def _finish_answer(
        self,
        chat: Chat,
        view: MessageView,
        streams: tuple[ThrottledMarkdownStream, ...],
        answer: StoredMessage,
    ) -> None:
        try:
            # Saved first: when the app quits mid-answer the widgets may already be gone.
            stats = answer.stats or {}
            if answer.content or answer.thinking or "error" not in stats:
                chat.messages.append(answer)
                await asyncio.to_thread(self.llm.chats.add_message, chat.id, answer)
                view.message_id = answer.id
                self._saved(chat)
            # Shows the whole answer in the full Markdown view: rendered once, at the end.
            for stream in streams:
                await stream.stop()
            view.stats = stats
        finally:
            self.answers.pop(chat.id, None)
            if self.current is chat:
                self.answering = False

    def _saved(self, chat: Chat) -> None:
        """A message was saved: the headers' ``n/N`` and the keys that apply may change."""
        if self.is_mounted and self.query(f"#chat-{chat.id}"):
            self.branches.labels(chat)
            self.refresh_bindings()

    async def on_unmount(self) -> None:
        """Stop the answers still streaming, so what came so far is saved before exit."""
        workers = list(self.answers.values())
        for worker in workers:
            worker.cancel()
        for worker in workers:
            with contextlib.suppress(Exception):
                await worker.wait()
        await self.tools.close()  # the chats' MCP servers stop with the screen
