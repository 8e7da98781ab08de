"""The MCP servers of one chat, through the official SDK's :class:`mcp.Client`: started when
the chat first needs them (all at once), stopped with it, and never able to take the chat
down with them.

Each server's connection lives in a task of its own (:meth:`ServerHandle._serve`), because the
SDK's client holds an anyio task group that must be left by the task that entered it; calls
from the chat only send requests through it. A stdio server's standard error goes to
``mcp-<name>.log`` in the log dir, whose last line names the cause when it fails to start or
exits. Every wait is bounded: the start by the server's ``start_timeout``, each call by its
``timeout`` (both ``LOCALLLM_MCP_TIMEOUT`` by default); a server that exits mid-call ends
that call at once ("connection closed") and is started again when the chat next needs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from .._exceptions import ToolServerError
from .config import ServerConfig
from .tools import ToolSpec, schema_problem

__all__ = ["Sampler", "ServerHandle", "ServerManager", "ServerState"]

Sampler = Callable[[str, Any], Awaitable[Any]]
"""What answers a server's sampling request: (server name, ``CreateMessageRequestParams``)
→ ``CreateMessageResult`` or ``ErrorData``."""

_PAGES = 50  # most pages of tools/prompts/resources read from one server
_SHUTDOWN_SECONDS = 8.0  # the SDK's own stop takes 6 s at most


class ServerState:
    """The states a server goes through (plain strings, shown as they are)."""

    STOPPED = "stopped"
    STARTING = "starting"
    RUNNING = "running"
    FAILED = "failed"
    EXITED = "exited"


@dataclass
class Listing:
    """What a server offers once started."""

    tools: list[ToolSpec] = field(default_factory=list)
    """Its usable tools."""
    skipped: list[str] = field(default_factory=list)
    """One warning per tool left out (an invalid input schema)."""
    prompts: list[Any] = field(default_factory=list)
    """Its prompts (the SDK's ``Prompt``: name, description, arguments)."""
    resources: list[Any] = field(default_factory=list)
    """Its resources (the SDK's ``Resource``: uri, name, description, mime type)."""


def _log_tail(path: Path | None, lines: int = 3) -> str:
    """The last non-empty lines of a server's log, joined, for an error message."""
    if path is None:
        return ""
    try:
        with path.open("rb") as handle:
            handle.seek(0, 2)
            handle.seek(max(handle.tell() - 4096, 0))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
    kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(kept)


def _reason(exc: BaseException) -> str:
    """A short reason for an exception from the SDK or the transport."""
    if isinstance(exc, FileNotFoundError):
        return f"no such program ({exc.filename or exc})"
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_reason(inner) for inner in exc.exceptions)
    text = str(exc) or exc.__class__.__name__
    return text.splitlines()[0]


