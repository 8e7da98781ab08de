"""What the CLI's command modules share: settings, the daemon connection, output helpers.

Every command that needs the daemon gets its client from :func:`connect`, which starts a
daemon in the background first when none answers (:mod:`localllm.autostart`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._exceptions import LocalLLMError

if TYPE_CHECKING:
    from ..client import Client
    from ..settings import Settings

__all__ = [
    "UsageError",
    "connect",
    "file_source",
    "folder_source",
    "load_settings",
    "notice",
    "parse_time",
    "print_json",
    "show_progress",
]


class UsageError(LocalLLMError):
    """A mistake in the command line itself."""


def load_settings() -> Settings:
    """The settings from the environment."""
    from ..settings import Settings

    return Settings.from_env()


def notice(text: str) -> None:
    """A short message for a person watching (stderr, only when it is a terminal)."""
    if sys.stderr.isatty():
        print(text, file=sys.stderr, flush=True)


def connect(settings: Settings | None = None) -> Client:
    """A client for the daemon, started in the background first if none answers; it talks
    over whichever transport (socket or TCP) answered."""
    from ..autostart import ensure_daemon
    from ..client import Client

    settings = settings or load_settings()
    client = Client(settings)
    try:
        ensure_daemon(settings, client=client, on_start=lambda text: notice(f"{text}..."))
    except BaseException:
        client.close()
        raise
    return client


def print_json(data: Any) -> None:
    """Indented JSON on stdout, for scripts."""
    print(json.dumps(data, indent=2, default=str))


def parse_time(text: str | None) -> float | None:
    """A timestamp from the daemon's RFC 3339 time, ``None`` when absent or unreadable."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def show_progress(lines: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """Render the daemon's progress lines (``/api/pull``, ``/api/create``) as bars and status
    lines on stderr; returns the last line."""
    from ..progress_display import ProgressView
    from ..sources.progress import PullProgress

    last: Mapping[str, Any] | None = None
    with ProgressView() as view:
        for line in lines:
            view.update(PullProgress.from_json(line))
            last = line
    return last


def file_source(client: Client, settings: Settings, path: Path) -> dict[str, Any]:
    """The ``/api/create`` source fields for a local GGUF file.

    A daemon on this machine reads the file itself (``from``: its absolute path), which saves
    sending gigabytes through HTTP and hashing them twice; a remote daemon gets the file
    uploaded as a blob first (``files``), as Ollama's CLI always does.
    """
    from ..autostart import is_local

    if path.is_dir():
        return folder_source(client, settings, path)
    if not path.is_file():
        raise UsageError(f"{path}: no such file or folder")
    if is_local(settings):
        return {"from_": str(path.resolve())}
    notice(f"uploading {path.name} to the daemon...")
    digest = client.upload_blob(path)
    return {"files": {path.name: digest}}


def _checkout_files(folder: Path) -> list[Path]:
    """The files of a checkout a conversion reads (weights, config, tokenizer, template),
    hidden folders (``.git``, ``.cache``) and pickles left out."""
    from ..store.safetensors import CHECKPOINT_FILE_SUFFIXES

    found = []
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if any(part.startswith(".") for part in relative.parts) or not path.is_file():
            continue
        if path.suffix.lower() in CHECKPOINT_FILE_SUFFIXES:
            found.append(path)
    return found


def folder_source(client: Client, settings: Settings, folder: Path) -> dict[str, Any]:
    """The ``/api/create`` source fields for a safetensors checkout (a Hugging Face model
    folder), which the daemon converts.

    A daemon on this machine reads the folder itself (``from``: its absolute path) and says
    what is wrong with a folder it cannot convert; a remote daemon gets the folder checked
    here first (no upload of what would be refused: pickles, a missing tokenizer...), then
    its files uploaded as blobs (``files``: name → digest), as Ollama's CLI sends a folder.
    """
    from ..autostart import is_local

    if is_local(settings):
        return {"from_": str(folder.resolve())}
    from ..convert import inspect_folder

    inspect_folder(folder)  # the converter's own error for what it cannot convert
    files: dict[str, str] = {}
    for path in _checkout_files(folder):
        name = path.relative_to(folder).as_posix()
        notice(f"uploading {name} to the daemon...")
        files[name] = client.upload_blob(path)
    return {"files": files}
