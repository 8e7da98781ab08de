"""How a :class:`~localllm.bench.BenchResult` is shown: results tables (rows for the CLI and
the TUI alike, drawn with rich for the CLI), plots drawn in
the terminal (``plotext``, a dependency) and a self-contained SVG, PNG or HTML report
(matplotlib, the optional ``report`` extra: ``pip install "localllm[report]"``).

Six charts, one line per target (server or setting), one point per level; a chart without
points (its sweep not run) is left out:

* aggregate tok/s against TTFT p50 — what more concurrency buys, and what it costs a user;
* aggregate tok/s against per-stream tok/s — the same trade seen from one stream;
* TTFT against prompt length, cold and cached (prompt-length sweep);
* prefill tok/s against prompt length (cold requests);
* TTFT p50 and p95 per turn of the conversation trace;
* aggregate tok/s per turn of the conversation trace.
"""

from __future__ import annotations

import html
import io
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from .._exceptions import BenchError
from .._format import human_size
from .run import BenchResult
from .stats import Point

__all__ = [
    "Series",
    "chart_series",
    "marker",
    "point_rows",
    "print_tables",
    "terminal_plot",
    "write_report",
]

_MARKERS = ("•", "x", "+", "o", "*", "#", "@", "%")

Series = tuple[str, list[float], list[float], list[str]]
"""``(label, xs, ys, tags)`` of one line of a chart; a tag names each point's level."""

_CHARTS: tuple[tuple[str, str, str], ...] = (
    ("throughput vs latency", "TTFT p50 (ms)", "aggregate tok/s"),
    ("throughput vs stream speed", "per-stream tok/s", "aggregate tok/s"),
    ("TTFT vs prompt length", "prompt tokens", "TTFT p50 (ms)"),
    ("prefill vs prompt length", "prompt tokens", "prefill tok/s"),
    ("conversation: TTFT per turn", "turn", "TTFT p50, p95 (ms)"),
    ("conversation: throughput per turn", "turn", "aggregate tok/s"),
)


# -- tables ------------------------------------------------------------------------------------


def _num(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{_num(value, 0)} ms"


def _ratio_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}×"