class ServerHandle:
    """One configured server and, once started, its connection."""

    def __init__(
        self,
        config: ServerConfig,
        *,
        timeout: float,
        log_dir: Path | None,
        sampler: Callable[[], Sampler | None],
    ) -> None:
        self.config = config
        """Its entry in the config file."""
        self.timeout = config.timeout if config.timeout is not None else timeout
        """Seconds each call may take."""
        self.start_timeout = config.start_timeout if config.start_timeout is not None else timeout
        """Seconds the start may take."""
        self.state = ServerState.STOPPED
        """stopped, starting, running, failed or exited."""
        self.error: str | None = None
        """Why it failed or exited (with its log's last line)."""
        self.listing = Listing()
        """Its tools, prompts and resources (empty until it runs)."""
        self.start_seconds = 0.0
        """How long its start took."""
        self.log_path = log_dir / f"mcp-{config.name}.log" if log_dir is not None else None
        """Where a stdio server's standard error goes."""
        self._sampler = sampler
        self._client: Any = None
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    @property
    def name(self) -> str:
        """The server's name."""
        return self.config.name

    # -- start and stop -------------------------------------------------------------------

    async def start(self) -> None:
        """Start the server and read what it offers; never raises: a failure leaves
        :attr:`state` ``failed`` and :attr:`error` saying why."""
        if self.state in (ServerState.RUNNING, ServerState.STARTING):
            return
        await self.stop()
        self.state, self.error = ServerState.STARTING, None
        self._stop = asyncio.Event()
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        began = time.monotonic()
        self._task = asyncio.create_task(self._serve(ready), name=f"mcp-{self.name}")
        try:
            await asyncio.wait_for(asyncio.shield(ready), self.start_timeout)
        except TimeoutError:
            await self._end_task()
            self._fail(f"did not answer within {self.start_timeout:g}s of its start")
        except asyncio.CancelledError:
            await self._end_task()
            self.state = ServerState.STOPPED
            raise
        except Exception as exc:
            await self._end_task()
            reason = _reason(exc)
            self._fail("exited while starting" if "closed" in reason.lower() else reason)
        else:
            self.state = ServerState.RUNNING
        finally:
            if ready.done() and not ready.cancelled():
                ready.exception()  # retrieved: a start given up on must not log it later
        self.start_seconds = time.monotonic() - began

    def _fail(self, reason: str, state: str = ServerState.FAILED) -> None:
        tail = _log_tail(self.log_path)
        self.state = state
        self.error = f"{reason} (its log: {tail})" if tail else reason
        self._client = None

    async def _end_task(self, *, graceful: bool = False) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        self._stop.set()
        if graceful:
            # The SDK's shutdown is bounded (stdin closed, 2 s, SIGTERM, 2 s, SIGKILL): let it
            # run its course; cancel only a task stuck elsewhere.
            await asyncio.wait({task}, timeout=_SHUTDOWN_SECONDS)
        if not task.done():
            task.cancel()
        with contextlib.suppress(BaseException):
            await task

    async def stop(self) -> None:
        """Stop the server (a stdio server's process ends); safe to call in any state."""
        await self._end_task(graceful=self.state == ServerState.RUNNING)
        self._client = None
        if self.state in (ServerState.RUNNING, ServerState.STARTING):
            self.state = ServerState.STOPPED

    async def _serve(self, ready: asyncio.Future[None]) -> None:
        """The connection's task: open it, list what the server offers, hold it until
        :meth:`stop`."""
        try:
            async with AsyncExitStack() as stack:
                client = await stack.enter_async_context(await self._client_for(stack))
                self._client = client
                self.listing = await self._list(client)
                if not ready.done():
                    ready.set_result(None)
                await self._stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(
                    exc if isinstance(exc, Exception) else ToolServerError("stopped")
                )
            elif not isinstance(exc, asyncio.CancelledError):
                self._fail(_reason(exc), ServerState.EXITED)
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self._client = None

    async def _client_for(self, stack: AsyncExitStack) -> Any:
        """The SDK client (not entered yet) for this server's transport."""
        from mcp import Client, StdioServerParameters
        from mcp.client.stdio import stdio_client
        from mcp.client.streamable_http import streamable_http_client
        from mcp.types import Implementation

        import localllm

        config = self.config
        if config.url is not None:
            import httpx2

            http = await stack.enter_async_context(
                httpx2.AsyncClient(headers=dict(config.headers), timeout=self.timeout)
            )
            transport: Any = streamable_http_client(config.url, http_client=http)
        else:
            assert config.command is not None
            errlog: IO[str]
            if self.log_path is not None:
                self.log_path.parent.mkdir(parents=True, exist_ok=True)
                errlog = stack.enter_context(self.log_path.open("a", encoding="utf-8"))
            else:
                errlog = stack.enter_context(
                    open(  # noqa: SIM115 (closed by the stack)
                        "/dev/null", "w", encoding="utf-8"
                    )
                )
            params = StdioServerParameters(
                command=config.command,
                args=list(config.args),
                env=dict(config.env) or None,
                cwd=config.cwd,
            )
            transport = stdio_client(params, errlog=errlog)
        return Client(
            transport,
            read_timeout_seconds=self.timeout,
            sampling_callback=self._sample,
            client_info=Implementation(name="localllm", version=localllm.__version__),
            cache=None,
        )

    async def _list(self, client: Any) -> Listing:
        listing = Listing()
        capabilities = client.server_capabilities
        if capabilities.tools is not None:
            for tool in await _all_pages(client.list_tools, "tools"):
                problem = schema_problem(tool.input_schema)
                if problem is not None:
                    listing.skipped.append(f"{self.name}/{tool.name} left out: {problem}")
                    continue
                listing.tools.append(
                    ToolSpec(self.name, tool.name, tool.description or "", tool.input_schema)
                )
        if capabilities.prompts is not None:
            listing.prompts = await _all_pages(client.list_prompts, "prompts")
        if capabilities.resources is not None:
            listing.resources = await _all_pages(client.list_resources, "resources")
        return listing

    async def _sample(self, context: Any, params: Any) -> Any:
        from mcp.types import ErrorData

        sampler = self._sampler()
        if sampler is None:
            return ErrorData(code=-1, message="no chat is running to answer a sampling request")
        return await sampler(self.name, params)

    # -- using it -------------------------------------------------------------------------

    def _connected(self) -> Any:
        if self._client is None or self.state != ServerState.RUNNING:
            why = f": {self.error}" if self.error else ""
            raise ToolServerError(f"the MCP server {self.name!r} is {self.state}{why}")
        return self._client

    async def _request(self, what: str, run: Callable[[Any], Awaitable[Any]]) -> Any:
        """One request, its failures turned into :class:`ToolServerError` (a closed
        connection also marks the server exited, to be started again next time)."""
        from mcp.shared.exceptions import MCPError

        client = self._connected()
        try:
            return await run(client)
        except MCPError as exc:
            message = _reason(exc)
            if "timed out" in message:
                raise ToolServerError(
                    f"{what} on {self.name!r} did not answer within {self.timeout:g}s"
                ) from None
            if "closed" in message.lower():
                self._fail("exited", ServerState.EXITED)
                raise ToolServerError(
                    f"{what} failed: the MCP server {self.name!r} {self.error}"
                ) from None
            raise ToolServerError(f"{what} on {self.name!r} failed: {message}") from None
        except (OSError, ValueError, TypeError) as exc:
            raise ToolServerError(f"{what} on {self.name!r} failed: {_reason(exc)}") from None

    async def call(self, tool: str, arguments: dict[str, Any]) -> Any:
        """Call ``tool``; the SDK's ``CallToolResult``."""
        return await self._request(
            f"the tool {tool!r}",
            lambda client: client.call_tool(tool, arguments, read_timeout_seconds=self.timeout),
        )

    async def get_prompt(self, name: str, arguments: dict[str, str]) -> Any:
        """The prompt ``name`` filled with ``arguments`` (the SDK's ``GetPromptResult``)."""
        return await self._request(
            f"the prompt {name!r}", lambda client: client.get_prompt(name, arguments)
        )

    async def read_resource(self, uri: str) -> Any:
        """The resource at ``uri`` (the SDK's ``ReadResourceResult``)."""
        return await self._request(
            f"the resource {uri!r}", lambda client: client.read_resource(uri)
        )


