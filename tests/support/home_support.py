"""A fresh home that already holds the starter model, as a daemon's first start leaves it.

A daemon's first start on an empty home imports the starter (98 MB copied, SHA-256-hashed and
fsynced: seconds on a busy 2-core machine), and the suite starts about ninety daemons on fresh
homes. :func:`seed_home` gives such a home the starter the way the daemon would have imported
it, from a template built once per test run by the same code (:func:`localllm.starter.
ensure_starter`): the blobs hard-linked (a blob is immutable: the store writes a new file and
renames it, never into an existing one, and removes by unlinking), the manifest and the
import marker copied, the lock files left out (a lock is per home: the daemon makes its own).
A test about the first start itself passes ``seed=False`` to the fixtures.
"""

from __future__ import annotations

import atexit
import errno
import os
import shutil
import tempfile
from pathlib import Path

from localllm.starter import ensure_starter
from localllm.store.store import Store

__all__ = ["seed_home", "starter_template"]

_template: Path | None = None


def starter_template() -> Path:
    """A data root holding only the starter, built on first use and removed at exit."""
    global _template
    if _template is None:
        folder = Path(tempfile.mkdtemp(prefix="localllm-starter-"))
        atexit.register(shutil.rmtree, folder, True)
        root = folder / "home"
        ensure_starter(Store(root))
        _template = root
    return _template


def _is_lock(relative: Path) -> bool:
    return relative.name == ".lock" or relative.parts[0] == "locks"


def seed_home(home: Path) -> bool:
    """Give ``home`` the starter when it is a new home (absent or an empty folder) on the file
    system of the template; True when it did. Any other home is left as the test made it."""
    try:
        if home.exists() and (not home.is_dir() or any(home.iterdir())):
            return False
        home.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False  # a home that cannot be made is a case the test checks
    template = starter_template()
    if os.stat(template).st_dev != os.stat(home).st_dev:
        return False  # a small disk of the test's own: the daemon imports (or fails) there
    made: list[Path] = []
    try:
        for source in sorted(template.rglob("*")):
            relative = source.relative_to(template)
            if _is_lock(relative):
                continue
            target = home / relative
            if source.is_dir():
                target.mkdir()
            elif relative.parts[0] == "blobs":
                os.link(source, target)
            else:
                shutil.copyfile(source, target)
            made.append(target)
    except OSError as exc:
        # Undo, so that the daemon finds the empty home the test gave it.
        for path in reversed(made):
            if path.is_dir():
                path.rmdir()
            else:
                path.unlink()
        if exc.errno in (errno.EXDEV, errno.ENOSPC, errno.EMLINK, errno.EPERM):
            return False
        raise
    return True