def point_rows(
    result_points: Sequence[Point], ratios: Sequence[Mapping[str, Any]], sweep: str
) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of the results table of one sweep (``concurrency`` or ``prompt``),
    the same for the CLI and the TUI. Failed requests show as ``ok/sent`` and the first
    error; ratios (``vs ref``) as this target ÷ the reference: aggregate tok/s and TTFT p50 in
    the concurrency sweep, prefill tok/s and TTFT p50 in the prompt sweep."""
    by_key = {
        (r["target"], r["sweep"], r["clients"], r["prompt_tokens"], r["cache"]): r for r in ratios
    }
    show_ratio = bool(ratios)
    if sweep == "conversation":
        headers = ["target", "turn", "users", "ok", "TTFT p50", "TTFT p95", "agg tok/s"]
        headers += ["cached", "prompt"]
    elif sweep == "concurrency":
        headers = [
            "target",
            "clients",
            "ok",
            "TTFT p50",
            "TTFT p95",
            "stream tok/s",
            "agg tok/s",
            "queue p50",
            "prefill tok/s",
            "cached",
        ]
    else:
        headers = ["target", "prompt", "cache", "ok", "TTFT p50", "prefill tok/s", "cached"]
    if show_ratio:
        headers.append("vs ref")
    rows = []
    points = [p for p in result_points if p.sweep == sweep]
    order = {"cold": 0, "warm": 1}
    points.sort(key=lambda p: (p.clients, p.prompt_tokens, order.get(p.cache, 2)))
    for point in points:
        ok = f"{point.requests - point.failed}/{point.requests}"
        if sweep == "conversation":
            row = [
                point.target,
                str(point.prompt_tokens),
                str(point.clients),
                ok,
                _ms(point.ttft_p50_ms),
                _ms(point.ttft_p95_ms),
                _num(point.aggregate_tps),
                _num(point.cached_tokens_mean, 0),
                _num(point.prompt_tokens_mean, 0),
            ]
        elif sweep == "concurrency":
            row = [
                point.target,
                str(point.clients),
                ok,
                _ms(point.ttft_p50_ms),
                _ms(point.ttft_p95_ms),
                _num(point.stream_tps_p50),
                _num(point.aggregate_tps),
                _ms(point.queue_ms_p50),
                _num(point.prefill_tps_p50),
                _num(point.cached_tokens_mean, 0),
            ]
        else:
            row = [
                point.target,
                f"{point.prompt_tokens:,}",
                point.cache,
                ok,
                _ms(point.ttft_p50_ms),
                _num(point.prefill_tps_p50),
                _num(point.cached_tokens_mean, 0),
            ]
        if show_ratio:
            ratio = by_key.get(point.key)
            if ratio is None:
                row.append("ref" if not any(r["target"] == point.target for r in ratios) else "-")
            elif sweep == "conversation":
                row.append(
                    " / ".join(
                        _ratio_text(ratio[name])
                        for name in ("ttft_p50_ms", "ttft_p95_ms", "aggregate_tps")
                    )
                )
            elif sweep == "concurrency":
                row.append(
                    f"{_ratio_text(ratio['aggregate_tps'])} / {_ratio_text(ratio['ttft_p50_ms'])}"
                )
            else:
                row.append(
                    f"{_ratio_text(ratio['prefill_tps_p50'])} / {_ratio_text(ratio['ttft_p50_ms'])}"
                )
        rows.append(row)
    return headers, rows


def marker(index: int) -> str:
    """The plot marker of the ``index``-th series (distinct without colour too)."""
    return _MARKERS[index % len(_MARKERS)]


# -- charts ------------------------------------------------------------------------------------


def _series(
    points: Sequence[Point],
    sweep: str,
    x: Callable[[Point], float | None],
    y: Callable[[Point], float | None],
    cache: str | None = None,
) -> list[Series]:
    lines: dict[str, Series] = {}
    for point in points:
        if point.sweep != sweep or (cache is not None and point.cache != cache):
            continue
        xv, yv = x(point), y(point)
        if xv is None or yv is None:
            continue  # a level whose requests all failed has no figures
        line = lines.setdefault(point.target, (point.target, [], [], []))
        line[1].append(float(xv))
        line[2].append(float(yv))
        line[3].append(str(point.clients) if sweep == "concurrency" else "")
    if sweep != "concurrency":  # by length or turn; the concurrency lines go level by level
        for _, xs, ys, tags in lines.values():
            order = sorted(range(len(xs)), key=xs.__getitem__)
            xs[:], ys[:], tags[:] = ([seq[i] for i in order] for seq in (xs, ys, tags))
    return list(lines.values())


def chart_series(points: Sequence[Point]) -> list[list[Series]]:
    """The lines of the four charts (in :data:`_CHARTS` order); empty charts stay empty."""
    ttft_cold = _series(
        points, "prompt", lambda p: p.prompt_tokens, lambda p: p.ttft_p50_ms, "cold"
    )
    ttft_warm = [
        (f"{label} cached", xs, ys, tags)
        for label, xs, ys, tags in _series(
            points, "prompt", lambda p: p.prompt_tokens, lambda p: p.ttft_p50_ms, "warm"
        )
    ]
    return [
        _series(points, "concurrency", lambda p: p.ttft_p50_ms, lambda p: p.aggregate_tps),
        _series(points, "concurrency", lambda p: p.stream_tps_p50, lambda p: p.aggregate_tps),
        ttft_cold + ttft_warm,
        _series(points, "prompt", lambda p: p.prompt_tokens, lambda p: p.prefill_tps_p50, "cold"),
        [
            (f"{label} {which}", xs, ys, tags)
            for which, figure in (("p50", "ttft_p50_ms"), ("p95", "ttft_p95_ms"))
            for label, xs, ys, tags in _series(
                points,
                "conversation",
                lambda p: p.prompt_tokens,
                lambda p, figure=figure: getattr(p, figure),
            )
        ],
        _series(points, "conversation", lambda p: p.prompt_tokens, lambda p: p.aggregate_tps),
    ]


# -- tables ------------------------------------------------------------------------------------


def _table(title: str, headers: list[str], rows: list[list[str]]) -> Table:
    table = Table(title=title, title_justify="left", title_style="bold", box=None, pad_edge=False)
    for index, header in enumerate(headers):
        # The first column (names) and the last (ratios, "1.09× / 1.22×") read badly wrapped.
        edge = index in (0, len(headers) - 1)
        table.add_column(header, justify="left" if index == 0 else "right", no_wrap=edge)
    for row in rows:
        table.add_row(*row)
    return table


def memory_rows(result: BenchResult) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of the memory table: each target's KV cache type, cells and bytes,
    the daemon's size estimate and the runner's resident memory."""
    headers = ["target", "KV type", "KV cells", "KV bytes", "model+KV", "runner RSS"]
    rows = []
    for target in result.targets:
        memory = target.facts.get("memory")
        if not memory:
            continue
        kv_type = str(memory.get("kv_cache_type") or "-")
        if memory.get("kv_cache_type_assumed"):
            kv_type += "?"  # the daemon's setting as this process reads it: likely, not known

        def size(value: Any) -> str:
            return human_size(value) if isinstance(value, int) else "-"

        cells = memory.get("kv_cells")
        rows.append(
            [
                target.label,
                kv_type,
                f"{cells:,}" if isinstance(cells, int) else "-",
                size(memory.get("kv_bytes")),
                size(memory.get("size")),
                size(memory.get("runner_rss")),
            ]
        )
    return headers, rows


