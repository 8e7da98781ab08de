"""Log-likelihood requests, as evaluation harnesses send them to ``/v1/completions``: ``echo``,
``logprobs``, ``max_tokens: 0``, prompts as text or token ids, one or many per request.

The prompt's log probabilities come from the runner's own prefill (the logits of every prompt
position, in one pass). They are compared with a plain llama.cpp loop's log-softmax over the
same tokens, computed in this process in the same run on SmolLM2 (never with values written
down: they differ between CPUs).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import llama_cpp
import numpy as np
import openai
import pytest
from openapi_specs import OPENAI, check
from plain_loop import PlainLoop
from test_daemon_support import Daemon, running_daemon

from localllm.client import Client
from localllm.daemon.runner.protocol import RunnerConfig

pytestmark = pytest.mark.slow

SMOL = "smol"
PROMPTS = ["The capital of France is Paris", "One, two, three, four, five"]
TOLERANCE = 2e-3  # the same model and weights; batch and context shapes differ a little


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, smollm2_gguf: Path) -> Iterator[Daemon]:
    home = tmp_path_factory.mktemp("scoring") / "home"
    with running_daemon(home, num_parallel=2) as d:
        list(Client(d.settings).create(SMOL, from_=str(smollm2_gguf)))
        yield d


@pytest.fixture(scope="module")
def http(daemon: Daemon) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=daemon.url, timeout=300) as client:
        yield client


class Reference(PlainLoop):
    """The plain loop's log-softmax of each prompt token given the ones before it: the whole
    prompt in one batch with logits at every position."""

    def logprobs(self, tokens: list[int]) -> list[float]:
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.ctx), True)
        batch = llama_cpp.llama_batch_init(len(tokens), 0, 1)
        try:
            batch.n_tokens = len(tokens)
            for i, token in enumerate(tokens):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, i, 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = True
            assert llama_cpp.llama_decode(self.ctx, batch) == 0
            n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
            out = []
            for i in range(1, len(tokens)):
                row = np.ctypeslib.as_array(
                    llama_cpp.llama_get_logits_ith(self.ctx, i - 1), shape=(n_vocab,)
                ).astype(np.float64)
                peak = row.max()
                out.append(float(row[tokens[i]] - peak - np.log(np.exp(row - peak).sum())))
            return out
        finally:
            llama_cpp.llama_batch_free(batch)


@pytest.fixture(scope="module")
def reference(smollm2_gguf: Path) -> Iterator[Reference]:
    loop = Reference(smollm2_gguf, RunnerConfig(model_path=str(smollm2_gguf), n_slots=1))
    yield loop
    loop.close()


def score(http: httpx.Client, prompt: Any, **extra: Any) -> dict[str, Any]:
    body = {"model": SMOL, "prompt": prompt, "echo": True, "logprobs": 2, "max_tokens": 0}
    response = http.post("/v1/completions", json={**body, **extra})
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def close(got: list[float | None], want: list[float]) -> None:
    assert got[0] is None  # nothing comes before the first token
    assert len(got) == len(want) + 1
    for value, expected in zip(got[1:], want, strict=True):
        assert value is not None and math.isclose(value, expected, abs_tol=TOLERANCE), (
            got,
            want,
        )


def _schema_checked(answer: dict[str, Any]) -> None:
    # The document types token_logprobs as numbers and top_logprobs as objects; OpenAI's API
    # (and this one) send null for an echoed prompt's first token, which has no probability.
    shown = []
    for choice in answer["choices"]:
        logprobs = choice["logprobs"]
        if logprobs is not None:
            logprobs = {
                **logprobs,
                "token_logprobs": [v for v in logprobs["token_logprobs"] if v is not None],
                "top_logprobs": [v for v in logprobs["top_logprobs"] if v is not None],
            }
        shown.append({**choice, "logprobs": logprobs})
    check(OPENAI, "CreateCompletionResponse", {**answer, "choices": shown})


def test_text_prompt_scores_match_a_plain_llama_cpp_loop(
    http: httpx.Client, reference: Reference
) -> None:
    prompt = PROMPTS[0]
    tokens = reference.tokenize(prompt)
    answer = score(http, prompt)
    _schema_checked(answer)
    (choice,) = answer["choices"]
    assert choice["text"] == prompt and choice["finish_reason"] == "length"
    logprobs = choice["logprobs"]
    assert len(logprobs["tokens"]) == len(tokens)
    close(logprobs["token_logprobs"], reference.logprobs(tokens))
    # offsets locate each token in the echoed text, as harnesses use them
    assert logprobs["text_offset"][0] == 0
    assert logprobs["text_offset"] == sorted(logprobs["text_offset"])
    assert "".join(logprobs["tokens"]) == prompt
    assert logprobs["top_logprobs"][0] is None
    tops, values = logprobs["top_logprobs"][1:], logprobs["token_logprobs"][1:]
    for entry, value in zip(tops, values, strict=True):
        assert 1 <= len(entry) <= 3 and max(entry.values()) >= value - 1e-6
    # nothing generated; the whole prompt evaluated (a cached prefix has no logits)
    usage = answer["usage"]
    assert usage["completion_tokens"] == 0 and usage["prompt_tokens"] == len(tokens)
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0


def test_token_prompts_one_or_many(http: httpx.Client, reference: Reference) -> None:
    tokens = [reference.tokenize(p) for p in PROMPTS]
    expected = [reference.logprobs(t) for t in tokens]
    (one,) = score(http, tokens[0])["choices"]
    close(one["logprobs"]["token_logprobs"], expected[0])
    assert one["text"] == PROMPTS[0]  # a token prompt echoes its tokens' text
    many = score(http, tokens)
    assert [c["index"] for c in many["choices"]] == [0, 1]
    for choice, want, text in zip(many["choices"], expected, PROMPTS, strict=True):
        close(choice["logprobs"]["token_logprobs"], want)
        assert choice["text"] == text
    texts = score(http, PROMPTS)
    for choice, want in zip(texts["choices"], expected, strict=True):
        close(choice["logprobs"]["token_logprobs"], want)
    assert texts["usage"]["prompt_tokens"] == sum(len(t) for t in tokens)


def test_echo_with_generation_and_n(http: httpx.Client, reference: Reference) -> None:
    prompt = PROMPTS[1]
    tokens = reference.tokenize(prompt)
    answer = score(http, prompt, max_tokens=3, temperature=0, n=2)
    _schema_checked(answer)
    want = reference.logprobs(tokens)
    for choice in answer["choices"]:
        logprobs = choice["logprobs"]
        assert choice["text"].startswith(prompt)
        assert len(logprobs["tokens"]) == len(tokens) + 3
        close(logprobs["token_logprobs"][: len(tokens)], want)  # every choice has the prompt's
        generated = logprobs["text_offset"][len(tokens) :]
        assert generated[0] == len(prompt) and generated == sorted(generated)
        assert "".join(logprobs["tokens"]) == choice["text"]


def test_streamed_scores_and_the_official_client(
    http: httpx.Client, daemon: Daemon, reference: Reference
) -> None:
    tokens = reference.tokenize(PROMPTS[0])
    want = reference.logprobs(tokens)
    client = openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="unused", max_retries=0)
    whole = client.completions.create(
        model=SMOL, prompt=PROMPTS[0], echo=True, logprobs=1, max_tokens=0
    )
    assert whole.choices[0].logprobs is not None
    close(whole.choices[0].logprobs.token_logprobs, want)  # type: ignore[arg-type]
    chunks = list(
        client.completions.create(
            model=SMOL, prompt=[tokens, tokens], echo=True, logprobs=1, max_tokens=0, stream=True
        )
    )
    seen = {c.choices[0].index: c.choices[0] for c in chunks if c.choices}
    assert sorted(seen) == [0, 1]
    for choice in seen.values():
        assert choice.text == PROMPTS[0] and choice.finish_reason == "length"
        close(choice.logprobs.token_logprobs, want)  # type: ignore[union-attr,arg-type]


def test_scoring_refusals(http: httpx.Client) -> None:
    bad = http.post("/v1/completions", json={"model": SMOL, "prompt": [[1, 2], []]})
    assert bad.status_code == 400 and "prompt[1]" in bad.json()["error"]["message"]
    outside = http.post("/v1/completions", json={"model": SMOL, "prompt": [10**9], "max_tokens": 1})
    assert outside.status_code == 400 and "not a token" in outside.json()["error"]["message"]
