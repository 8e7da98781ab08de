"""``localllm gateway`` on loopback: three real daemons (one thread, one slot each) behind the
real Shepherd Model Gateway (smg), driven by the official openai and anthropic clients.

* Prefix routing: 3 long system prompts, each sent 4 times interleaved. Under ``cache_aware``
  every repeat is served from the prefix cache of the daemon that saw the prompt first (the
  final chunk's ``cached_tokens``); the same workload under ``round_robin`` reuses almost
  nothing (the saved-prefix RAM and disk tiers are off, so a daemon's one slot is its cache).
* A daemon killed mid-stream: its stream ends with an error event, the other daemon's stream
  completes, new requests are served by the others, and once restarted it serves again.
* ``localllm gateway`` names the workers that are down or not localllm in one line;
  ``localllm ps --all`` lists every worker with its models.
* What smg reads from a daemon (``/v1/loads``), the API key, and the API families that pass.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from loopback import serving
from test_daemon_support import Daemon, free_port, running_daemon, start_daemon
from test_fault_support import create_from_file
from tiny_gguf import write_tiny_gguf

from localllm.gateway import (
    Gateway,
    GatewayConfig,
    check_workers,
    describe_problems,
    model_aliases,
)

# Not alone: the cache-aware test's failures beside the suite's other workers (3 of 6 runs
# on two workers, a repeat served with 0 cached tokens) were the engine's decode-cost
# measurement emptying a daemon's one slot after its first request (fixed); since, 9 of 9
# passed as three copies ran at once.
pytestmark = [pytest.mark.slow]

MODEL = "tiny"  # created as tiny:latest; the gateway is told that "tiny" names it
FLEET = {
    "num_parallel": 1,
    "num_threads": 1,
    "context_length": 4096,
    # only the slot's own KV cache: what routing keeps or loses is then all there is
    "kv_cache_ram": 0,
    "kv_cache_disk": 0,
}
LONG = 3000  # tokens of a stream that must run for a while yet end (a second or more here)
OVERLAP = 300  # tokens of a first request that is still streaming when the next is routed
ENDLESS = 50_000  # tokens of a stream that is cut before it ends (the context shifts)
TIMEOUT = 60.0


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model, never ending by itself (only max_tokens ends a generation)."""
    return write_tiny_gguf(tmp_path_factory.mktemp("fleet") / "endless.gguf", never_ends=True)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, gguf: Path) -> Iterator[list[Daemon]]:
    """Three daemons, each with the model; a test may replace one it restarted."""
    root = tmp_path_factory.mktemp("daemons")
    daemons: list[Daemon] = []
    try:
        for i in range(3):
            daemons.append(start_daemon(root / f"d{i}", **FLEET))
            with daemons[-1].http() as http:
                create_from_file(http, MODEL, gguf)
        yield daemons
    finally:
        statuses = [d.stop() for d in daemons]
    assert statuses == [0, 0, 0]


@contextlib.contextmanager
def gateway(
    daemons: Sequence[Daemon],
    policy: str,
    logs: Path,
    api_key: str | None = None,
    load_interval: int = 1,
) -> Iterator[Gateway]:
    """smg in front of ``daemons``, every one of them registered, healthy and its load read
    once."""
    checks = check_workers([d.url for d in daemons], api_key)
    assert all(c.status == "ok" for c in checks), describe_problems(checks)
    config = GatewayConfig(
        workers=tuple(c.url for c in checks),
        port=free_port(),
        metrics_port=free_port(),
        policy=policy,
        api_key=api_key,
        aliases=model_aliases(checks),
        health_interval=1,
        load_interval=load_interval,
        shutdown_grace=1,  # nothing is in flight when a test stops it
    )
    started = Gateway.start(config, logs / f"gateway-{policy}.log")
    try:
        assert started.wait_workers(len(daemons), timeout=TIMEOUT) == len(daemons)
        if load_interval <= 10:  # smg reads a worker's load one interval after registering it
            wait_until(
                lambda: all("engine_load" in w for w in started.client.workers()),
                "smg reads every worker's /v1/loads",
            )
        yield started
    finally:
        assert started.stop() == 0, started.log_tail()


def openai_client(gw: Gateway, api_key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{gw.config.url}/v1", api_key=api_key, max_retries=0, timeout=TIMEOUT
    )


def wait_until(condition: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.1)


def worker_health(gw: Gateway) -> dict[str, bool]:
    return {w["url"]: bool(w["is_healthy"]) for w in gw.client.workers()}


# -- prefix routing ----------------------------------------------------------------------------


def system_prompts(names: Sequence[str]) -> list[str]:
    """Long system prompts (about 600 tokens each) that differ from their first character."""
    return [f"{name}: " + " ".join(f"{name}{i}" for i in range(80)) for name in names]


