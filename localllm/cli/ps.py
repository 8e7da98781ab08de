"""``localllm ps``: the loaded models with their slots, live decode rate and expiry (``--watch``
refreshes until Ctrl-C); ``ps --all``: those of every worker behind the gateway that
``localllm gateway`` started (see :mod:`localllm.gateway`), or the one named by ``--gateway``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._exceptions import APIError, DaemonUnavailableError
from .._format import human_size, human_until, processor, table, tokens_per_second
from .commands import EXIT_OK
from .common import UsageError, connect, load_settings, parse_time, print_json

if TYPE_CHECKING:
    from ..client import Client

__all__ = [
    "PS_HEADERS",
    "adapter_line",
    "add_ps_arguments",
    "cmd_ps",
    "cmd_ps_all",
    "device_line",
    "fleet_rows",
    "merged_ps",
    "ps_row",
    "ps_rows",
    "threads_line",
]


def add_ps_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``ps`` command's arguments."""
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--watch", "-w", action="store_true", help="refresh until Ctrl-C")
    parser.add_argument(
        "--all", action="store_true", help="every worker behind the gateway (localllm gateway)"
    )
    parser.add_argument(
        "--gateway", metavar="URL", help="with --all: this gateway (default: the one started here)"
    )


# -- ps ----------------------------------------------------------------------------------------


def _split_processor(devices: list[Any]) -> str | None:
    """``40%/60% local/RPC`` for a model split across workers, by layers (output included)."""
    units = {"local": 0, "rpc": 0}
    for device in devices:
        if isinstance(device, dict):
            count = int(device.get("layers") or 0) + (1 if device.get("output") else 0)
            units["rpc" if device.get("kind") == "rpc" else "local"] += count
    total = units["local"] + units["rpc"]
    if not units["rpc"] or not total:
        return None
    local = round(100 * units["local"] / total)
    return f"{local}%/{100 - local}% local/RPC" if local else "100% RPC"


def _until(expires_at: str | None, pinned: bool = False) -> str:
    if pinned:
        return "Forever (pinned)"
    timestamp = parse_time(expires_at)
    if timestamp is None or (expires_at or "").startswith("9999"):
        return "Forever"
    return human_until(timestamp)


def merged_ps(client: Client) -> list[dict[str, Any]]:
    """``/api/ps`` entries with the live rates and slot states of ``/api/stats`` added."""
    loaded = [dict(entry) for entry in client.ps()]
    try:
        stats = {m.get("name"): m for m in client.stats().get("models", [])}
    except APIError:  # a daemon without the stats route: ps alone still helps
        stats = {}
    for entry in loaded:
        live = stats.get(entry.get("name"), {})
        slots = live.get("slots")
        if isinstance(slots, list):
            entry["busy_slots"] = sum(1 for s in slots if s.get("state") != "idle")
        entry["decode_tokens_per_s"] = live.get("decode_tokens_per_s")
        entry["prefill_tokens_per_s"] = live.get("prefill_tokens_per_s")
        if isinstance(live.get("threads"), dict):
            entry["threads"] = live["threads"]
    return loaded


# A change of thread count this recent still gets its line in ``ps`` after it was undone.
_RECENT_CHANGE_S = 60.0


def _threads(entry: Mapping[str, Any]) -> str:
    """``2/2``: the CPU threads decode steps use now, of the runner's own count."""
    threads = entry.get("threads")
    if not isinstance(threads, dict):
        return "-"
    return f"{threads.get('decode', '?')}/{threads.get('max', '?')}"


def threads_line(entry: Mapping[str, Any]) -> str | None:
    """``NAME threads 1/2: CPU busy (...); last 2 → 1 ...`` when the governor holds threads
    back or has changed them; None when it runs with all of them and never changed."""
    threads = entry.get("threads")
    if not isinstance(threads, dict):
        return None
    decode, most = threads.get("decode"), threads.get("max")
    last, last_at = threads.get("last_change"), threads.get("last_change_at")
    recent = isinstance(last_at, int | float) and time.time() - last_at < _RECENT_CHANGE_S
    if decode == most and not (last and recent):
        return None
    line = f"{entry.get('name', '')} threads {decode}/{most}: {threads.get('reason', '')}"
    if last:
        line += f" (last change {last})"
    return line


