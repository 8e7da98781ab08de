"""``localllm search`` and ``localllm show hf.co/<user>/<repo>``: find a model on the Hugging
Face Hub and see, before downloading it, which quantizations fit this machine and how fast each
would run (the daemon asks the Hub and plans: ``/api/search``, ``/api/hub/show``)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._format import human_count, human_since, human_size, table
from .common import UsageError, connect, parse_time, print_json

if TYPE_CHECKING:
    from ..client import Client

__all__ = [
    "add_search_arguments",
    "cmd_search",
    "is_hub_name",
    "render_hub",
    "render_results",
    "show_hub",
]


def _when(text: Any) -> str:
    timestamp = parse_time(str(text)) if text else None
    return human_since(timestamp) if timestamp is not None else "-"


def render_results(models: Sequence[Mapping[str, Any]]) -> str:
    """The search results as a table."""
    rows = [
        [
            str(m.get("name", "")),
            human_count(m.get("parameters")),
            str(m.get("architecture") or "-"),
            f"{m['context_length']:,}" if isinstance(m.get("context_length"), int) else "-",
            human_count(m.get("downloads")),
            human_count(m.get("likes")),
            _when(m.get("last_modified")),
        ]
        for m in models
    ]
    headers = ["NAME", "PARAMS", "ARCH", "CONTEXT", "DOWNLOADS", "LIKES", "UPDATED"]
    return table(headers, rows)


def add_search_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``search`` command's arguments."""
    parser.add_argument("query", nargs="*", metavar="WORDS", help="words the repository name has")
    parser.add_argument(
        "--sort",
        default="downloads",
        metavar="ORDER",
        help="downloads (default), likes, updated, trending or created",
    )
    parser.add_argument("--limit", type=int, default=20, help="results per page (default 20)")
    parser.add_argument("--page", type=int, default=1, help="which page (from 1)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def cmd_search(args: argparse.Namespace) -> int:
    """``search QUERY [--sort S] [--limit N] [--page P]``: GGUF repositories on the Hub."""
    query = " ".join(args.query).strip()
    if args.page < 1 or args.limit < 1:
        raise UsageError("--page and --limit count from 1")
    with connect() as client:
        cursor: str | None = None
        page: dict[str, Any] = {"models": []}
        # The Hub pages with a cursor: page N costs N requests.
        for number in range(args.page):
            page = client.search(query, sort=args.sort, limit=args.limit, cursor=cursor)
            cursor = page.get("next_cursor")
            if cursor is None and number < args.page - 1:
                page = {"models": [], "next_cursor": None}
                break
    if args.json:
        print_json(page)
        return 0
    models = page.get("models") or []
    if not models:
        print(f"no GGUF models on Hugging Face match {query!r}" if query else "no results")
        return 0
    print(render_results(models))
    words = " ".join(args.query)
    if page.get("next_cursor"):
        print(f"\nmore: localllm search {words} --page {args.page + 1}".rstrip())
    print("show one: localllm show hf.co/<user>/<repo> (its quantizations, fit and speed here)")
    return 0


# -- show hf.co/<user>/<repo> --------------------------------------------------------------------


def is_hub_name(text: str) -> bool:
    """True for ``hf.co/...`` (and the other spellings of Hugging Face names)."""
    lowered = text.strip().lower()
    for scheme in ("https://", "http://"):
        lowered = lowered.removeprefix(scheme)
    return lowered.startswith(("hf.co/", "huggingface.co/"))


def _rate(value: Any) -> str:
    return f"{value:.0f}" if isinstance(value, int | float) and value > 0 else "-"


def _shape_mark(quant: Mapping[str, Any]) -> str:
    shapes = str(quant.get("shapes", ""))
    return "" if shapes == "header" else ("~" if shapes == "hub metadata" else "≈")


def _quant_row(quant: Mapping[str, Any]) -> list[str]:
    predicted = quant.get("predicted") or {}
    context = quant.get("context_length")
    slots = quant.get("slots")
    mark = _shape_mark(quant)
    return [
        str(quant.get("label", "")) + (" (split)" if quant.get("split") else ""),
        human_size(int(quant.get("size") or 0)),
        mark + str(quant.get("verdict", "")),
        f"{slots} × {context:,}" if isinstance(context, int) else "-",
        mark + _rate(predicted.get("decode")) if predicted.get("decode") else "-",
        mark + _rate(predicted.get("prefill")) if predicted.get("prefill") else "-",
    ]


def render_hub(data: Mapping[str, Any]) -> str:
    """``/api/hub/show``'s answer for people: the model, then one row per quantization."""
    info = data.get("info") or {}
    facts = [
        str(info.get("architecture") or ""),
        f"{human_count(info.get('parameters'))} parameters" if info.get("parameters") else "",
        f"trained context {info['context_length']:,}"
        if isinstance(info.get("context_length"), int)
        else "",
        f"{human_count(info.get('downloads'))} downloads"
        if info.get("downloads") is not None
        else "",
        f"{human_count(info.get('likes'))} likes" if info.get("likes") is not None else "",
        f"updated {_when(info.get('last_modified'))}" if info.get("last_modified") else "",
    ]
    lines = [f"{data.get('model')}  ({', '.join(f for f in facts if f)})"]
    if info.get("gated"):
        lines.append("  gated: accept its conditions on Hugging Face and set HF_TOKEN to pull it")
    base = (data.get("card") or {}).get("base_model")
    if base:
        lines.append(f"  base model: {', '.join(base) if isinstance(base, list) else base}")
    for projector in data.get("projectors") or []:
        lines.append(
            f"  vision part: {projector['path']} ({human_size(int(projector['size']))}), "
            "pulled with the model"
        )
    converted = [q for q in data.get("quants") or [] if q.get("converted_from")]
    if converted:
        download = human_size(int(converted[0].get("download_size") or 0))
        lines.append(
            f"  safetensors, no GGUF: {download} downloaded, then converted and quantized here "
            "(each size estimated from its config)"
        )
    devices = ", ".join(
        f"{d['name']} {human_size(int(d['free']))} free" for d in data.get("devices") or []
    )
    lines.append(f"  this machine: {devices}")
    quants = data.get("quants") or []
    rows = [_quant_row(q) for q in quants]
    headers = ["QUANT", "SIZE", "FIT", "SLOTS × CONTEXT", "DECODE TOK/S", "PREFILL TOK/S"]
    lines += ["", table(headers, rows), ""]
    header = data.get("header")
    if header and converted:
        lines.append(f"≈ shapes from its config.json, as {header}; the others scaled to their size")
    elif header:
        if any(_shape_mark(q) == "≈" for q in quants):
            lines.append(
                f"≈ from {header}'s GGUF header, scaled to each file's size (show one "
                f"quantization for its own: localllm show {data.get('model')}:<QUANT>)"
            )
    else:
        reason = data.get("header_error") or "no header could be read"
        lines.append(f"~ from the Hub's metadata alone, KV cache not counted ({reason})")
    if data.get("speed_error"):
        lines.append(f"speed not predicted: {data['speed_error']}")
    else:
        unpredicted = [
            (q.get("predicted") or {}).get("why")
            for q in quants
            if q.get("fit") != "none" and not (q.get("predicted") or {}).get("decode")
        ]
        if any(unpredicted):
            lines.append(f"speed not predicted for some: {next(w for w in unpredicted if w)}")
    refused = [q for q in quants if q.get("refusal")]
    for quant in refused[:1]:
        lines.append(f"{quant['label']} does not fit: {quant['refusal']}")
    lines.append(f"pull the best fit: localllm pull {data.get('model')}")
    return "\n".join(lines)


def show_hub(client: Client, args: argparse.Namespace) -> int | None:
    """``show hf.co/<user>/<repo>[:<quant>]`` before downloading; None when the model is in
    the store (and ``--hub`` was not given): the ordinary ``show`` then prints it."""
    from .._exceptions import APIError

    if not getattr(args, "hub", False):
        try:
            client.show(args.model)
            return None
        except APIError as exc:
            if exc.status_code != 404:
                raise
    data = client.hub_show(args.model)
    if args.json:
        print_json(data)
    else:
        print(render_hub(data))
    return 0
