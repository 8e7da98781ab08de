"""Reranking end to end: ``/v1/rerank`` and ``/rerank`` on a tiny generated reranker (a Qwen3
GGUF with a classifier head, rank pooling and a rerank prompt), a real daemon, real HTTP.

The scores are compared with a plain llama.cpp rank-pooling context in this process scoring
the same prompts (same run; nothing is written down), and the answer's shape, order, top_n
and documents are checked; a model that cannot rank is a clear 400.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import httpx
import llama_cpp
import pytest
from test_daemon_support import Daemon, running_daemon
from tiny_gguf import write_tiny_gguf

from localllm.daemon.devices import cpu

pytestmark = pytest.mark.slow

RERANKER = "tiny:rerank"
PLAIN = "tiny:plain"
QUERY = "what is the sky"
DOCUMENTS = ["the sky is blue", "a cat on the mat", "sky", "blue whales in the sea", "the"]


@pytest.fixture(scope="module")
def reranker_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("models") / "rerank.gguf", reranker=True)


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, reranker_gguf: Path, tiny_gguf: Path
) -> Iterator[Daemon]:
    with running_daemon(tmp_path_factory.mktemp("rerank") / "home", num_threads=1) as d:
        d.create(RERANKER, reranker_gguf)
        d.create(PLAIN, tiny_gguf)
        yield d


def reference_scores(path: Path, query: str, documents: list[str]) -> list[float]:
    """A plain llama.cpp context with rank pooling scoring each document alone, the prompt
    filled as llama-server fills the GGUF's rerank template."""
    llama_cpp.llama_backend_init()
    params = cpu.model_params()  # weight repacking as this CPU allows
    params.n_gpu_layers = 0
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    vocab = llama_cpp.llama_model_get_vocab(model)
    template = llama_cpp.llama_model_chat_template(model, b"rerank").decode()
    context_params = llama_cpp.llama_context_default_params()
    context_params.n_ctx = context_params.n_batch = context_params.n_ubatch = 512
    context_params.embeddings = True
    context_params.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_RANK
    ctx = llama_cpp.llama_init_from_model(model, context_params)
    batch = llama_cpp.llama_batch_init(512, 0, 1)
    scores = []
    try:
        for document in documents:
            text = template.replace("{query}", query).replace("{document}", document).encode()
            tokens = (llama_cpp.llama_token * 512)()
            count = llama_cpp.llama_tokenize(vocab, text, len(text), tokens, 512, False, True)
            llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
            batch.n_tokens = count
            for i in range(count):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = tokens[i], i, 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = True
            assert llama_cpp.llama_decode(ctx, batch) == 0
            scores.append(float(llama_cpp.llama_get_embeddings_seq(ctx, 0)[0]))
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
    return scores


def test_rerank_scores_order_and_documents(http: httpx.Client, reranker_gguf: Path) -> None:
    want = reference_scores(reranker_gguf, QUERY, DOCUMENTS)
    assert len(set(round(s, 6) for s in want)) > 1  # the head tells the documents apart
    body = {"model": RERANKER, "query": QUERY, "documents": DOCUMENTS}
    answer = http.post("/v1/rerank", json=body).json()
    assert answer["model"] == RERANKER and answer["object"] == "list"
    assert answer["usage"]["prompt_tokens"] > 0
    results = answer["results"]
    assert sorted(r["index"] for r in results) == list(range(len(DOCUMENTS)))
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)  # best first
    for result in results:
        assert "document" not in result
        assert math.isclose(result["relevance_score"], want[result["index"]], abs_tol=1e-4)
    # top_n, documents as objects and returned, at the root as llama-server serves it
    objects = [{"text": text} for text in DOCUMENTS]
    body = {**body, "documents": objects, "top_n": 2, "return_documents": True}
    top = http.post("/rerank", json=body).json()["results"]
    assert [r["index"] for r in top] == [r["index"] for r in results[:2]]
    assert [r["document"]["text"] for r in top] == [DOCUMENTS[r["index"]] for r in top]


def test_capabilities_and_refusals(http: httpx.Client) -> None:
    shown = http.post("/api/show", json={"model": RERANKER}).json()
    assert "rerank" in shown["capabilities"]
    assert "rerank" not in http.post("/api/show", json={"model": PLAIN}).json()["capabilities"]
    refused = http.post("/v1/rerank", json={"model": PLAIN, "query": "q", "documents": ["d"]})
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == "model" and "cannot rank" in error["message"]
    for bad, field in (
        ({"documents": []}, "documents"),
        ({"rank_fields": ["text"]}, "rank_fields"),
        ({"top_n": 0}, "top_n"),
    ):
        body = {"model": RERANKER, "query": "q", "documents": ["d"], **bad}
        response = http.post("/v1/rerank", json=body)
        assert response.status_code == 400, response.text
        assert field in response.json()["error"]["message"]
    missing = http.post("/rerank", json={"model": "nope:1", "query": "q", "documents": ["d"]})
    assert missing.status_code == 404 and "nope" in missing.json()["error"]
