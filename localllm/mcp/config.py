"""The MCP servers file: ``mcp.json`` in the user's config dir (``LOCALLLM_MCP_CONFIG``
overrides), in the ``mcpServers`` shape that Claude Desktop, Cursor and LM Studio use::

    {"mcpServers": {
        "time": {"command": "uvx", "args": ["mcp-server-time"], "env": {"TZ": "UTC"}},
        "docs": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer x"}}
    }}

An entry with ``command`` (and ``args``, ``env``, ``cwd``) is a server started as a child
process speaking stdio; one with ``url`` (and ``headers``) a remote server reached by
Streamable HTTP. localllm also reads ``disabled`` (true: never started), ``timeout`` (seconds
each call may take) and ``start_timeout`` (seconds to start), both ``LOCALLLM_MCP_TIMEOUT``
by default, and ``type`` (``stdio``,
``http`` or ``streamable-http``; ``sse`` is refused, the SDK's old transport). Fields it does
not know are kept as they are when ``localllm mcp add`` or ``rm`` rewrite the file, and so is
everything outside ``mcpServers``, so one file can serve several hosts.

This module reads and writes the file only; nothing here starts a server (that is
:mod:`.servers`), so ``localllm mcp add`` does not import the MCP SDK.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._exceptions import ToolConfigError

__all__ = ["ServerConfig", "ToolConfig", "load_config", "parse_server"]

_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")
_KNOWN_TYPES = ("stdio", "http", "streamable-http", "streamableHttp")


@dataclass(frozen=True)
class ServerConfig:
    """One entry of ``mcpServers``."""

    name: str
    """Its key in ``mcpServers``: how the chat and ``localllm mcp`` name it."""
    command: str | None = None
    """The program of a stdio server."""
    args: tuple[str, ...] = ()
    """Its arguments."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Variables added to the few it inherits (PATH, HOME, ...: the SDK's safe defaults)."""
    cwd: str | None = None
    """Where it starts (default: where the chat was started)."""
    url: str | None = None
    """The endpoint of a Streamable HTTP server."""
    headers: Mapping[str, str] = field(default_factory=dict)
    """Sent with every HTTP request (an ``Authorization`` header, say)."""
    disabled: bool = False
    """Listed, never started."""
    timeout: float | None = None
    """Seconds each call may take; None: ``LOCALLLM_MCP_TIMEOUT``."""
    start_timeout: float | None = None
    """Seconds the start may take; None: ``LOCALLLM_MCP_TIMEOUT``."""

    @property
    def is_remote(self) -> bool:
        """True for a server reached by URL."""
        return self.url is not None

    def describe(self) -> str:
        """The command line or the URL, for ``localllm mcp list``."""
        if self.url is not None:
            return self.url
        return " ".join([self.command or "", *self.args]).strip()


