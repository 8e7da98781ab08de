"""The Ollama API of a real daemon, driven by the official ``ollama`` Python package.

One daemon for the module, on a temporary home with the bundled SmolLM2 (imported as
``smollm2:135m`` on first use) and the tiny test model created through the API.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest
from test_daemon_support import Daemon, running_daemon

SMOL = "smollm2:135m"
FEW = {"num_predict": 8, "temperature": 0}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with running_daemon(
        tmp_path_factory.mktemp("ollama") / "home", num_parallel=4, num_threads=1
    ) as d:
        yield d


@pytest.fixture(scope="module")
def client(daemon: Daemon) -> ollama.Client:
    return ollama.Client(host=daemon.url)


@pytest.fixture(scope="module")
def tiny(client: ollama.Client, tiny_gguf: Path) -> str:
    """The tiny model, created from a GGUF path the daemon can read."""
    client.create(model="tiny:test", from_=str(tiny_gguf))
    return "tiny:test"


def test_list_show_version(client: ollama.Client, daemon: Daemon) -> None:
    names = [m.model for m in client.list().models]
    assert SMOL in names
    shown = client.show(SMOL)
    assert shown.details.family == "llama"
    assert shown.details.quantization_level == "Q4_1"
    assert "completion" in (shown.capabilities or [])
    assert shown.modelinfo["llama.context_length"] == 8192
    assert "stop" in (shown.parameters or "")
    assert shown.modelfile.startswith("# Modelfile")
    with daemon.http() as http:
        assert http.get("/api/version").json()["version"]
        assert http.get("/").text == "localllm is running"


def test_chat_not_streamed_has_timings(client: ollama.Client, daemon: Daemon) -> None:
    response = client.chat(
        model=SMOL, messages=[{"role": "user", "content": "Say hello."}], options=FEW
    )
    assert response.done is True
    assert response.message.role == "assistant"
    assert response.message.content
    assert response.eval_count == 8
    assert response.done_reason == "length"
    assert response.prompt_eval_count > 5
    assert response.total_duration >= response.eval_duration > 0
    # localllm's own fields (the ollama package drops unknown keys, so read them raw)
    with daemon.http() as http:
        body = {"model": SMOL, "messages": [{"role": "user", "content": "Hi"}], "options": FEW}
        extra = http.post("/api/chat", json={**body, "stream": False}).json()
    assert extra["ttft_duration"] > 0
    assert extra["ttft_duration"] <= extra["total_duration"]
    assert extra["prompt_cached_count"] >= 0
    assert extra["prompt_eval_rate"] > 0
    assert extra["eval_rate"] > 0


def test_chat_streamed(client: ollama.Client) -> None:
    chunks = list(
        client.chat(
            model=SMOL,
            messages=[{"role": "user", "content": "Name a colour."}],
            options=FEW,
            stream=True,
        )
    )
    assert all(not c.done for c in chunks[:-1])
    final = chunks[-1]
    assert final.done and final.eval_count == 8
    text = "".join(c.message.content for c in chunks)
    assert text.strip()


def test_greedy_generation_is_repeatable_and_prefix_cached(daemon: Daemon) -> None:
    body = {"model": SMOL, "prompt": "Write one sentence about the sea.", "options": FEW}
    with daemon.http() as http:
        first = http.post("/api/generate", json={**body, "stream": False}).json()
        second = http.post("/api/generate", json={**body, "stream": False}).json()
    assert first["response"] == second["response"]
    assert second["prompt_cached_count"] > 0


def test_mirostat_samples_and_at_no_target_surprise_picks_the_likeliest_token(
    daemon: Daemon,
) -> None:
    prompt = "Write one sentence about the sea."

    def answer(http: httpx.Client, options: dict[str, Any]) -> str:
        body: dict[str, Any] = {"model": SMOL, "prompt": prompt, "stream": False}
        body["options"] = {"num_predict": 12, **options}
        response = http.post("/api/generate", json=body)
        assert response.status_code == 200, response.text
        return str(response.json()["response"])

    with daemon.http() as http:
        answer(http, {"temperature": 0})  # the reference comes from the cached prompt, as below
        greedy = answer(http, {"temperature": 0})
        # Mirostat 2 keeps the tokens less surprising than mu, which starts at 2 x tau = 0 and
        # never rises: only the likeliest token is left, whatever the temperature and seed.
        focused = {"temperature": 1.5, "mirostat": 2, "mirostat_tau": 0, "seed": 7}
        assert answer(http, focused) == greedy
        for version in (1, 2):
            seeded = {"temperature": 1.0, "mirostat": version, "mirostat_tau": 4.0, "seed": 11}
            assert answer(http, seeded) == answer(http, seeded)


def test_every_option_is_honoured_or_refused_by_name(daemon: Daemon) -> None:
    body = {"model": SMOL, "prompt": "Hi", "stream": False}
    with daemon.http() as http:
        refused = (
            ({"mirostat_typo": 1}, "unknown option options.mirostat_typo"),
            ({"tfs_z": 0.5}, "options.tfs_z: only 1.0 is supported"),
            ({"numa": True}, "options.numa: only False is supported"),
            ({"penalize_newline": False}, "options.penalize_newline"),
            ({"mirostat": 3}, "options.mirostat must be between 0 and 2"),
            ({"mirostat_eta": "fast"}, "mirostat_eta"),
        )
        for options, error in refused:
            response = http.post("/api/generate", json={**body, "options": {**FEW, **options}})
            assert response.status_code == 400, (options, response.text)
            assert error in response.json()["error"], response.text
        # Ollama's documented values of the options llama.cpp fixes are what happens anyway;
        # null means "not given".
        honoured = {"tfs_z": 1.0, "penalize_newline": True, "numa": False, "top_k": None}
        response = http.post("/api/generate", json={**body, "options": {**FEW, **honoured}})
        assert response.status_code == 200 and response.json()["done"], response.text
        create = {"model": "numa:test", "from": SMOL, "parameters": {"numa": True}}
        response = http.post("/api/create", json={**create, "stream": False})
        assert response.status_code == 400 and "numa" in response.json()["error"], response.text


def test_generate_streamed_and_stop(client: ollama.Client) -> None:
    options = {"num_predict": 16, "temperature": 0}
    # What this CPU's greedy decoding writes without a stop string is the reference.
    free = client.generate(model=SMOL, prompt="1, 2, 3, 4, 5,", raw=True, options=options)
    pieces = list(
        client.generate(
            model=SMOL,
            prompt="1, 2, 3, 4, 5,",
            raw=True,
            options={**options, "stop": [","]},
            stream=True,
        )
    )
    text = "".join(p.response for p in pieces)
    assert "," not in text
    if "," in free.response:
        assert text == free.response.split(",")[0]
        assert pieces[-1].done_reason == "stop"
    else:
        assert text == free.response
        assert pieces[-1].done_reason == free.done_reason


def test_generate_raw_and_system(client: ollama.Client) -> None:
    raw = client.generate(model=SMOL, prompt="The capital of France is", raw=True, options=FEW)
    assert raw.response
    with_system = client.generate(model=SMOL, prompt="Hi", system="Answer in French.", options=FEW)
    assert with_system.eval_count == 8


def test_format_json_and_schema(client: ollama.Client) -> None:
    answer = client.chat(
        model=SMOL,
        messages=[{"role": "user", "content": "Give a JSON object with a name."}],
        format="json",
        options={"num_predict": 40, "temperature": 0},
    )
    # Grammar-constrained: whatever was generated is the start of a JSON value.
    assert answer.message.content.lstrip()[:1] in ("{", "[", '"', "-", "t", "f", "n", *"0123456789")
    schema = {
        "type": "object",
        "properties": {"age": {"type": "integer"}},
        "required": ["age"],
    }
    answer = client.chat(
        model=SMOL,
        messages=[{"role": "user", "content": "How old is the universe? Reply in JSON."}],
        format=schema,
        options={"num_predict": 60, "temperature": 0},
    )
    data = json.loads(answer.message.content)
    assert isinstance(data["age"], int)


def test_embed_and_legacy_embeddings(client: ollama.Client) -> None:
    result = client.embed(model=SMOL, input=["a cat", "a dog"])
    assert len(result.embeddings) == 2
    norm = sum(x * x for x in result.embeddings[0]) ** 0.5
    assert abs(norm - 1) < 1e-3
    assert result.prompt_eval_count > 0
    legacy = client.embeddings(model=SMOL, prompt="a cat")
    assert len(legacy.embedding) == len(result.embeddings[0])
    short = client.embed(model=SMOL, input="a cat", dimensions=16)
    assert len(short.embeddings[0]) == 16


def test_ps_after_use(client: ollama.Client) -> None:
    client.generate(model=SMOL, prompt="Hi", options=FEW, keep_alive="10m")
    loaded = {m.model: m for m in client.ps().models}
    assert SMOL in loaded
    entry = loaded[SMOL]
    # No num_ctx: the memory plan chose a step up to SmolLM2's trained 8192.
    assert entry.context_length in (4096, 8192)
    assert entry.size > 0
    assert entry.expires_at is not None


def test_copy_delete_create(client: ollama.Client, daemon: Daemon, tiny: str) -> None:
    client.copy(SMOL, "copied:one")
    assert "copied:one" in [m.model for m in client.list().models]
    client.delete("copied:one")
    assert "copied:one" not in [m.model for m in client.list().models]
    with pytest.raises(ollama.ResponseError) as info:
        client.delete("copied:one")
    assert info.value.status_code == 404

    # create from a model, with parameters, a system prompt and messages
    client.create(
        model="smol-pirate",
        from_=SMOL,
        system="You are a pirate.",
        parameters={"temperature": 0, "num_predict": 4},
    )
    shown = client.show("smol-pirate")
    assert "pirate" in shown.modelfile
    answer = client.generate(model="smol-pirate", prompt="Hello")
    assert answer.eval_count == 4  # the model's num_predict parameter applies
    assert tiny in [m.model for m in client.list().models]

    # MESSAGE examples of a model are prepended to every chat
    client.create(
        model="smol-messages",
        from_=SMOL,
        messages=[
            {"role": "user", "content": "My name is Ann."},
            {"role": "assistant", "content": "Hello Ann."},
        ],
    )
    chat = [{"role": "user", "content": "Hi"}]
    plain = client.chat(model=SMOL, messages=chat, options={"num_predict": 1})
    primed = client.chat(model="smol-messages", messages=chat, options={"num_predict": 1})
    assert primed.prompt_eval_count > plain.prompt_eval_count + 5


def test_create_from_uploaded_blob(client: ollama.Client, tiny_gguf: Path) -> None:
    digest = client.create_blob(tiny_gguf)
    assert digest.startswith("sha256:")
    client.create(model="tiny-blob", files={"tiny.gguf": digest}, template=None)
    answer = client.generate(model="tiny-blob", prompt="abc", raw=True, options=FEW)
    assert answer.eval_count == 8


def test_create_with_quantize(client: ollama.Client, tiny: str) -> None:
    statuses = [
        p.status for p in client.create(model="tiny-q8", from_=tiny, quantize="q8_0", stream=True)
    ]
    assert statuses[-1] == "success"
    assert any(s and s.startswith("quantizing") for s in statuses)
    assert client.show("tiny-q8").details.quantization_level == "Q8_0"
    assert client.generate(model="tiny-q8", prompt="abc", raw=True, options=FEW).eval_count == 8
    with pytest.raises(ollama.ResponseError) as info:
        client.create(model="smol-requant", from_=SMOL, quantize="q4_K_M")
    assert info.value.status_code == 400
    assert "only supported for F16, BF16 and F32" in info.value.error


def test_fill_in_the_middle_with_suffix(client: ollama.Client, tiny: str) -> None:
    answer = client.generate(model=tiny, prompt="def f(", suffix="return x", options=FEW)
    assert answer.done
    with pytest.raises(ollama.ResponseError) as info:
        client.generate(model=SMOL, prompt="def f(", suffix="return x", options=FEW)
    assert info.value.status_code == 400
    assert "fill-in-the-middle" in info.value.error


def test_unknown_model_names_pull(client: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as info:
        client.chat(model="nosuchmodel", messages=[{"role": "user", "content": "x"}])
    assert info.value.status_code == 404
    assert "localllm pull" in info.value.error


def test_load_then_keep_alive_zero_unloads(client: ollama.Client, tiny: str) -> None:
    loaded = client.generate(model=tiny, prompt="")
    assert loaded.done_reason == "load"
    assert tiny in [m.model for m in client.ps().models]
    client.generate(model=tiny, prompt="x", raw=True, options=FEW, keep_alive=0)
    assert tiny not in [m.model for m in client.ps().models]
    client.generate(model=tiny, prompt="")
    unloaded = client.generate(model=tiny, prompt="", keep_alive=0)
    assert unloaded.done_reason == "unload"
    assert tiny not in [m.model for m in client.ps().models]


def test_concurrent_streams_from_several_clients(daemon: Daemon) -> None:
    # Isolation of concurrent streams is proven with copied markers in test_runner_smollm2;
    # here: several clients at once each get a whole, well-formed answer of their own. (Equal
    # text between a batched and a lone run is not asserted: near-ties may tip on some CPUs.)
    prompts = ["Name a fruit.", "Name a city.", "Name a fruit.", "Name a river."]
    results: dict[int, tuple[str, int, str | None]] = {}
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            own = ollama.Client(host=daemon.url)
            chunks = list(
                own.chat(
                    model=SMOL,
                    messages=[{"role": "user", "content": prompts[index]}],
                    options={"num_predict": 12, "temperature": 0},
                    stream=True,
                )
            )
            text = "".join(c.message.content for c in chunks)
            results[index] = (text, chunks[-1].eval_count or 0, chunks[-1].done_reason)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors
    assert len(results) == 4
    for text, count, reason in results.values():
        assert reason in ("stop", "length")
        assert 0 < count <= 12
        assert text or reason == "stop"
        if reason == "length":
            assert count == 12


def test_killed_runner_fails_its_request_and_recovers(
    client: ollama.Client, daemon: Daemon
) -> None:
    client.generate(model=SMOL, prompt="")
    pid = next(m for m in daemon.client().ps() if m["model"] == SMOL)["runner_pid"]
    with (
        httpx.Client(base_url=daemon.url, timeout=120) as http,
        http.stream(
            "POST",
            "/api/generate",
            json={"model": SMOL, "prompt": "Tell a long story.", "options": {"num_predict": 4000}},
        ) as response,
    ):
        lines = response.iter_lines()
        first = json.loads(next(lines))
        assert first["done"] is False
        os.kill(pid, signal.SIGKILL)
        rest = [json.loads(line) for line in lines if line]
    assert "error" in rest[-1]
    assert "stopped unexpectedly" in rest[-1]["error"]
    answer = client.generate(model=SMOL, prompt="Hi", options=FEW)
    assert answer.eval_count == 8
    new_pid = next(m for m in daemon.client().ps() if m["model"] == SMOL)["runner_pid"]
    assert new_pid != pid
