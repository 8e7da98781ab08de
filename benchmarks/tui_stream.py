"""Does the TUI slow what it shows? The same answer streamed to the CLI and to the TUI.

One daemon on a temporary home serves SmolLM2-135M with greedy, fixed-length answers (a model
made for the run: temperature 0, ``num_predict`` ``--tokens``). The same question is answered

* by ``localllm run MODEL PROMPT --verbose`` (a subprocess, as a user runs it), and
* by the chat screen of the TUI (``LocalLLMApp.run_test()``, headless, 120x40, in this process),
  streaming as shipped (throttled, ``MessageView.STREAM_REFRESHES_PER_SECOND``) and as before
  (Textual's ``MarkdownStream``: a re-render per piece), each with an empty chat and with a
  long history already on screen (``--history`` earlier messages with Markdown).

Reported per run: the decode rate the daemon measured for that answer (``eval_rate``, what the
TUI shows under it), its ratio to the CLI's (target: at least 0.9), and the TUI's CPU time per
generated token (``time.process_time`` of this process: rendering, parsing, the client), over
the whole answer (sending, the final render included) and while streaming only (first to last
piece), which must not grow with the history. The best of ``--repeat`` runs is kept (the
machine is shared). With a history the prompt is longer, so the daemon decodes more slowly
for every client: compare those runs with each other, not with the CLI's. The last line is one
JSON object: ``cli_tps``, ``tui_tps``,
``tui_vs_cli``, ``tui_cpu_ms_per_token``, ``tui_stream_cpu_ms_per_token``, the same two for
the long chat (``tui_history_...``) and for the old way (``before_...``).

Usage::

    python benchmarks/tui_stream.py [--tokens 200] [--threads N] [--history 24] [--repeat 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _daemon import daemon_env, start_daemon, stop

PROMPT = "Write a long story about a lighthouse keeper and a storm, with a few headings and lists."
MODEL = "stream-bench"


def _env(home: Path, threads: int) -> dict[str, str]:
    env, _ = daemon_env(home, num_parallel=1, num_threads=threads, keep_alive=-1)
    return env


def cli_run(env: dict[str, str]) -> dict[str, float]:
    """``localllm run --verbose``: the daemon's eval rate for the answer and the CLI's CPU."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run(
        [sys.executable, "-m", "localllm", "run", MODEL, PROMPT, "--verbose"],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    rate = re.search(r"eval rate:\s+([0-9.]+) tokens/s", result.stderr.split("prompt eval")[-1])
    count = re.search(r"\neval count:\s+(\d+)", result.stderr)
    if rate is None or count is None:
        raise RuntimeError(f"no timings in the CLI's output:\n{result.stderr}")
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    tokens = int(count.group(1))
    return {"tps": float(rate.group(1)), "tokens": tokens, "cpu_ms_per_token": cpu * 1000 / tokens}