def interleaved(prompts: Sequence[str], repeats: int) -> list[int]:
    """Which prompt each request carries: every round has each prompt once, in an order
    rotated by one each round (so no worker rotation lines up with the prompts)."""
    count = len(prompts)
    return [(p + r) % count for r in range(repeats) for p in range(count)]


def run_workload(gw: Gateway, prompts: Sequence[str], repeats: int = 4) -> list[dict[str, int]]:
    """Stream each request of :func:`interleaved`; each one's prompt and usage.

    The first round overlaps: each request starts once the one before it streams, so
    whatever the gateway reads about the daemons while it places the new prompts shows the
    busy ones (two prompts sharing a daemon would take turns in its one slot). The other
    rounds go one request at a time.
    """
    client = openai_client(gw)
    order = interleaved(prompts, repeats)

    def start(turn: int, max_tokens: int) -> Any:
        return client.chat.completions.create(
            model=MODEL,
            messages=[
                {"role": "system", "content": prompts[order[turn]]},
                {"role": "user", "content": f"question {turn}"},
            ],
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )

    streams = []
    for turn in range(len(prompts)):
        streams.append(start(turn, OVERLAP))
        next(streams[-1])  # streaming: in flight at the gateway
    streams += [None] * (len(order) - len(prompts))
    results = []
    for turn, stream in enumerate(streams):
        usage = list(stream if stream is not None else start(turn, 2))[-1].usage
        assert usage is not None and usage.prompt_tokens_details is not None
        cached = usage.prompt_tokens_details.cached_tokens or 0
        results.append({"prompt": order[turn], "tokens": usage.prompt_tokens, "cached": cached})
    return results


def cached_share(results: Sequence[dict[str, int]]) -> float:
    return sum(r["cached"] for r in results) / sum(r["tokens"] for r in results)


def test_cache_aware_routing_serves_repeats_from_each_daemons_prefix_cache(
    fleet: list[Daemon], tmp_path: Path
) -> None:
    # A prompt no worker holds goes to the least loaded one: smg scores each daemon by its
    # last load report plus what smg sent it since, and breaks ties at random. The workload
    # starts right after a report (the gateway helper waits for the first one), so the three
    # new prompts are placed within one report interval (5 s): each placement counts against
    # its daemon and the next prompt goes to another. (A report between two placements would
    # clear those counts; run_workload's overlapping first round then still shows the busy
    # daemons in the report.)
    with gateway(fleet, "cache_aware", tmp_path, load_interval=5) as gw:
        aware = run_workload(gw, system_prompts(["alpha", "bravo", "charlie"]))
    with gateway(fleet, "round_robin", tmp_path) as gw:
        rotated = run_workload(gw, system_prompts(["delta", "echo", "foxtrot"]))

    seen: set[int] = set()
    for result in aware:
        if result["prompt"] in seen:
            # a repeat: all of the system prompt comes from the cache, only the turn is new
            assert result["cached"] >= 0.9 * result["tokens"], aware
        else:
            assert result["cached"] < 0.1 * result["tokens"], aware
        seen.add(result["prompt"])
    # round-robin: each daemon's one slot always holds another prompt than the next one
    assert all(r["cached"] < 0.1 * r["tokens"] for r in rotated), rotated
    assert cached_share(aware) > 0.7
    assert cached_share(rotated) < cached_share(aware) / 10


# -- faults ------------------------------------------------------------------------------------


def active(daemon: Daemon) -> int:
    with daemon.http() as http:
        return sum(m["active_requests"] for m in http.get("/api/ps").json()["models"])


def runner_pids(daemon: Daemon) -> list[int]:
    with daemon.http() as http:
        return [m["runner_pid"] for m in http.get("/api/ps").json()["models"]]