def ps_row(entry: Mapping[str, Any]) -> list[str]:
    """One loaded model's ``ps`` cells: NAME ID SIZE PROCESSOR CONTEXT SLOTS THREADS TOKENS/S
    PREDICTED (the speed model's decode tokens/s for one stream) UNTIL."""
    busy = entry.get("busy_slots", entry.get("active_requests", 0)) or 0
    total = entry.get("slots")
    rate = entry.get("decode_tokens_per_s")
    predicted = ((entry.get("speed") or {}).get("predicted") or {}).get("decode")
    return [
        str(entry.get("name", "")),
        str(entry.get("digest", ""))[:12],
        human_size(entry.get("size", 0) or 0),
        _split_processor(entry.get("devices") or [])
        or processor(int(entry.get("size", 0) or 0), int(entry.get("size_vram", 0) or 0)),
        str(entry.get("context_length", "")),
        f"{busy}/{total}" if total else "",
        _threads(entry),
        f"{rate:.1f}" if isinstance(rate, int | float) and rate > 0 else "-",
        tokens_per_second(predicted)
        if isinstance(predicted, int | float) and predicted > 0
        else "-",
        _until(entry.get("expires_at"), bool(entry.get("pinned"))),
    ]


PS_HEADERS = (
    "NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "SLOTS", "THREADS", "TOKENS/S", "PREDICTED",
    "UNTIL",
)  # fmt: skip
"""The ``ps`` table's columns, one per cell of :func:`ps_row`."""


def ps_rows(loaded: Sequence[Mapping[str, Any]]) -> str:
    """The ``ps`` table (:data:`PS_HEADERS`), then a line per model whose governor holds
    threads back and per model split across RPC workers."""
    headers = list(PS_HEADERS)
    spans = [line for entry in loaded if (line := threads_line(entry)) is not None]
    spans += [line for entry in loaded if (line := device_line(entry)) is not None]
    spans += [line for entry in loaded if (line := adapter_line(entry)) is not None]
    spans += [line for entry in loaded if (line := fallback_line(entry)) is not None]
    return table(headers, [ps_row(entry) for entry in loaded]) + "".join(
        f"\n{line}" for line in spans
    )


def adapter_line(entry: Mapping[str, Any]) -> str | None:
    """``NAME LoRA 3f2a9c8d0e1f x0.5 (3.7 MB) on the runner of BASE (also serving A, B)``
    for a model with LoRA adapters or on a runner it shares; None otherwise."""
    runner = entry.get("runner")
    if not isinstance(runner, dict):
        return None
    name = str(entry.get("name", ""))
    parts = [
        f"{str(a.get('digest', '')).removeprefix('sha256:')[:12]} x{a.get('scale', 1.0):g} "
        f"({human_size(int(a.get('size', 0) or 0))})"
        for a in entry.get("adapters") or []
    ]
    line = f"{name} LoRA {', '.join(parts)}" if parts else f"{name} no LoRA"
    owner = str(runner.get("loaded_by", name))
    others = [str(m) for m in runner.get("models") or [] if m not in (name, owner)]
    line += " on its own runner" if owner == name else f" on the runner of {owner}"
    if others:
        line += f" (also serving {', '.join(others)})"
    return line


def fallback_line(entry: Mapping[str, Any]) -> str | None:
    """``NAME on the CPU: the GPU failed ...`` for a model the daemon moved off its GPU."""
    fallback = entry.get("gpu_fallback")
    return f"{entry.get('name', '')} on the CPU: {fallback}" if fallback else None


def device_line(entry: Mapping[str, Any]) -> str | None:
    """``NAME spans CPU (local): layers 0-1, RPC0 (host:port): layers 2-3 + output`` for a
    model split across RPC workers; None for one on this machine alone."""
    devices = entry.get("devices")
    if not isinstance(devices, list) or not devices:
        return None
    parts = []
    for device in devices:
        where = device.get("endpoint") or "local"
        layers = int(device.get("layers") or 0)
        first = device.get("first_layer")
        if layers and isinstance(first, int):
            span = f"layer {first}" if layers == 1 else f"layers {first}-{first + layers - 1}"
        else:
            span = "no layers"
        if device.get("output"):
            span = "output" if span == "no layers" else f"{span} + output"
        parts.append(f"{device.get('name', '?')} ({where}): {span}")
    line = f"{entry.get('name', '')} spans " + ", ".join(parts)
    dropped = entry.get("rpc_dropped")
    if dropped:
        line += f"; going without lost worker {', '.join(map(str, dropped))}"
    return line