def _history(store: Any, chat_id: int, messages: int) -> None:
    from localllm.tui.chats import StoredMessage

    for index in range(messages // 2):
        store.add_message(chat_id, StoredMessage("user", f"Question {index}?"))
        answer = (
            f"## Answer {index}\n\nSome **bold** words and `code`.\n\n- one\n- two\n\n"
            f"```python\nprint({index})\n```"
        )
        store.add_message(chat_id, StoredMessage("assistant", answer, {"eval_count": 20}))


async def tui_run(env: dict[str, str], data: Path, legacy: bool, history: int) -> dict[str, float]:
    """The chat screen answers once; the daemon's eval rate and this process's CPU per token:
    over the whole answer, and over the streaming alone (first to last piece: the cost that
    must not grow with the answer). ``legacy`` streams as the chat did before: Textual's
    ``MarkdownStream``, a re-render per piece."""
    from textual.widgets import Markdown

    from localllm.client import AsyncClient
    from localllm.settings import Settings
    from localllm.tui.app import LocalLLMApp
    from localllm.tui.chats import DB_NAME, ChatStore
    from localllm.tui.screens.chat import ChatScreen
    from localllm.tui.widgets.message import MessageView

    data.mkdir(parents=True, exist_ok=True)
    store = ChatStore(data / DB_NAME)
    chat = store.create_chat("bench", MODEL)
    _history(store, chat.id, history)
    store.set_meta("current_chat", str(chat.id))
    store.close()

    settings = Settings.from_env(env)
    shipped = MessageView.stream
    if legacy:
        MessageView.stream = lambda view: Markdown.get_stream(view.markdown)  # type: ignore
    app = LocalLLMApp(settings.replace(home=data), client=AsyncClient(settings), autostart=False)
    async with app.run_test(size=(120, 40)) as pilot:
        deadline = time.monotonic() + 120
        while not (isinstance(app.screen, ChatScreen) and app.screen.models):
            if time.monotonic() > deadline:
                raise RuntimeError("the TUI did not connect")
            await pilot.pause(0.05)
        screen = app.screen
        assert isinstance(screen, ChatScreen)
        cpu = time.process_time()
        if not await screen.send(PROMPT):
            raise RuntimeError("the TUI did not send the question")
        view = list(screen.transcript().query(MessageView).filter(".assistant"))[-1]
        # CPU at the first and at the latest piece, polled (the pieces come far slower).
        first: tuple[int, float] | None = None
        last: tuple[int, float] | None = None
        while screen.answering:
            if view.streamed_chunks and (last is None or view.streamed_chunks != last[0]):
                last = (view.streamed_chunks, time.process_time())
                first = first or last
            await asyncio.sleep(0.01)
        cpu = time.process_time() - cpu
        stats = view.stats or {}
    MessageView.stream = shipped  # type: ignore[method-assign]
    if "eval_rate" not in stats:
        raise RuntimeError(f"no timings under the TUI's answer: {stats}")
    tokens = int(stats["eval_count"])
    streaming = 0.0
    if first is not None and last is not None and last[0] > first[0]:
        streaming = (last[1] - first[1]) * 1000 / (last[0] - first[0])
    return {
        "tps": float(stats["eval_rate"]),
        "tokens": tokens,
        "cpu_ms_per_token": cpu * 1000 / tokens,
        "stream_cpu_ms_per_token": streaming,
    }


def _best(runs: list[dict[str, float]]) -> dict[str, float]:
    return max(runs, key=lambda run: run["tps"])


def main() -> int:
    """Run the comparison and print the summary JSON line last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--history", type=int, default=24, help="messages already in the chat")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each case; best kept")
    args = parser.parse_args()

    from localllm.client import Client
    from localllm.settings import Settings
    from localllm.tui.widgets.message import MessageView

    rate = MessageView.STREAM_REFRESHES_PER_SECOND  # as shipped (the runs below change it)
    with tempfile.TemporaryDirectory(prefix="localllm-tui-bench-") as folder:
        home = Path(folder) / "home"
        env = _env(home, args.threads)
        process = start_daemon(env)
        try:
            with Client(Settings.from_env(env)) as client:
                if not client.wait_ready(60):
                    raise RuntimeError("the daemon did not start")
                parameters = {"temperature": 0, "num_predict": args.tokens, "seed": 1}
                for _ in client.create(MODEL, from_="smollm2:135m", parameters=parameters):
                    pass
                client.load(MODEL)
            cli = _best([cli_run(env) for _ in range(args.repeat)])
            print(
                f"CLI  run --verbose        {cli['tps']:7.1f} tok/s  "
                f"{cli['cpu_ms_per_token']:6.2f} ms CPU/token  ({cli['tokens']:.0f} tokens)"
            )
            results: dict[tuple[bool, int], dict[str, float]] = {}
            cases = [(False, 0), (False, args.history), (True, 0), (True, args.history)]
            for number, (legacy, history) in enumerate(cases):
                runs = []
                for attempt in range(args.repeat):
                    data = Path(folder) / f"tui-{number}-{attempt}"
                    runs.append(asyncio.run(tui_run(env, data, legacy, history)))
                best = results[(legacy, history)] = _best(runs)
                mode = "before (per piece)" if legacy else f"throttled {rate:g}/s"
                print(
                    f"TUI  {mode:<18} h={history:<3} {best['tps']:7.1f} tok/s  "
                    f"{best['cpu_ms_per_token']:6.2f} ms CPU/token "
                    f"({best['stream_cpu_ms_per_token']:5.2f} while streaming)  "
                    f"{best['tps'] / cli['tps']:.2f}× the CLI"
                )
        finally:
            stop(process)

    shipped, long_chat = results[(False, 0)], results[(False, args.history)]
    old, old_long = results[(True, 0)], results[(True, args.history)]
    summary = {
        "tokens": args.tokens,
        "threads": args.threads,
        "cli_tps": round(cli["tps"], 2),
        "cli_cpu_ms_per_token": round(cli["cpu_ms_per_token"], 3),
        "tui_tps": round(shipped["tps"], 2),
        "tui_vs_cli": round(shipped["tps"] / cli["tps"], 3),
        "tui_cpu_ms_per_token": round(shipped["cpu_ms_per_token"], 3),
        "tui_stream_cpu_ms_per_token": round(shipped["stream_cpu_ms_per_token"], 3),
        "tui_history_cpu_ms_per_token": round(long_chat["cpu_ms_per_token"], 3),
        "tui_history_stream_cpu_ms_per_token": round(long_chat["stream_cpu_ms_per_token"], 3),
        "before_vs_cli": round(old["tps"] / cli["tps"], 3),
        "before_cpu_ms_per_token": round(old["cpu_ms_per_token"], 3),
        "before_stream_cpu_ms_per_token": round(old["stream_cpu_ms_per_token"], 3),
        "before_history_stream_cpu_ms_per_token": round(old_long["stream_cpu_ms_per_token"], 3),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