def test_a_daemon_killed_mid_stream(fleet: list[Daemon], tmp_path: Path) -> None:
    with gateway(fleet, "round_robin", tmp_path) as gw:
        client = openai_client(gw)
        body: dict[str, Any] = {"model": MODEL, "stream": True}

        doomed = client.chat.completions.create(
            messages=[{"role": "user", "content": "the first long answer"}],
            max_tokens=ENDLESS,
            **body,
        )
        next(doomed)
        (victim,) = [d for d in fleet if active(d)]
        survives = client.chat.completions.create(
            messages=[{"role": "user", "content": "the second long answer"}],
            max_tokens=LONG,
            **body,
        )
        next(survives)
        (survivor,) = [d for d in fleet if d is not victim and active(d)]
        pids = runner_pids(survivor)

        victim.kill()
        with pytest.raises(openai.APIError) as info:
            for _ in doomed:
                pass
        assert "stream" in str(info.value).lower(), info.value  # smg's error event
        chunks = list(survives)
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
        assert finishes[-1] == "length"
        assert runner_pids(survivor) == pids  # nothing on the other daemons was lost

        # new requests go to the others (smg retries a refused connection elsewhere)
        for i in range(4):
            reply = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": f"after {i}"}], max_tokens=3
            )
            assert reply.choices[0].finish_reason == "length"
        wait_until(lambda: not worker_health(gw)[victim.url], "the gateway takes it out")

        # restarted on its address, it takes requests again
        restarted = start_daemon(victim.home, host=victim.env["LOCALLLM_HOST"], **FLEET)
        fleet[fleet.index(victim)] = restarted
        wait_until(lambda: worker_health(gw)[restarted.url], "the gateway takes it back")
        assert runner_pids(restarted) == []
        for i in range(6):
            reply = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": f"back {i}"}], max_tokens=3
            )
            assert reply.choices[0].finish_reason == "length"
        assert len(runner_pids(restarted)) == 1  # it served (round-robin came by)


# -- the command line ----------------------------------------------------------------------------


class _Ollama(BaseHTTPRequestHandler):
    """Answers like an Ollama server: another server on a worker's address."""

    def do_GET(self) -> None:
        body = b"Ollama is running"
        self.send_response(200)
        self.send_header("content-type", "text/plain")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def cli_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCALLLM_")}
    env["LOCALLLM_HOME"] = str(home)
    return env


def test_cli_names_workers_down_or_not_localllm_and_ps_all_lists_the_fleet(
    fleet: list[Daemon], tmp_path: Path
) -> None:
    env = cli_env(tmp_path / "home")
    down = f"http://127.0.0.1:{free_port()}"
    port = free_port()
    with serving(_Ollama) as foreign:
        command = [sys.executable, "-m", "localllm", "gateway", "--health-interval", "1"]
        command += ["--shutdown-grace", "1"]
        for url in (fleet[0].url, down, foreign):
            command += ["--worker", url]
        command += ["--port", str(port), "--metrics-port", str(free_port())]
        process = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert process.stdout is not None and process.stderr is not None
        try:
            warning = process.stderr.readline()
            listening = process.stdout.readline()
        except BaseException:
            process.kill()
            raise
    try:
        assert warning.startswith("Warning: 2 of 3 workers not serving: "), warning
        assert f"{down} is down (" in warning and "it joins when it answers" in warning
        assert f"{foreign} is not localllm (GET / answered HTTP 200: 'Ollama is running'" in (
            warning
        )
        assert listening.startswith(f"gateway listening on http://127.0.0.1:{port} "), listening
        assert "(cache_aware, 1 of 2 workers up)" in listening

        served = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        served.completions.create(model=MODEL, prompt="load it", max_tokens=2)

        def ps_all(*extra: str) -> str:
            done = subprocess.run(
                [sys.executable, "-m", "localllm", "ps", "--all", *extra],
                env=env,
                capture_output=True,
                text=True,
                timeout=TIMEOUT,
            )
            assert done.returncode == 0, done.stderr
            return done.stdout

        listed = {e["worker"]: e for e in json.loads(ps_all("--json"))}
        assert set(listed) == {fleet[0].url, down}
        assert listed[fleet[0].url]["healthy"] is True
        assert [m["name"] for m in listed[fleet[0].url]["models"]] == ["tiny:latest"]
        assert listed[fleet[0].url]["models"][0]["slots"] == 1
        assert listed[down]["healthy"] is False and listed[down]["models"] == []
        table = ps_all()
        assert table.splitlines()[0].split()[:3] == ["WORKER", "NAME", "ID"]
        assert any(
            line.startswith(fleet[0].url) and "tiny:latest" in line for line in table.splitlines()
        )
        assert any(line.startswith(f"{down} (down)") for line in table.splitlines())
    finally:
        process.send_signal(signal.SIGTERM)
        status = process.wait(TIMEOUT)
    assert status == 0, process.stderr.read()
    assert not (tmp_path / "home" / "run" / "gateway.json").exists()
    # no gateway now: ps --all says how to start one
    done = subprocess.run(
        [sys.executable, "-m", "localllm", "ps", "--all"],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 1 and "localllm gateway --worker" in done.stderr


def test_gateway_refuses_to_listen_beyond_loopback_without_a_key(
    fleet: list[Daemon], tmp_path: Path
) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "localllm",
            "gateway",
            "--worker",
            fleet[0].url,
            "--host",
            "0.0.0.0",
        ],
        env=cli_env(tmp_path / "home"),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 1
    assert "refusing to listen on 0.0.0.0" in done.stderr and "--api-key" in done.stderr


