"""``localllm chats``: the terminal UI's saved chats and system prompts from the command line.

``chats list`` lists them (id, messages, model, title), ``chats export ID`` writes the branch
on screen of one as Markdown (``--format md``, the default) or as JSON in OpenAI's messages
shape (``--format json``) to stdout or ``-o FILE``, ``chats search TEXT`` finds messages in
every chat, ``chats prompts`` lists the saved system prompts (``run --system-prompt NAME``).
They read the same database as the terminal UI (:mod:`localllm.chats`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .common import UsageError, load_settings

__all__ = ["add_chats_arguments", "cmd_chats"]


def add_chats_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``chats`` command's arguments."""
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="list the saved chats")
    listing.add_argument("--json", action="store_true", help="as JSON")
    export = actions.add_parser("export", help="write a chat's branch on screen")
    export.add_argument("id", type=int, metavar="ID", help="the chat (`localllm chats list`)")
    export.add_argument(
        "--format",
        choices=["md", "json"],
        default="md",
        help="md: Markdown (default); json: OpenAI chat messages",
    )
    export.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    search = actions.add_parser("search", help="find messages in every chat")
    search.add_argument("text", nargs="+", metavar="TEXT")
    actions.add_parser("prompts", help="list the saved system prompts")


def cmd_chats(args: argparse.Namespace) -> int:
    """``chats list|export|search|prompts``."""
    from ..chats import export_chat, open_store

    with open_store(load_settings()) as store:
        if args.action == "list":
            chats = store.list_chats()
            if args.json:
                rows = [
                    {"id": c.id, "title": c.title, "model": c.model, "messages": len(c.messages)}
                    for c in chats
                ]
                print(json.dumps(rows, indent=2))
                return 0
            print(f"{'ID':>4}  {'MESSAGES':>8}  {'MODEL':<24}  TITLE")
            for c in chats:
                print(f"{c.id:>4}  {len(c.messages):>8}  {c.model or '-':<24}  {c.title}")
        elif args.action == "export":
            text = export_chat(store.chat(args.id), args.format)
            if args.output:
                try:
                    Path(args.output).write_text(text, encoding="utf-8")
                except OSError as exc:
                    raise UsageError(f"cannot write {args.output}: {exc.strerror}") from exc
                print(f"wrote {args.output}", file=sys.stderr)
            else:
                sys.stdout.write(text)
        elif args.action == "search":
            for hit in store.search(" ".join(args.text)):
                print(f"{hit.chat_id:>4}  {hit.title[:24]:<24}  {hit.role:<9}  {hit.snippet}")
        else:
            for prompt in store.list_prompts():
                first = prompt.text.strip().splitlines()[0] if prompt.text.strip() else ""
                print(f"{prompt.name:<20}  {first[:70]}")
    return 0
