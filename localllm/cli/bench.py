"""``localllm bench MODEL``: the throughput-vs-latency curve of this machine, measured through
the running daemon's public API (started in the background when none answers), optionally side
by side with another server (``--against URL``) or across settings (``--compare KEY=A,B``).

Progress on stderr while it runs (a progress bar at a terminal), then the results tables and
the charts on stdout; ``--json FILE`` writes every sample, ``--report FILE`` an SVG, PNG or
HTML report (matplotlib). Requests that fail are counted in the tables and make the command
exit with status 1 after everything was shown and written. The measuring itself is
:mod:`localllm.bench`; the tables and charts are :mod:`localllm.bench.report`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from .common import UsageError, connect, load_settings

if TYPE_CHECKING:
    from ..bench import BenchResult, Target, Workload
    from ..settings import Settings

__all__ = ["add_bench_arguments", "cmd_bench"]


def _numbers(text: str, what: str) -> list[int]:
    """``1,2,4`` → ``[1, 2, 4]``; ``none`` or empty → ``[]``."""
    if text.strip().lower() in ("", "none", "0", "off"):
        return []
    try:
        values = [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise UsageError(f"{what} wants comma-separated whole numbers, got {text!r}") from None
    if any(v < 1 for v in values):
        raise UsageError(f"{what} must be at least 1, got {text!r}")
    return values


def _count(sub: argparse.ArgumentParser, flag: str, default: int, what: str) -> None:
    """A whole-number option whose help says its default."""
    sub.add_argument(
        flag, type=int, default=default, metavar="N", help=f"{what} (default {default})"
    )


def add_bench_arguments(sub: argparse.ArgumentParser) -> None:
    """The ``bench`` command's arguments."""
    sub.add_argument("model", metavar="MODEL")
    sub.add_argument(
        "--levels",
        metavar="N,N,...",
        # The defaults are localllm.bench's, spelled out: importing it here would slow down
        # every command's start (httpx).
        help="concurrent clients of the concurrency sweep (default 1,2,4,8,16, capped at "
        "twice the model's slots; none: skip)",
    )
    _count(sub, "--prompt-tokens", 128, "prompt length")
    _count(sub, "--answer-tokens", 64, "answer length")
    sub.add_argument(
        "--prompt-lengths",
        metavar="N,N,...",
        help="prompt lengths of the prefill sweep, each cold then cached (default "
        "128,512,1024,2048,4096, capped by the context; none: skip)",
    )
    sub.add_argument(
        "--conversation",
        metavar="USERSxTURNS",
        help="replay a multi-turn conversation trace (e.g. 16x3: 16 users, 3 turns each, all "
        "users at once per turn, a shared system prompt, growing histories) and show TTFT "
        "p50/p95 and throughput per turn; alone it skips the other sweeps unless --levels or "
        "--prompt-lengths ask for them",
    )
    for flag, default, what in (
        ("--system-tokens", 256, "the conversation's shared system prompt"),
        ("--turn-tokens", 48, "each question of the conversation"),
    ):
        sub.add_argument(
            flag,
            type=int,
            metavar="N",
            help=f"tokens of {what} (default {default}; with --conversation)",
        )
    _count(sub, "--rounds", 1, "runs of each level")
    sub.add_argument(
        "--compare",
        metavar="KEY=A,B",
        help="one line per value: a request option (num_ctx, num_batch, num_draft...) on this "
        "daemon, or a daemon setting (kv_cache_type, num_parallel, flash_attention, "
        "speculative...) on a private daemon per value sharing the model files",
    )
    sub.add_argument(
        "--against",
        metavar="URL",
        help="also measure another Ollama- or OpenAI-compatible server, interleaved level by "
        "level, with ratios",
    )
    sub.add_argument("--against-model", metavar="NAME", help="the model's name on that server")
    sub.add_argument(
        "--against-api",
        choices=["auto", "localllm", "ollama", "openai"],
        default="auto",
        help="that server's API (default: ask it)",
    )
    sub.add_argument("--json", metavar="FILE", help="write every sample as one JSON document")
    sub.add_argument("--report", metavar="FILE", help="write the charts: .svg, .png or .html")
    sub.add_argument("--no-plot", action="store_true", help="no charts in the terminal")


