"""``localllm.client`` against a real daemon: both transports, sync and async, every route."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_daemon_support import Daemon, free_port, running_daemon, wait_for_stats

from localllm._exceptions import APIError, DaemonUnavailableError
from localllm.client import AsyncClient, Client
from localllm.settings import Settings

SMOL = "smollm2:135m"
FEW = {"num_predict": 4, "temperature": 0}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    home = tmp_path_factory.mktemp("client") / "home"
    with running_daemon(home, num_parallel=2, num_threads=1) as d:
        yield d


@pytest.fixture(scope="module")
def client(daemon: Daemon) -> Iterator[Client]:
    with daemon.client() as c:
        yield c


def test_socket_by_default_tcp_when_asked(daemon: Daemon, client: Client) -> None:
    assert client.address == str(daemon.settings.socket_path)
    with daemon.client(use_tcp=True) as tcp:
        assert tcp.address == daemon.url
        assert tcp.version() == client.version()
    with Client(base_url=daemon.url) as explicit:
        assert explicit.is_running()


def test_it_finds_the_daemon_on_the_transport_that_answers(daemon: Daemon, tmp_path: Path) -> None:
    """Without a transport given, the socket and the TCP address are tried in turn."""
    closed = f"127.0.0.1:{free_port()}"
    # LOCALLLM_HOST names a port where nothing listens: this home's socket answers instead.
    with Client(daemon.settings.replace(host=closed)) as client:
        assert client.is_running()
        assert client.address == str(daemon.settings.socket_path)
        assert client.list_models()
    # No LOCALLLM_HOME, XDG_RUNTIME_DIR naming another place (another shell's environment):
    # no socket there, so the daemon is found on its TCP address.
    elsewhere = Settings.from_env({"XDG_RUNTIME_DIR": str(tmp_path)})
    elsewhere = elsewhere.replace(host=daemon.settings.host)
    assert not elsewhere.host_from_env and elsewhere.home is None
    with Client(elsewhere) as client:
        assert client.version()  # the first call looks for it
        assert client.address == daemon.url

    async def scenario() -> tuple[bool, str]:
        async with AsyncClient(elsewhere) as client:
            return await client.is_running(), client.address

    assert asyncio.run(scenario()) == (True, daemon.url)
    # Nothing answering anywhere: one error naming every place tried.
    nowhere = Settings.from_env({"XDG_RUNTIME_DIR": str(tmp_path)}).replace(host=closed)
    with Client(nowhere) as client, pytest.raises(DaemonUnavailableError) as info:
        client.ps()
    assert str(tmp_path) in str(info.value) and closed in str(info.value)


def test_models_routes(client: Client, tiny_gguf: Path) -> None:
    assert SMOL in [m["name"] for m in client.list_models()]
    assert client.show(SMOL)["details"]["family"] == "llama"
    digest = client.upload_blob(tiny_gguf)
    assert client.blob_exists(digest)
    assert client.upload_blob(tiny_gguf) == digest  # second upload is skipped
    statuses = [line["status"] for line in client.create("tiny:client", files={"t.gguf": digest})]
    assert statuses[-1] == "success"
    client.copy("tiny:client", "tiny:copy")
    client.delete("tiny:copy")
    with pytest.raises(APIError) as info:
        client.show("tiny:copy")
    assert info.value.status_code == 404
    assert "localllm pull" in info.value.message


def test_generation_routes(client: Client) -> None:
    whole = client.generate(SMOL, "Hi", options=FEW)
    assert whole["eval_count"] == 4 and whole["ttft_duration"] > 0
    chunks = list(client.chat_stream(SMOL, [{"role": "user", "content": "Hi"}], options=FEW))
    assert chunks[-1]["done"] and chunks[-1]["eval_count"] == 4
    answer = client.chat(SMOL, [{"role": "user", "content": "Hi"}], options=FEW)
    assert answer["message"]["content"] == "".join(c["message"]["content"] for c in chunks)
    assert len(client.embed(SMOL, ["a", "b"])["embeddings"]) == 2
    assert client.embeddings(SMOL, "a")
    assert client.load(SMOL)["done_reason"] == "load"
    assert SMOL in [m["name"] for m in client.ps()]
    assert client.unload(SMOL)["done_reason"] == "unload"
    assert SMOL not in [m["name"] for m in client.ps()]


def test_a_load_takes_the_options_its_requests_will_send(client: Client) -> None:
    # num_ctx shapes the runner: loaded with it, the chat that follows finds it as it wants
    assert client.load(SMOL, options={"num_ctx": 512})["done_reason"] == "load"
    (loaded,) = [m for m in client.ps() if m["name"] == SMOL]
    assert loaded["context_length"] == 512
    client.chat(SMOL, [{"role": "user", "content": "Hi"}], options={**FEW, "num_ctx": 512})
    (again,) = [m for m in client.ps() if m["name"] == SMOL]
    assert again["runner_pid"] == loaded["runner_pid"]  # not loaded again
    assert client.unload(SMOL)["done_reason"] == "unload"


def test_openai_routes(client: Client) -> None:
    assert SMOL in [m["id"] for m in client.openai_models()]
    assert client.openai_model(SMOL)["id"] == SMOL
    body = {"model": SMOL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
    assert client.openai_chat(body)["usage"]["completion_tokens"] == 3
    chunks = list(client.openai_chat_stream(body))
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    completion = {"model": SMOL, "prompt": "Hello", "max_tokens": 3}
    assert client.openai_completion(completion)["choices"][0]["text"]
    assert list(client.openai_completion_stream(completion))
    vectors = client.openai_embeddings({"model": SMOL, "input": "x", "encoding_format": "float"})
    assert vectors["data"][0]["embedding"]


def test_metrics_and_stats(client: Client) -> None:
    client.generate(SMOL, "Hi", options=FEW)
    text = client.metrics()
    assert 'localllm_generated_tokens_total{model="smollm2:135m"}' in text
    assert "localllm_time_to_first_token_seconds_bucket" in text
    assert "localllm_queue_depth" in text
    engine = {
        sample.labels["part"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "localllm_engine_seconds" and sample.labels["model"] == SMOL
    }
    assert set(engine) == {"decode", "step", "idle", "other"}
    assert engine["decode"] > 0 and engine["step"] > 0
    snapshot = client.stats()
    assert snapshot["models"][0]["slots_total"] == 2
    first = next(client.stats_stream(interval=0.1))
    assert "queue_depth" in first


def test_stats_show_a_decoding_slot_while_streaming(daemon: Daemon, client: Client) -> None:
    stream = client.generate_stream(SMOL, "1, 2, 3, 4, 5,", raw=True, options={"temperature": 0})
    try:
        assert next(stream)["done"] is False
        snapshot = wait_for_stats(
            daemon,
            lambda s: any(
                slot["state"] == "decode" and m.get("decode_tokens_per_s", 0) > 0
                for m in s["models"]
                for slot in m.get("slots", [])
            ),
        )
        model = next(m for m in snapshot["models"] if m["name"] == SMOL)
        assert model["active_requests"] == 1
        assert model["kv_cells_used"] > 0
    finally:
        stream.close()


def test_pull_streams_progress(client: Client) -> None:
    # The starter model is pulled from its package: no network.
    client.copy(SMOL, "keep:smol")  # keeps the blobs, so deleting the name is cheap
    client.delete(SMOL)
    lines = list(client.pull(SMOL))
    assert lines[0]["status"] == "pulling manifest"
    assert lines[-1]["status"] == "success"
    assert SMOL in [m["name"] for m in client.list_models()]
    with pytest.raises(APIError) as info:
        list(client.pull("bad name!"))
    assert info.value.status_code == 400


def test_async_client_stream_and_cancel(daemon: Daemon) -> None:
    async def scenario() -> tuple[str, int]:
        async with AsyncClient(daemon.settings) as client:
            chunks = [
                c
                async for c in client.chat_stream(
                    SMOL, [{"role": "user", "content": "Hi"}], options=FEW
                )
            ]
            text = "".join(c["message"]["content"] for c in chunks)
            # leave a long stream after its first chunk: the daemon cancels it
            stream = client.generate_stream(
                SMOL, "1, 2, 3, 4, 5,", raw=True, options={"temperature": 0}
            )
            first = await anext(stream)
            assert first["done"] is False
            await stream.aclose()
            models = await client.ps()
            return text, len(models)

    text, loaded = asyncio.run(scenario())
    assert text and loaded == 1
    # the cancelled request's slot is given back
    wait_for_stats(
        daemon,
        lambda s: (
            all(slot["state"] == "idle" for m in s["models"] for slot in m.get("slots", []))
            and all(m["active_requests"] == 0 for m in s["models"])
        ),
    )


def test_async_tcp_connections_start_no_task_that_could_cancel_the_caller(daemon: Daemon) -> None:
    # anyio's connect_tcp races its attempts in helper tasks and cancels their scope when one
    # wins; on Python 3.11 that cancellation can reach the calling task afterwards (a TUI worker
    # died of it, and a CI run). The client's own transport connects in the calling task alone.
    async def scenario() -> tuple[list[str], int]:
        loop = asyncio.get_running_loop()
        started: list[str] = []

        def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
            started.append(getattr(coro, "__qualname__", repr(coro)))
            return asyncio.Task(coro, loop=loop, **kwargs)

        loop.set_task_factory(factory)
        async with AsyncClient(daemon.settings, use_tcp=True) as client:
            for _ in range(3):
                await client.close()  # a new connection each time
                assert await client.is_running()
        task = asyncio.current_task()
        assert task is not None
        return list(started), task.cancelling()

    started, cancelling = asyncio.run(scenario())
    assert started == [] and cancelling == 0