def _conversation_title(result: BenchResult) -> str:
    shape = result.workload.conversation
    if shape is None:
        return "Conversation"
    return (
        f"Conversation · {shape.users} users × {shape.turns} turns, a shared "
        f"{shape.system_tokens}-token system prompt, {shape.turn_tokens}-token questions, "
        f"{result.workload.answer_tokens}-token answers"
    )


def print_tables(result: BenchResult, console: Console) -> None:
    """The results tables (concurrency sweep, prompt sweep, memory), then notes and failures."""
    ratios = result.ratios()
    for sweep, title in (
        (
            "concurrency",
            f"Concurrency · {result.workload.prompt_tokens}-token prompts, "
            f"{result.workload.answer_tokens}-token answers",
        ),
        ("prompt", "Prompt length · 1 client, cold then cached"),
        ("conversation", _conversation_title(result)),
    ):
        headers, rows = point_rows(result.points, ratios, sweep)
        if rows:
            console.print(_table(title, headers, rows))
            console.print()
    headers, rows = memory_rows(result)
    if rows:
        console.print(_table("Memory", headers, rows))
        if any(row[1].endswith("?") for row in rows):
            console.print("[dim]?: the daemon's KV type as LOCALLLM_KV_CACHE_TYPE here says[/dim]")
        console.print()
    if len(result.targets) > 1:
        console.print(
            f"[dim]vs ref: this target ÷ {result.targets[0].label} at the same level: aggregate "
            "tok/s / TTFT p50 (concurrency), prefill tok/s / TTFT p50 (prompt length), TTFT "
            "p50 / TTFT p95 / aggregate tok/s (conversation turn)[/dim]"
        )
    for target in result.targets:
        if target.error:
            console.print(f"[yellow]{target.label}: {target.error}[/yellow]")
    for point in result.points:
        if point.failed:
            where = {
                "concurrency": f"{point.clients} clients",
                "conversation": f"conversation turn {point.prompt_tokens}",
            }.get(point.sweep, f"{point.prompt_tokens}-token prompt ({point.cache})")
            console.print(
                f"[red]{point.target}, {where}: {point.failed} of {point.requests} requests "
                f"failed: {'; '.join(point.errors) or 'no answer'}[/red]"
            )
    for note in result.notes:
        console.print(f"[dim]note: {note}[/dim]")


# -- terminal plots ----------------------------------------------------------------------------


def _plot(
    series: list[Series], title: str, xlabel: str, ylabel: str, width: int, height: int, color: bool
) -> list[str]:
    import plotext as plt

    plt.clf()
    plt.plotsize(width, height)
    plt.theme("pro" if color else "clear")
    for index, (label, xs, ys, _) in enumerate(series):
        plt.plot(xs, ys, label=label, marker=marker(index))
    plt.title(title)
    plt.xlabel(xlabel)
    plt.ylabel(ylabel)
    text = plt.build()
    if not color:
        text = plt.uncolorize(text)
    return text.rstrip("\n").splitlines()


def _visible_width(line: str) -> int:
    import plotext as plt

    return len(plt.uncolorize(line))


def terminal_plot(
    result: BenchResult, width: int = 100, height: int = 18, color: bool = False
) -> str:
    """The charts as text for a terminal ``width`` columns wide: two side by side when there
    is room (at least 120 columns), else one under the other. Charts without points are left
    out; empty text when there is nothing to draw. ``color`` keeps plotext's ANSI colours."""
    charts = [
        (chart, series)
        for chart, series in zip(_CHARTS, chart_series(result.points), strict=True)
        if any(xs for _, xs, _, _ in series)
    ]
    if not charts:
        return ""
    side_by_side = width >= 120 and len(charts) > 1
    chart_width = (width - 2) // 2 if side_by_side else width
    drawn = [
        _plot(series, title, xlabel, ylabel, chart_width, height, color)
        for (title, xlabel, ylabel), series in charts
    ]
    blocks: list[str] = []
    step = 2 if side_by_side else 1
    for index in range(0, len(drawn), step):
        group = drawn[index : index + step]
        rows = max(len(lines) for lines in group)
        lines = []
        for row in range(rows):
            parts = []
            for chart in group:
                line = chart[row] if row < len(chart) else ""
                parts.append(line + " " * max(0, chart_width - _visible_width(line)))
            lines.append("  ".join(parts).rstrip())
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