def _workload(args: argparse.Namespace) -> Workload:
    from .._exceptions import BenchError
    from ..bench import DEFAULT_LEVELS, DEFAULT_PROMPT_LENGTHS, Workload
    from ..bench.conversation import parse_conversation

    conversation = None
    lengths_given = {
        flag: value
        for flag, value in (
            ("--system-tokens", args.system_tokens),
            ("--turn-tokens", args.turn_tokens),
        )
        if value is not None
    }
    if args.conversation:
        try:
            conversation = parse_conversation(args.conversation)
            if args.system_tokens is not None:
                conversation.system_tokens = args.system_tokens
            if args.turn_tokens is not None:
                conversation.turn_tokens = args.turn_tokens
            conversation.check()
        except BenchError as exc:
            raise UsageError(f"--conversation: {exc}") from None
    elif lengths_given:
        raise UsageError(f"{', '.join(lengths_given)}: only with --conversation")
    # A conversation asked for alone is all that runs; the default sweeps take long.
    levels = list(DEFAULT_LEVELS) if conversation is None else []
    lengths = list(DEFAULT_PROMPT_LENGTHS) if conversation is None else []
    workload = Workload(
        levels=_numbers(args.levels, "--levels") if args.levels else levels,
        prompt_tokens=args.prompt_tokens,
        answer_tokens=args.answer_tokens,
        prompt_lengths=(
            _numbers(args.prompt_lengths, "--prompt-lengths") if args.prompt_lengths else lengths
        ),
        rounds=args.rounds,
        conversation=conversation,
    )
    workload.check()
    return workload


def _label(url: str, taken: set[str]) -> str:
    parts = urlsplit(url if "://" in url else f"http://{url}")
    label = parts.netloc or url
    base, number = label, 2
    while label in taken:
        label, number = f"{base} #{number}", number + 1
    return label


def _progress_printer() -> tuple[Callable[[int, int, str], None], Callable[[], None]]:
    """A progress bar on stderr at a terminal (nothing otherwise); returns the callback and
    a function that removes the bar."""
    if not sys.stderr.isatty():
        return (lambda done, total, what: None), (lambda: None)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    progress = Progress(
        TextColumn("[bold]bench[/bold]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        console=Console(stderr=True),
        transient=True,
    )
    task = progress.add_task("starting", total=None)
    progress.start()

    def update(done: int, total: int, what: str) -> None:
        progress.update(task, completed=done, total=total or None, description=what)

    return update, progress.stop


async def _measure(args: argparse.Namespace, settings: Settings, workload: Workload) -> BenchResult:
    from ..bench import LocalllmDriver, Target, compare_targets, detect_driver, run_bench
    from ..client import AsyncClient

    client = AsyncClient(settings)
    targets: list[Target] = []
    update, stop = _progress_printer()
    try:
        if args.compare:
            update(0, 0, "starting a daemon per setting" if "=" in args.compare else "")
            targets += await compare_targets(args.compare, settings, client, args.model)
        else:
            targets.append(
                Target(label="localllm", driver=LocalllmDriver(client), model=args.model)
            )
        if args.against:
            driver = await detect_driver(args.against, api=args.against_api)
            label = _label(args.against, {t.label for t in targets})
            targets.append(
                Target(label=label, driver=driver, model=args.against_model or args.model)
            )
        return await run_bench(
            targets, workload, on_progress=update, cap_levels=args.levels is None
        )
    finally:
        stop()
        for target in targets:  # run_bench closed them; this covers a failure before it
            if target.daemon is not None:
                await target.daemon.stop()
        await client.close()


def _write_json(path: Path, document: dict[str, Any]) -> None:
    try:
        path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None


def cmd_bench(args: argparse.Namespace) -> int:
    """``bench MODEL``: measure, then print the tables and charts and write the files."""
    from rich.console import Console

    from ..bench import BenchError
    from ..bench.report import print_tables, terminal_plot, write_report
    from .session import ensure_model

    workload = _workload(args)
    report = Path(args.report) if args.report else None
    if report is not None and report.suffix.lower() not in (".svg", ".png", ".html", ".htm"):
        raise UsageError(f"--report wants a .svg, .png or .html file, got {report.name!r}")
    import asyncio  # here, not at the top: it slows the start of every other command

    settings = load_settings()
    with connect(settings) as client:
        ensure_model(client, args.model)
    result = asyncio.run(_measure(args, settings, workload))

    console = Console(highlight=False)
    if not console.is_terminal:  # a file or a pipe: no wrapping at rich's default 80 columns
        console = Console(highlight=False, width=max(120, shutil.get_terminal_size().columns))
    print_tables(result, console)
    if not args.no_plot:
        plot = terminal_plot(result, width=max(60, console.width), color=console.is_terminal)
        if plot:
            console.print()
            print(plot)
    if args.json:
        _write_json(Path(args.json), result.to_json())
    if report is not None:
        try:
            write_report(result, report)
        except OSError as exc:
            raise UsageError(f"cannot write {report}: {exc.strerror or exc}") from None
    if result.failed:
        raise BenchError(f"{result.failed} of {len(result.samples)} requests failed (see above)")
    return 0