# -- what smg reads, the key, the API families ---------------------------------------------------


def test_daemon_reports_its_load_and_the_gateway_reads_it(
    fleet: list[Daemon], tmp_path: Path
) -> None:
    daemon = fleet[1]
    with daemon.http() as http:
        started = http.post(
            "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 1}
        )
        assert started.status_code == 200, started.text
        idle = http.get("/v1/loads", params={"include": "core,disagg,queues,memory"}).json()
        assert idle["dp_rank_count"] == 1 and len(idle["loads"]) == 1
        snapshot = idle["loads"][0]
        assert snapshot["max_running_requests"] == 1  # one slot
        assert snapshot["num_running_reqs"] == 0 and snapshot["num_waiting_reqs"] == 0
        assert snapshot["max_total_num_tokens"] >= FLEET["context_length"]

        body = {"model": MODEL, "prompt": "busy", "max_tokens": ENDLESS, "stream": True}
        with http.stream("POST", "/v1/completions", json=body) as stream:
            lines = stream.iter_lines()  # kept: dropping it would close the stream
            assert next(lines).startswith("data: ")
            busy = http.get("/v1/loads").json()["loads"][0]
        assert busy["num_running_reqs"] == 1 and busy["utilization"] == 1.0, busy
        assert 0 < busy["token_usage"] <= 1

        bad = http.get("/v1/loads", params={"include": "core,gpu"})
        assert bad.status_code == 400
        assert bad.json()["error"]["param"] == "include" and "gpu" in bad.json()["error"]["message"]

    with gateway(fleet, "power_of_two", tmp_path) as gw:

        def reported() -> bool:
            loads = {w["url"]: w.get("engine_load") for w in gw.client.workers()}
            entry = loads.get(daemon.url) or {}
            return bool(entry.get("loads")) and entry["loads"][0]["max_running_requests"] == 1

        wait_until(reported, "smg shows the daemon's own load figures")


def test_api_key_goes_to_the_workers_and_is_required_from_clients(
    tmp_path: Path, gguf: Path
) -> None:
    with running_daemon(tmp_path / "keyed", api_key="sekret", **FLEET) as daemon:
        with daemon.http(headers={"Authorization": "Bearer sekret"}) as http:
            create_from_file(http, MODEL, gguf)
        (check,) = check_workers([daemon.url])
        assert check.status == "refused" and "401" in check.detail
        with gateway([daemon], "cache_aware", tmp_path, api_key="sekret") as gw:
            with pytest.raises(openai.AuthenticationError):
                openai_client(gw, "wrong").chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
                )
            bare = httpx.post(
                f"{gw.config.url}/v1/chat/completions",
                json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
                timeout=TIMEOUT,
            )
            assert bare.status_code == 401
            # the daemon refuses requests without the key: this answer went through with it
            reply = openai_client(gw, "sekret").chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
            assert reply.choices[0].finish_reason == "length"


def test_api_families_that_pass_through(fleet: list[Daemon], tmp_path: Path) -> None:
    with gateway(fleet, "round_robin", tmp_path) as gw:
        client = openai_client(gw)
        assert "tiny:latest" in [m.id for m in client.models.list()]
        chat = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
        assert chat.choices[0].finish_reason == "length" and chat.usage is not None
        assert chat.usage.completion_tokens == 3
        # greedy, so that every daemon (round-robin sends each request to the next) says the same
        text = client.completions.create(model=MODEL, prompt="once", max_tokens=3, temperature=0)
        assert text.choices[0].finish_reason == "length"
        streamed = list(
            client.completions.create(
                model=MODEL, prompt="once", max_tokens=3, temperature=0, stream=True
            )
        )
        assert "".join(c.choices[0].text for c in streamed if c.choices) == text.choices[0].text
        vectors = client.embeddings.create(model=MODEL, input=["one", "two"])
        assert [len(v.embedding) for v in vectors.data] == [256, 256]

        messages = anthropic.Anthropic(base_url=gw.config.url, api_key="unused", max_retries=0)
        message = messages.messages.create(
            model=MODEL, max_tokens=3, messages=[{"role": "user", "content": "hi"}]
        )
        assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 3
        with messages.messages.stream(
            model=MODEL, max_tokens=3, messages=[{"role": "user", "content": "hi"}]
        ) as stream:
            final = stream.get_final_message()
        assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 3

        # Ollama's own routes are not a gateway's: smg answers 404 for them
        ollama = httpx.post(f"{gw.config.url}/api/chat", json={"model": MODEL}, timeout=TIMEOUT)
        assert ollama.status_code == 404