def _strings(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ToolConfigError(f"{where} must be an object of strings")
    return dict(value)


def check_name(name: str) -> str:
    """``name`` when it can name a server (letters, digits, ``_ - .``), else the error."""
    if not name or not set(name) <= _NAME_CHARS or len(name) > 64:
        raise ToolConfigError(
            f"{name!r} cannot name an MCP server: use up to 64 letters, digits, '_', '-' or '.'"
        )
    return name


def parse_server(name: str, entry: Any) -> ServerConfig:
    """One ``mcpServers`` entry checked; :class:`ToolConfigError` names what is wrong."""
    where = f"server {name!r}"
    check_name(name)
    if not isinstance(entry, dict):
        raise ToolConfigError(f"{where}: the entry must be an object")
    kind = entry.get("type", entry.get("transport"))
    if kind is not None and kind not in _KNOWN_TYPES:
        extra = " (the old SSE transport is not supported: use Streamable HTTP)" * (kind == "sse")
        raise ToolConfigError(f"{where}: type {kind!r} is not stdio or http{extra}")
    command, url = entry.get("command"), entry.get("url", entry.get("serverUrl"))
    if (command is None) == (url is None):
        raise ToolConfigError(f"{where}: give either command (a program) or url")
    if command is not None and (not isinstance(command, str) or not command.strip()):
        raise ToolConfigError(f"{where}: command must be a non-empty string")
    if url is not None and (
        not isinstance(url, str) or not url.startswith(("http://", "https://"))
    ):
        raise ToolConfigError(f"{where}: url must be an http:// or https:// URL")
    args = entry.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ToolConfigError(f"{where}: args must be a list of strings")
    cwd = entry.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise ToolConfigError(f"{where}: cwd must be a string")
    timeout, start_timeout = entry.get("timeout"), entry.get("start_timeout")
    for key, value in (("timeout", timeout), ("start_timeout", start_timeout)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or value <= 0
        ):
            raise ToolConfigError(f"{where}: {key} must be a positive number of seconds")
    disabled = entry.get("disabled", False)
    if not isinstance(disabled, bool):
        raise ToolConfigError(f"{where}: disabled must be true or false")
    return ServerConfig(
        name=name,
        command=command,
        args=tuple(args),
        env=_strings(entry.get("env"), f"{where}: env"),
        cwd=os.path.expanduser(cwd) if cwd else None,
        url=url,
        headers=_strings(entry.get("headers"), f"{where}: headers"),
        disabled=disabled,
        timeout=float(timeout) if timeout is not None else None,
        start_timeout=float(start_timeout) if start_timeout is not None else None,
    )


class ToolConfig:
    """The file's contents: :attr:`servers` checked, the raw JSON kept for rewriting."""

    def __init__(self, path: Path, raw: dict[str, Any]) -> None:
        self.path = path
        """Where it was read from (and is written to)."""
        self._raw = raw
        self.servers: dict[str, ServerConfig] = {}
        """Every server, by name, in the file's order."""
        self.problems: dict[str, str] = {}
        """Entries that cannot be used, by name: why (the others still work)."""
        entries = raw.get("mcpServers", {})
        if not isinstance(entries, dict):
            raise ToolConfigError(f"{path}: mcpServers must be an object of servers")
        for name, entry in entries.items():
            try:
                self.servers[name] = parse_server(name, entry)
            except ToolConfigError as exc:
                self.problems[name] = str(exc)

    def server(self, name: str) -> ServerConfig:
        """The server called ``name``; the error names the ones there are."""
        if name in self.problems:
            raise ToolConfigError(f"{self.path}: {self.problems[name]}")
        if name not in self.servers:
            known = ", ".join(self.servers) or "none yet: add one with `localllm mcp add`"
            raise ToolConfigError(f"no MCP server named {name!r} in {self.path} ({known})")
        return self.servers[name]

    def add(self, name: str, entry: dict[str, Any], *, replace: bool = False) -> ServerConfig:
        """Add (or with ``replace``, change) a server and write the file."""
        server = parse_server(name, entry)
        entries = self._raw.setdefault("mcpServers", {})
        if name in entries and not replace:
            raise ToolConfigError(
                f"an MCP server named {name!r} is already in {self.path} (remove it first, or "
                "give --replace)"
            )
        entries[name] = entry
        self.servers[name] = server
        self.problems.pop(name, None)
        self.save()
        return server

    def remove(self, name: str) -> None:
        """Remove a server and write the file."""
        entries = self._raw.get("mcpServers", {})
        if name not in entries:
            self.server(name)  # the error naming the servers there are
        del entries[name]
        self.servers.pop(name, None)
        self.problems.pop(name, None)
        self.save()

    def save(self) -> None:
        """Write the file atomically (a temporary file renamed over it), readable by its
        owner only: entries may hold tokens in ``env`` or ``headers``."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self._raw, indent=2, ensure_ascii=False) + "\n"
        handle, temporary = tempfile.mkstemp(prefix=".mcp-", dir=self.path.parent)
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                out.write(text)
                out.flush()
                os.fsync(out.fileno())
            os.chmod(temporary, 0o600)
            os.replace(temporary, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise


def load_config(path: Path) -> ToolConfig:
    """The file at ``path``; an empty config when there is none yet."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ToolConfig(path, {"mcpServers": {}})
    except OSError as exc:
        raise ToolConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        raw = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as exc:
        raise ToolConfigError(
            f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    if not isinstance(raw, dict):
        raise ToolConfigError(f"{path} must hold a JSON object with mcpServers")
    return ToolConfig(path, raw)