# -- files -------------------------------------------------------------------------------------


def _figure(result: BenchResult) -> Any:
    try:
        import matplotlib
    except ImportError:
        raise BenchError(
            "writing a report needs matplotlib: pip install 'localllm[report]'"
        ) from None
    matplotlib.use("Agg")  # no display: files only
    from matplotlib import pyplot as plt

    charts = [
        (chart, series)
        for chart, series in zip(_CHARTS, chart_series(result.points), strict=True)
        if any(xs for _, xs, _, _ in series)
    ]
    columns = 2 if len(charts) > 1 else 1
    rows = max(1, (len(charts) + columns - 1) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(6.4 * columns, 4.2 * rows), squeeze=False)
    markers = "osD^vP*X"
    for index, ((title, xlabel, ylabel), series) in enumerate(charts):
        ax = axes[index // columns][index % columns]
        for number, (label, xs, ys, tags) in enumerate(series):
            ax.plot(xs, ys, marker=markers[number % len(markers)], label=label)
            for x, y, tag in zip(xs, ys, tags, strict=True):
                if tag:  # the concurrency level next to its point
                    ax.annotate(
                        tag, (x, y), textcoords="offset points", xytext=(4, 4), fontsize="x-small"
                    )
        if xlabel == "prompt tokens":
            lengths = [x for _, xs, _, _ in series for x in xs]
            if lengths and max(lengths) >= 8 * min(lengths):
                ax.set_xscale("log", base=2)  # 128 ... 4096: evenly spaced doublings
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    for index in range(len(charts), rows * columns):
        axes[index // columns][index % columns].axis("off")
    if not charts:
        axes[0][0].text(0.5, 0.5, "no successful requests to plot", ha="center", va="center")
    workload = result.workload
    figure.suptitle(
        f"localllm bench · {result.model} · {workload.prompt_tokens}-token prompts, "
        f"{workload.answer_tokens}-token answers"
    )
    figure.tight_layout()
    return figure


def _html(result: BenchResult, svg: str) -> str:
    ratios = result.ratios()
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>localllm bench · {html.escape(result.model)}</title>",
        "<style>body{font-family:system-ui,sans-serif;margin:2em}"
        "table{border-collapse:collapse;margin:1em 0}"
        "td,th{padding:.2em .8em;text-align:right;border-bottom:1px solid #ddd}"
        "td:first-child,th:first-child{text-align:left}</style></head><body>",
        f"<h1>localllm bench · {html.escape(result.model)}</h1>",
        svg,
    ]
    tables = [
        ("Concurrency sweep", *point_rows(result.points, ratios, "concurrency")),
        ("Prompt-length sweep", *point_rows(result.points, ratios, "prompt")),
        ("Memory", *memory_rows(result)),
    ]
    for title, headers, rows in tables:
        if not rows:
            continue
        parts.append(f"<h2>{html.escape(title)}</h2><table><tr>")
        parts.extend(f"<th>{html.escape(h)}</th>" for h in headers)
        parts.append("</tr>")
        for row in rows:
            parts.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>")
        parts.append("</table>")
    for note in result.notes:
        parts.append(f"<p><em>{html.escape(note)}</em></p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(result: BenchResult, path: Path) -> Path:
    """Write the charts to ``path``: ``.svg`` or ``.png`` (the charts), ``.html`` (the charts
    inline as SVG plus the tables, one self-contained file). Needs matplotlib."""
    suffix = path.suffix.lower()
    if suffix not in (".svg", ".png", ".html", ".htm"):
        raise BenchError(f"--report wants a .svg, .png or .html file, got {path.name!r}")
    figure = _figure(result)
    from matplotlib import pyplot as plt

    try:
        if suffix in (".svg", ".png"):
            figure.savefig(path, format=suffix[1:])
        else:
            buffer = io.StringIO()
            figure.savefig(buffer, format="svg")
            svg = buffer.getvalue()
            svg = svg[svg.find("<svg") :]  # drop the XML prolog: the SVG sits inside HTML
            path.write_text(_html(result, svg), encoding="utf-8")
    finally:
        plt.close(figure)
    return path
