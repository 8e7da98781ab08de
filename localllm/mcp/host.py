"""The MCP side of one chat (``localllm run``'s or the TUI's): which servers it uses, started
when it first needs them and stopped with it, the tools on offer (all of the chosen servers'
tools, less those switched off), what was approved for the rest of the chat, the servers'
prompts and resources, and one :class:`~.loop.AgentLoop` per message.

Problems are said, once each, never raised into the chat: a server that does not start, a
tool left out for its schema. A chat whose servers all failed goes on without tools.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from .._exceptions import ToolConfigError
from .config import ServerConfig, ToolConfig, load_config
from .loop import AgentLoop, Approvals, LoopEvents, LoopRequest
from .servers import ServerManager, ServerState
from .tools import ToolSpec, assign_call_names

if TYPE_CHECKING:
    from ..client import AsyncClient
    from ..settings import Settings

__all__ = ["ToolHost", "choose_servers"]


def choose_servers(config: ToolConfig, names: Iterable[str] | None) -> list[ServerConfig]:
    """The servers a chat uses: the ``names`` given (each must exist, disabled or not), else
    every server of the config that is not ``disabled``."""
    if names is None:
        return [server for server in config.servers.values() if not server.disabled]
    return [config.server(name) for name in dict.fromkeys(names)]


class ToolHost:
    """The servers, tools and approvals of one chat."""

    def __init__(
        self,
        settings: Settings,
        servers: Sequence[ServerConfig],
        *,
        auto_approve: bool = False,
    ) -> None:
        self.settings = settings
        self.manager = ServerManager(
            servers, timeout=settings.mcp_timeout, log_dir=settings.log_dir
        )
        """The chat's servers."""
        self.approvals = Approvals(auto_approve)
        """What runs without asking."""
        self.disabled: set[str] = set()
        """``server/tool`` keys switched off for this chat."""
        self._said: set[str] = set()

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        names: Iterable[str] | None = None,
        *,
        auto_approve: bool = False,
        config: ToolConfig | None = None,
    ) -> ToolHost:
        """The host for the servers ``names`` (default: every enabled one) of the config file."""
        config = config or load_config(settings.mcp_config_path)
        return cls(settings, choose_servers(config, names), auto_approve=auto_approve)

    @property
    def server_names(self) -> list[str]:
        """The chat's servers, in config order."""
        return list(self.manager.handles)

    async def start(
        self, names: Iterable[str] | None = None, *, retry_failed: bool = False
    ) -> list[str]:
        """Start the servers not running: never started, stopped, or exited since (those
        that failed to start, only with ``retry_failed``); the problems not said yet, one
        line each."""
        names = None if names is None else list(names)
        await self.manager.ensure_started(names, retry_failed=retry_failed)
        lines = []
        for handle in self.manager.handles.values():
            if names is not None and handle.name not in names:
                continue
            if handle.state in (ServerState.FAILED, ServerState.EXITED):
                lines.append(f"MCP server {handle.name!r} {handle.state}: {handle.error}")
            lines += [f"MCP tool {warning}" for warning in handle.listing.skipped]
        fresh = [line for line in lines if line not in self._said]
        self._said.update(fresh)
        return fresh

    def all_tools(self) -> list[ToolSpec]:
        """Every usable tool of the running servers (switched off or not)."""
        return [tool for handle in self.manager.running() for tool in handle.listing.tools]

    def tools(
        self, servers: Iterable[str] | None = None, off: Iterable[str] = ()
    ) -> list[ToolSpec]:
        """The tools on offer (of ``servers``, default all; less the ``server/tool`` keys
        ``off`` and :attr:`disabled`), with the names the model calls them by."""
        wanted = None if servers is None else set(servers)
        skipped = self.disabled | set(off)
        return assign_call_names(
            tool
            for tool in self.all_tools()
            if tool.key not in skipped and (wanted is None or tool.server in wanted)
        )

    def prompts(self, servers: Iterable[str] | None = None) -> list[tuple[str, Any]]:
        """(server, prompt) for every prompt of the running servers (of ``servers``)."""
        return [
            (h.name, p)
            for h in self.manager.running()
            if servers is None or h.name in servers
            for p in h.listing.prompts
        ]

    def resources(self, servers: Iterable[str] | None = None) -> list[tuple[str, Any]]:
        """(server, resource) for every resource of the running servers (of ``servers``)."""
        return [
            (h.name, r)
            for h in self.manager.running()
            if servers is None or h.name in servers
            for r in h.listing.resources
        ]

    def find_prompt(
        self, name: str, servers: Iterable[str] | None = None
    ) -> tuple[str, Any] | None:
        """The prompt called ``name`` (or ``server:name``), None when there is none."""
        server, _, bare = name.rpartition(":")
        for owner, prompt in self.prompts(servers):
            if prompt.name == bare and server in ("", owner):
                return owner, prompt
        return None

    async def prompt_messages(self, name: str, arguments: dict[str, str]) -> list[dict[str, Any]]:
        """The prompt ``name`` filled in, as chat messages (text, and images as images)."""
        found = self.find_prompt(name)
        if found is None:
            known = ", ".join(p.name for _, p in self.prompts()) or "none"
            raise ToolConfigError(f"no MCP prompt is called {name!r} (prompts: {known})")
        server, prompt = found
        missing = [
            a.name for a in (prompt.arguments or []) if a.required and a.name not in arguments
        ]
        if missing:
            raise ToolConfigError(f"the prompt {prompt.name!r} needs {', '.join(missing)}")
        result = await self.manager.handle(server).get_prompt(prompt.name, arguments)
        messages = []
        for message in result.messages:
            text, images = _content_of([message.content])
            item: dict[str, Any] = {"role": message.role, "content": text}
            if images:
                item["images"] = images
            messages.append(item)
        return messages

    async def read_resource(
        self, uri: str, servers: Iterable[str] | None = None
    ) -> tuple[str, str, list[str]]:
        """The resource at ``uri`` (or named so) of a running server: (its URI, its text,
        its images as base64)."""
        for server, resource in self.resources(servers):
            if str(resource.uri) == uri or resource.name == uri:
                result = await self.manager.handle(server).read_resource(str(resource.uri))
                text, images = _content_of(result.contents)
                return str(resource.uri), text, images
        known = ", ".join(str(r.uri) for _, r in self.resources()) or "none"
        raise ToolConfigError(f"no MCP resource is {uri!r} (resources: {known})")

    def loop(
        self,
        client: AsyncClient,
        request: LoopRequest,
        events: LoopEvents,
        approvals: Approvals | None = None,
    ) -> AgentLoop:
        """The loop for one message (``request.tools`` is filled in when empty), with the
        chat's ``approvals`` (default: the host's own)."""
        if not request.tools:
            request.tools = self.tools()
        return AgentLoop(client, self.manager, request, events, approvals or self.approvals)

    async def close(self) -> None:
        """Stop every server."""
        await self.manager.close()


def _content_of(blocks: Iterable[Any]) -> tuple[str, list[str]]:
    """Text and images of prompt content or resource contents."""
    texts: list[str] = []
    images: list[str] = []
    for block in blocks:
        kind = getattr(block, "type", None)
        if kind == "text" or (kind is None and getattr(block, "text", None) is not None):
            texts.append(block.text)
        elif kind == "image":
            images.append(block.data)
        elif kind == "resource":
            inner = block.resource
            texts.append(getattr(inner, "text", None) or f"[{inner.uri}]")
        elif getattr(block, "blob", None) is not None:
            mime = getattr(block, "mime_type", "") or ""
            if mime.startswith("image/"):
                images.append(block.blob)
            else:
                size = len(base64.b64decode(block.blob, validate=False))
                texts.append(f"[{block.uri}: {mime or 'binary'} data, {size} bytes]")
    return "\n".join(texts), images