async def _all_pages(method: Callable[..., Awaitable[Any]], attribute: str) -> list[Any]:
    """Every item of a paginated list (a bounded number of pages)."""
    items: list[Any] = []
    cursor = None
    for _ in range(_PAGES):
        page = await method(cursor=cursor)
        items.extend(getattr(page, attribute))
        cursor = page.next_cursor
        if not cursor:
            break
    return items


class ServerManager:
    """The servers of one chat, started on first need and stopped by :meth:`close`."""

    def __init__(
        self,
        configs: Iterable[ServerConfig],
        *,
        timeout: float,
        log_dir: Path | None = None,
    ) -> None:
        self.sampler: Sampler | None = None
        """Answers servers' sampling requests (set by the chat while it runs)."""
        self.handles: dict[str, ServerHandle] = {
            config.name: ServerHandle(
                config, timeout=timeout, log_dir=log_dir, sampler=lambda: self.sampler
            )
            for config in configs
        }
        """Every server of the chat, by name."""

    def handle(self, name: str) -> ServerHandle:
        """The server called ``name``."""
        return self.handles[name]

    async def ensure_started(
        self, names: Iterable[str] | None = None, *, retry_failed: bool = True
    ) -> list[ServerHandle]:
        """Start the named servers (all by default) that are not running, at once (those
        that failed to start before only with ``retry_failed``: a server that hangs would
        cost its whole start timeout again); the ones that failed."""
        wanted = [self.handles[n] for n in (names if names is not None else self.handles)]
        starting = [
            h
            for h in wanted
            if h.state != ServerState.RUNNING and (retry_failed or h.state != ServerState.FAILED)
        ]
        await asyncio.gather(*(h.start() for h in starting))
        return [h for h in starting if h.state != ServerState.RUNNING]

    def running(self) -> list[ServerHandle]:
        """The servers running now."""
        return [h for h in self.handles.values() if h.state == ServerState.RUNNING]

    async def close(self) -> None:
        """Stop every server (each stop is bounded)."""
        await asyncio.gather(*(h.stop() for h in self.handles.values()), return_exceptions=True)
