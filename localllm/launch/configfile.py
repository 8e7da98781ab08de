"""Editing another program's config file without losing what its user put there.

Each edit reads the file (JSON, JSON with comments, TOML or YAML), changes only the keys
``launch`` owns, and writes the result back only when something changed: atomically (a
temporary file renamed over it, its mode kept), after a backup copy of the old file next to
it (``NAME.localllm-backup-YYYYmmdd-HHMMSS``). What changed comes back as a :class:`Change`
that the launcher prints. A file that cannot be parsed is left alone and the edit fails with
a :class:`~localllm.LaunchError` naming it: nothing is overwritten that could not be read.

TOML and YAML keep their comments and layout (``tomlkit``, ``ruamel.yaml``). JSON files that
hold comments or trailing commas (Zed's and OpenCode's settings allow them) are read with
``json5``; written back as plain JSON, they lose the comments, which the change says, and
the backup keeps them.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._exceptions import LaunchError

__all__ = ["Change", "set_key", "set_keys", "update_json", "update_toml", "update_yaml"]

Edit = Callable[[Any], list[str]]
"""Changes a parsed document in place and says what it changed (one line each)."""


@dataclass
class Change:
    """What an edit did to one file."""

    path: Path
    """The file."""
    changes: list[str] = field(default_factory=list)
    """What was set, one line each (empty: the file already said all of it)."""
    created: bool = False
    """True when the file did not exist before."""
    backup: Path | None = None
    """The copy of the file as it was, when it was changed."""
    note: str | None = None
    """Something the user should know about the rewrite (comments not kept...)."""

    def describe(self) -> str:
        """Lines for the person who ran ``launch``."""
        if not self.changes:
            return f"{self.path}: already set up, left as it was"
        head = f"{self.path}: created" if self.created else f"{self.path}: updated"
        if self.backup is not None:
            head += f" (the old file is in {self.backup.name})"
        lines = [head, *(f"  {line}" for line in self.changes)]
        if self.note:
            lines.append(f"  note: {self.note}")
        return "\n".join(lines)


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def set_key(table: MutableMapping[str, Any], path: list[str], value: Any) -> list[str]:
    """Set ``table[path[0]][path[1]]...`` to ``value``, making the tables on the way; the
    change as a line (none when it already held that value). A non-table in the way is an
    error rather than overwritten."""
    node = table
    for depth, key in enumerate(path[:-1]):
        child = node.get(key)
        if child is None:
            node[key] = {}
            child = node[key]
        elif not isinstance(child, MutableMapping):
            where = ".".join(path[: depth + 1])
            raise LaunchError(f"{where} is a {type(child).__name__}, not a table: fix it by hand")
        node = child
    key = path[-1]
    dotted = ".".join(path)
    if key in node:
        if node[key] == value:
            return []
        old = node[key]
        node[key] = value
        return [f"{dotted}: {_show(old)} -> {_show(value)}"]
    node[key] = value
    return [f"{dotted} = {_show(value)}"]


def set_keys(
    table: MutableMapping[str, Any], path: list[str], values: Mapping[str, Any]
) -> list[str]:
    """:func:`set_key` for each of ``values`` under ``path``; the changes as lines."""
    lines: list[str] = []
    for key, value in values.items():
        lines += set_key(table, [*path, key], value)
    return lines


def _write(path: Path, text: str, original: str | None, change: Change) -> Change:
    """Write ``text`` over ``path`` (unless it is unchanged), backing the old file up."""
    if original is not None and text == original:
        change.changes = []
        return change
    if not change.changes:
        return change
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = None
    if original is not None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        backup = path.with_name(f"{path.name}.localllm-backup-{stamp}")
        shutil.copy2(path, backup)
        change.backup = backup
        mode = path.stat().st_mode & 0o777
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        if mode is not None:
            os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return change


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise LaunchError(f"cannot read {path}: {exc}") from None


def _unreadable(path: Path, exc: Exception) -> LaunchError:
    return LaunchError(
        f"{path} is not valid ({exc}); it was left as it is: fix it or move it away, then "
        "run launch again"
    )


def update_json(path: Path, edit: Edit) -> Change:
    """Apply ``edit`` to the JSON object in ``path`` (created when missing); comments and
    trailing commas are accepted on reading (JSONC, JSON5)."""
    original = _read(path)
    note = None
    data: Any = {}
    if original is not None and original.strip():
        try:
            data = json.loads(original)
        except ValueError:
            import json5

            try:
                data = json5.loads(original)
            except ValueError as exc:
                raise _unreadable(path, exc) from None
            note = "its comments were not kept (they are in the backup)"
        if not isinstance(data, dict):
            raise _unreadable(path, ValueError("the top level is not an object"))
    change = Change(path, edit(data), created=original is None, note=note)
    return _write(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n", original, change)


def update_toml(path: Path, edit: Edit) -> Change:
    """Apply ``edit`` to the TOML document in ``path``, keeping its comments and layout."""
    import tomlkit
    from tomlkit.exceptions import TOMLKitError

    original = _read(path)
    try:
        document = tomlkit.parse(original or "")
    except TOMLKitError as exc:
        raise _unreadable(path, exc) from None
    change = Change(path, edit(document), created=original is None)
    return _write(path, tomlkit.dumps(document), original, change)


def update_yaml(path: Path, edit: Edit, empty: dict[str, Any] | None = None) -> Change:
    """Apply ``edit`` to the YAML mapping in ``path``, keeping its comments and layout;
    a new file starts as ``empty``."""
    import io

    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap
    from ruamel.yaml.error import YAMLError

    yaml = YAML()
    yaml.preserve_quotes = True
    original = _read(path)
    try:
        data = yaml.load(original) if original and original.strip() else None
    except YAMLError as exc:
        raise _unreadable(path, exc) from None
    if data is None:
        data = CommentedMap(empty or {})
    if not isinstance(data, MutableMapping):
        raise _unreadable(path, ValueError("the top level is not a mapping"))
    change = Change(path, edit(data), created=original is None)
    out = io.StringIO()
    yaml.dump(data, out)
    return _write(path, out.getvalue(), original, change)