def _watch_ps(client: Client) -> int:
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    console = Console(highlight=False)
    # Ctrl-C is the way out, and it can land while Live is still starting (after the first
    # render is on screen), so the whole block is inside the handler, not just the loop.
    try:
        with Live(Text(ps_rows(merged_ps(client))), console=console, auto_refresh=False) as live:
            for _ in client.stats_stream(interval=0.5):
                live.update(Text(ps_rows(merged_ps(client))), refresh=True)
    except KeyboardInterrupt:
        pass
    return 0


def cmd_ps(args: argparse.Namespace) -> int:
    """``ps``: loaded models with their slots, live decode tokens/s and expiry (``--all``:
    those of every worker behind the gateway)."""
    if args.all:
        return cmd_ps_all(args)
    with connect() as client:
        if args.watch and not args.json:
            return _watch_ps(client)
        loaded = merged_ps(client)
    if args.json:
        print_json(loaded)
    else:
        print(ps_rows(loaded))
    return 0


# -- ps --all ---------------------------------------------------------------------------------


def _fleet(
    gateway_url: str, api_key: str | None, given: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    """Each worker of the gateway with its health and loaded models (``/api/ps`` plus
    live slots), or the error that kept them from being read. ``given`` are the workers it
    was started with: smg lists a worker only once it registered it, so one that has been
    down since the start is added here as not healthy."""
    from ..client import Client, GatewayClient

    with GatewayClient(gateway_url, api_key=api_key) as gateway:
        workers = gateway.workers()
    listed = {str(w.get("url")) for w in workers}
    workers += [{"url": url, "is_healthy": False, "status": "not registered"} for url in given]
    workers = [w for w in workers if w.get("status") != "not registered" or w["url"] not in listed]
    fleet = []
    for worker in sorted(workers, key=lambda w: str(w.get("url"))):
        url = str(worker.get("url", ""))
        entry: dict[str, Any] = {
            "worker": url,
            "healthy": bool(worker.get("is_healthy")),
            "status": worker.get("status"),
            "gateway_requests": worker.get("load"),
            "models": [],
        }
        if worker.get("status") != "not registered":
            try:
                with Client(base_url=url, api_key=api_key, timeout=5.0) as client:
                    entry["models"] = merged_ps(client)
            except (DaemonUnavailableError, APIError) as exc:
                entry["error"] = str(exc)
        fleet.append(entry)
    return fleet


def fleet_rows(fleet: list[dict[str, Any]]) -> str:
    """The ``ps --all`` table: the ``ps`` columns with the worker (and its state) first."""
    headers = ["WORKER", *PS_HEADERS]
    blank = [""] * (len(PS_HEADERS) - 1)
    rows = []
    for entry in fleet:
        worker = entry["worker"] if entry["healthy"] else f"{entry['worker']} (down)"
        if entry.get("error"):
            rows.append([worker, f"({entry['error']})", *blank])
        elif not entry["models"]:
            rows.append([worker, "(no model loaded)", *blank])
        for model in entry["models"]:
            rows.append([worker, *ps_row(model)])
    return table(headers, rows)


def cmd_ps_all(args: argparse.Namespace) -> int:
    """``ps --all``: every worker of the gateway, with its loaded models and slots."""
    from ..gateway import read_gateway_state

    settings = load_settings()
    url, given = args.gateway, ()
    if url is None:
        state = read_gateway_state(settings)
        if state is None:
            raise UsageError(
                "no gateway runs here: start one with `localllm gateway --worker URL ...`, "
                "or name it with --gateway URL"
            )
        url, given = state.url, state.workers
    fleet = _fleet(url, settings.api_key, given)
    if args.json:
        print_json(fleet)
    else:
        print(fleet_rows(fleet))
    return EXIT_OK
