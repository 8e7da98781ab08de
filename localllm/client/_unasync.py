"""Writes the synchronous client (``_sync_client.py``) from the asynchronous one
(``_async_client.py``), the way httpcore keeps its twins: the async code is the only source.

Run ``python -m localllm.client._unasync`` after changing ``_async_client.py``;
``--check`` only says whether ``_sync_client.py`` is current (exit status 1 when it is not), and
a test runs that check. The rewrite is word for word (``async def`` → ``def``, ``await`` gone,
``AsyncIterator`` → ``Iterator``, the async transport → the sync one, ...), then ruff sorts its
imports, writes ``yield from`` for loops that only yield, and formats
the result, so the written file reads as if written by hand. Not imported
at run time: it needs ruff, a development tool.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

__all__ = ["SOURCE", "TARGET", "generate", "main"]

SOURCE = Path(__file__).with_name("_async_client.py")
TARGET = Path(__file__).with_name("_sync_client.py")

_RULES = (
    (r"\bAsyncIterator\b", "Iterator"),
    (r"\bAsyncClient\b", "Client"),
    (r"\bAsyncTransport\b", "SyncTransport"),
    (r"\b_async_transport\b", "_sync_transport"),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\basync (def|with|for)\b", r"\1"),
    (r"\bawait ", ""),
)

_DOCSTRING = '''"""The daemon's client, synchronous: :class:`Client`, the twin of
:class:`~localllm.client.AsyncClient` (same constructor, same methods; streaming methods are
iterators).

Written by ``python -m localllm.client._unasync`` from ``_async_client.py``: do not edit this
file; change that one and run the command (a test fails while this file is stale).
"""
'''


def _ruff(args: list[str], text: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--stdin-filename", str(TARGET), "-"],
        input=text,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"ruff {args[0]} failed on the generated client: {result.stderr}")
    return result.stdout


def generate(source: str) -> str:
    """The synchronous client's code from the asynchronous client's ``source``."""
    _, docstring_end = re.match(r'"""(?:.|\n)*?"""\n', source).span()  # type: ignore[union-attr]
    code = source[docstring_end:]
    for pattern, replacement in _RULES:
        code = re.sub(pattern, replacement, code)
    # What reads better without async: sorted imports, ``yield from``.
    fixes = ["--fix", "--unsafe-fixes", "--select", "I,UP028", "--quiet"]
    code = _ruff(["check", *fixes], _DOCSTRING + code)
    return _ruff(["format", "--quiet"], code)


def main(argv: list[str] | None = None) -> int:
    """Write ``_sync_client.py``, or with ``--check`` say whether it is current."""
    parser = argparse.ArgumentParser(prog="python -m localllm.client._unasync")
    parser.add_argument("--check", action="store_true", help="only check that it is current")
    args = parser.parse_args(argv)
    code = generate(SOURCE.read_text(encoding="utf-8"))
    current = TARGET.exists() and TARGET.read_text(encoding="utf-8") == code
    if args.check:
        if not current:
            print(f"{TARGET.name} is stale: run python -m localllm.client._unasync")
        return 0 if current else 1
    if not current:
        TARGET.write_text(code, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
