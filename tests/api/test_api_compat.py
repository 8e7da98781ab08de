"""What clients send that the daemon must take as Ollama and llama-server do: JSON bodies
under any content type, the version Ollama clients check, the OpenAI routes without ``/v1``,
``/health``, and the errors OpenAI clients look for (``context_length_exceeded``), with
every bad request ending in a 4xx that names the field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import openai
import pytest
from test_daemon_support import Daemon, running_daemon

SMOL = "smollm2:135m"
FEW = {"num_predict": 4, "temperature": 0}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    # A short context makes "longer than the context" cheap to send.
    with running_daemon(
        tmp_path_factory.mktemp("compat") / "home",
        num_parallel=2,
        num_threads=1,
        context_length=256,
    ) as d:
        yield d


def _error(response: httpx.Response) -> Any:
    return response.json()["error"]


# --- bodies ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    [None, "application/x-www-form-urlencoded", "text/plain", "application/json; charset=utf-8"],
)
@pytest.mark.parametrize("path", ["/api/generate", "/api/chat", "/v1/chat/completions"])
def test_json_body_whatever_the_content_type(
    http: httpx.Client, path: str, content_type: str | None
) -> None:
    """curl -d sends a form type, litellm none: the body is JSON all the same."""
    if path == "/api/generate":
        body: dict[str, Any] = {"model": SMOL, "prompt": "hi", "stream": False, "options": FEW}
    elif path == "/api/chat":
        body = {
            "model": SMOL,
            "messages": [{"role": "user", "content": "hi"}],
            "stream": False,
            "options": FEW,
        }
    else:
        body = {"model": SMOL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    headers = {"content-type": content_type} if content_type else {}
    request = http.build_request("POST", path, content=json.dumps(body).encode(), headers=headers)
    assert request.headers.get("content-type") == content_type  # none for raw bytes
    response = http.send(request)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("path", ["/api/chat", "/v1/chat/completions", "/chat/completions"])
def test_a_body_that_is_not_json_is_a_clear_400(http: httpx.Client, path: str) -> None:
    response = http.post(
        path,
        content=b"model=smollm2&prompt=hi",
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert response.status_code == 400
    error = _error(response)
    message = error["message"] if isinstance(error, dict) else error
    assert "not valid JSON" in message


def test_blob_uploads_keep_raw_bytes(http: httpx.Client) -> None:
    import hashlib

    data = b"not json at all"
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    response = http.post(f"/api/blobs/{digest}", content=data)
    assert response.status_code == 201


# --- version, health, bare OpenAI routes ------------------------------------------------------


def test_version_is_one_ollama_clients_accept(http: httpx.Client, daemon: Daemon) -> None:
    import localllm

    data = http.get("/api/version").json()
    # VS Code Copilot compares numerically per part and wants at least 0.6.4
    parts = tuple(int(p) for p in data["version"].split("."))
    assert parts >= (0, 6, 4)
    assert parts >= (0, 9, 0)  # think is served: the release that added it
    assert data["localllm_version"] == localllm.__version__
    assert http.head("/api/version").status_code == 200
    assert daemon.client().version() == localllm.__version__


@pytest.mark.parametrize("path", ["/health", "/v1/health"])
def test_health(http: httpx.Client, path: str) -> None:
    response = http.get(path)
    assert response.status_code == 200 and response.json() == {"status": "ok"}


def test_openai_routes_without_v1(daemon: Daemon) -> None:
    client = openai.OpenAI(base_url=daemon.url, api_key="unused", max_retries=0)
    assert SMOL in [m.id for m in client.models.list()]
    assert client.models.retrieve(SMOL).id == SMOL
    completion = client.chat.completions.create(
        model=SMOL, messages=[{"role": "user", "content": "hi"}], max_tokens=3, temperature=0
    )
    assert completion.choices[0].finish_reason in ("length", "stop")
    text = client.completions.create(model=SMOL, prompt="Once", max_tokens=3, temperature=0)
    assert text.choices[0].text is not None
    vectors = client.embeddings.create(model=SMOL, input="hello")
    assert len(vectors.data[0].embedding) > 10
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("no-such-model")
    assert info.value.body is not None and "localllm pull" in str(info.value.body)
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=SMOL, messages=[])
    assert isinstance(bad.value.body, dict) and bad.value.body.get("param") == "messages"


# --- Ollama's rules ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"), [("system", "Be brief."), ("template", "{{ prompt }}"), ("context", [1])]
)
def test_raw_refuses_system_template_and_context(
    http: httpx.Client, field: str, value: Any
) -> None:
    body = {"model": SMOL, "prompt": "hi", "raw": True, field: value, "stream": False}
    response = http.post("/api/generate", json=body)
    assert response.status_code == 400
    assert "raw mode does not support" in _error(response) and field in _error(response)


def test_images_are_refused_in_one_sentence(
    client_ollama: ollama.Client, http: httpx.Client
) -> None:
    with pytest.raises(ollama.ResponseError) as info:
        client_ollama.chat(
            model=SMOL, messages=[{"role": "user", "content": "look", "images": ["aGk="]}]
        )
    assert info.value.status_code == 400
    assert "vision" in info.value.error
    response = http.post(
        "/v1/chat/completions",
        json={
            "model": SMOL,
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "data:,"}}],
                }
            ],
        },
    )
    assert response.status_code == 400 and "vision" in _error(response)["message"]


@pytest.fixture(scope="module")
def client_ollama(daemon: Daemon) -> ollama.Client:
    return ollama.Client(host=daemon.url)


# --- context overflow -------------------------------------------------------------------------

LONG = "word " * 600  # well over the 256-token context


def test_context_overflow_is_openais_error_streamed_or_not(daemon: Daemon) -> None:
    client = openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="unused", max_retries=0)
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as info:
            result = client.chat.completions.create(
                model=SMOL, messages=[{"role": "user", "content": LONG}], stream=stream
            )
            list(result)  # type: ignore[arg-type]
        assert info.value.code == "context_length_exceeded"
        body = info.value.body
        assert isinstance(body, dict) and body.get("param") == "messages"
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=SMOL, prompt=LONG, stream=True)
    assert info.value.code == "context_length_exceeded"


def test_context_overflow_streamed_ollama_is_a_400(http: httpx.Client) -> None:
    body = {
        "model": SMOL,
        "messages": [{"role": "user", "content": LONG}],
        "stream": True,
        "truncate": False,
    }
    with http.stream("POST", "/api/chat", json=body) as response:
        assert response.status_code == 400
        response.read()
        assert "context" in _error(response)


def test_ollama_truncate_drops_the_oldest_turns(http: httpx.Client) -> None:
    history = [
        {"role": "user", "content": LONG},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "hi"},
    ]
    body = {"model": SMOL, "messages": history, "stream": False, "options": FEW}
    refused = http.post("/api/chat", json={**body, "truncate": False})
    assert refused.status_code == 400 and "256 tokens" in _error(refused)
    # By default (and with truncate: true), as Ollama does: the oldest turns go, and the
    # final chunk says how much went.
    for extra in ({}, {"truncate": True}):
        kept = http.post("/api/chat", json={**body, **extra})
        assert kept.status_code == 200, kept.text
        answer = kept.json()
        assert answer["prompt_eval_count"] < 256
        assert answer["truncated_messages"] == 1 and answer["truncated_tokens"] > 600
    streamed = http.post("/api/chat", json={**body, "stream": True})
    *_, final = (json.loads(line) for line in streamed.text.splitlines() if line)
    assert final["done"] and final["truncated_messages"] == 1


# --- embeddings -------------------------------------------------------------------------------


def test_overlong_embedding_input_is_a_400(daemon: Daemon) -> None:
    client = openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model=SMOL, input=["short", LONG])
    assert info.value.code == "context_length_exceeded"
    body = info.value.body
    assert isinstance(body, dict) and body.get("param") == "input"


def _smollm2_tokens(smollm2_gguf: Path, text: str) -> list[int]:
    """The text's ids in SmolLM2's own vocabulary, from llama.cpp directly (no BOS)."""
    import llama_cpp

    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(smollm2_gguf).encode(), params)
    try:
        vocab = llama_cpp.llama_model_get_vocab(model)
        data = text.encode()
        buffer = (llama_cpp.llama_token * (len(data) + 8))()
        count = llama_cpp.llama_tokenize(vocab, data, len(data), buffer, len(buffer), False, False)
        return list(buffer[:count])
    finally:
        llama_cpp.llama_model_free(model)


def test_token_array_embedding_input(daemon: Daemon, smollm2_gguf: Path) -> None:
    """LangChain's OpenAIEmbeddings sends token ids: read as the model's own vocabulary, they
    embed exactly as the text they spell."""
    client = openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="unused", max_retries=0)
    texts = ["The quick brown fox", "jumps over the lazy dog"]
    ids = [_smollm2_tokens(smollm2_gguf, t) for t in texts]
    by_text = client.embeddings.create(model=SMOL, input=texts)
    by_ids = client.embeddings.create(model=SMOL, input=ids)
    single = client.embeddings.create(model=SMOL, input=ids[0])
    for a, b in zip(by_text.data, by_ids.data, strict=True):
        assert a.embedding == pytest.approx(b.embedding, abs=1e-5)
    assert single.data[0].embedding == pytest.approx(by_text.data[0].embedding, abs=1e-5)
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model=SMOL, input=[[]])
    assert isinstance(info.value.body, dict) and info.value.body.get("param") == "input"
