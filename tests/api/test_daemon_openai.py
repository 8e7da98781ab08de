"""The OpenAI API of a real daemon, driven by the official ``openai`` Python package."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from test_daemon_support import Daemon, running_daemon

from localllm.client import Client

SMOL = "smollm2:135m"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Daemon]:
    home = tmp_path_factory.mktemp("openai") / "home"
    with running_daemon(home, num_parallel=2, num_threads=1) as d:
        list(Client(d.settings).create("tiny:fim", from_=str(tiny_gguf)))
        yield d


@pytest.fixture(scope="module")
def client(daemon: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="unused", max_retries=0)


def test_models(client: openai.OpenAI) -> None:
    ids = [m.id for m in client.models.list()]
    assert SMOL in ids and "tiny:fim" in ids
    assert client.models.retrieve(SMOL).id == SMOL
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("missing-model")
    assert "localllm pull" in info.value.message


def test_chat_completion_with_usage(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model=SMOL,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        max_tokens=6,
        temperature=0,
        seed=1,
    )
    choice = completion.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason == "length"
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 6
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + 6


def test_chat_completion_streamed_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=SMOL,
        messages=[{"role": "user", "content": "Name a planet."}],
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 6
    # the same greedy request, not streamed, says the same
    whole = client.chat.completions.create(
        model=SMOL,
        messages=[{"role": "user", "content": "Name a planet."}],
        max_tokens=6,
        temperature=0,
    )
    assert whole.choices[0].message.content == text


def test_stop_and_penalties(client: openai.OpenAI) -> None:
    # What this CPU's greedy decoding writes without a stop string is the reference.
    free = client.completions.create(model=SMOL, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0)
    completion = client.completions.create(
        model=SMOL,
        prompt="1, 2, 3, 4,",
        max_tokens=12,
        temperature=0,
        stop=[","],
    )
    text = completion.choices[0].text
    assert "," not in text
    if "," in free.choices[0].text:
        assert text == free.choices[0].text.split(",")[0]
        assert completion.choices[0].finish_reason == "stop"
    else:
        assert text == free.choices[0].text
        assert completion.choices[0].finish_reason == free.choices[0].finish_reason
    penalised = client.completions.create(
        model=SMOL,
        prompt="1, 2, 3, 4,",
        max_tokens=4,
        temperature=0,
        presence_penalty=1.5,
        frequency_penalty=1.5,
    )
    assert penalised.usage is not None and penalised.usage.completion_tokens == 4


def test_llama_server_sampling_fields_are_honoured_not_ignored(
    client: openai.OpenAI, daemon: Daemon
) -> None:
    """``repeat_penalty`` and friends (llama-server's and vLLM's extensions) change the answer
    exactly as the same Ollama options do: the reference is /api/generate in the same run."""
    prompt = "red, red, red, red,"
    fields = {"repeat_penalty": 1.0, "repeat_last_n": 16, "top_k": 1, "min_p": 0.0}
    completion = client.completions.create(
        model=SMOL, prompt=prompt, max_tokens=16, temperature=0, extra_body=fields
    )
    with Client(daemon.settings) as ollama:
        reference = ollama.generate(
            SMOL,
            prompt,
            raw=True,
            options={"num_predict": 16, "temperature": 0, **fields},
        )
    assert completion.choices[0].text == reference["response"]
    with pytest.raises(openai.BadRequestError, match="mirostat"):
        client.completions.create(
            model=SMOL, prompt=prompt, max_tokens=4, extra_body={"mirostat": 7}
        )


def test_response_format_json_schema(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"colour": {"type": "string", "maxLength": 12}},
        "required": ["colour"],
        "additionalProperties": False,
    }
    completion = client.chat.completions.create(
        model=SMOL,
        messages=[{"role": "user", "content": "Your favourite colour, as JSON."}],
        max_tokens=40,
        temperature=0,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "colour", "schema": schema},
        },
    )
    data = json.loads(completion.choices[0].message.content or "")
    assert isinstance(data["colour"], str)


def test_completion_with_suffix_streamed(client: openai.OpenAI) -> None:
    whole = client.completions.create(
        model="tiny:fim", prompt="def add(a, b):", suffix="return c", max_tokens=8, temperature=0
    )
    assert whole.choices[0].finish_reason in ("length", "stop")
    stream = client.completions.create(
        model="tiny:fim",
        prompt="def add(a, b):",
        suffix="return c",
        max_tokens=8,
        temperature=0,
        stream=True,
    )
    text = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
    assert text == whole.choices[0].text


def test_embeddings_float_and_base64(client: openai.OpenAI) -> None:
    # The SDK asks for base64 by default and decodes it itself.
    result = client.embeddings.create(model=SMOL, input=["one", "two"])
    assert [d.index for d in result.data] == [0, 1]
    vector = result.data[0].embedding
    assert abs(sum(x * x for x in vector) ** 0.5 - 1) < 1e-3
    floats = client.embeddings.create(model=SMOL, input="one", encoding_format="float")
    assert floats.data[0].embedding == pytest.approx(vector, abs=1e-5)
    assert result.usage.prompt_tokens > 0


def test_errors_in_openai_shape(client: openai.OpenAI, daemon: Daemon) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(
            model="nope", messages=[{"role": "user", "content": "x"}], max_tokens=1
        )
    assert "localllm pull" in missing.value.message
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(
            model=SMOL, messages=[{"role": "user", "content": "x"}], temperature=7
        )
    assert bad.value.param == "temperature"
    with daemon.http() as http:
        response = http.post("/v1/chat/completions", json={"model": SMOL, "messages": []})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "messages" and error["type"] == "invalid_request_error"
