"""Reranking: ``POST /v1/rerank`` and ``POST /rerank``, in the shape Jina's and Cohere's APIs
(and llama-server) use.

A query and its documents go to a model whose GGUF declares rank pooling (a reranker such as
Qwen3-Reranker or bge-reranker: a classifier head scores a query and a document joined in one
sequence); the documents are scored in batches, as embeddings are, and answered best first::

    {"model", "object": "list", "usage": {"prompt_tokens", "total_tokens"},
     "results": [{"index", "relevance_score", "document"?: {"text"}}]}

``relevance_score`` is the model's own score for the pair, as llama-server reports it (a
Qwen3 reranker's is a probability; others' may be any real number). ``top_n`` keeps the best
n, ``return_documents`` adds each document's text. A model that cannot rank is a 400 naming
the model. Unknown fields are refused (Cohere's ``max_chunks_per_doc`` and ``rank_fields``
have no meaning for a local reranker). Errors take OpenAI's shape under ``/v1`` and the
``{"error": "..."}`` shape at the root, as the daemon's other routes do.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from ..errors import HTTPProblem
from ..generation import embed, parse_keep_alive, resolve_model
from ..loadconfig import runner_config
from ..options import merge_options
from ..state import StateDep

__all__ = ["RerankRequest", "router"]

router = APIRouter()
"""The route without a prefix; the app mounts it under ``/v1`` and at the root."""


class Document(BaseModel):
    """A document given as an object (Jina's and Cohere's ``{"text": ...}``)."""

    model_config = ConfigDict(extra="forbid")

    text: str


class RerankRequest(BaseModel):
    """POST /v1/rerank."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(..., min_length=1)
    query: str
    documents: list[str | Document] = Field(..., min_length=1, max_length=4096)
    top_n: int | None = Field(None, ge=1, description="Keep only the n best documents.")
    return_documents: bool = Field(False, description="Add each document's text to its result.")
    truncate: bool = Field(
        False, description="Cut a query and document longer than the context instead of a 400."
    )
    keep_alive: str | float | None = None


@router.post("/rerank", summary="Rerank documents for a query (Jina/Cohere shape)")
async def rerank(body: RerankRequest, request: Request, state: StateDep) -> JSONResponse:
    """The documents scored against the query by a reranker, best first."""
    model = resolve_model(state, body.model)
    if "rerank" not in model.capabilities():
        raise HTTPProblem(
            400,
            f"{model.name.short} cannot rank: its GGUF declares no rank pooling (use a "
            "reranker, such as a Qwen3-Reranker or bge-reranker GGUF)",
            param="model",
            code="rerank_unsupported",
        )
    texts = [d.text if isinstance(d, Document) else d for d in body.documents]
    config = runner_config(state.settings, model, merge_options(model, {}))
    result, _, _ = await embed(
        state,
        request,
        model,
        config,
        [],
        truncate=body.truncate,
        keep_alive=parse_keep_alive(body.keep_alive),
        rank_pairs=[[body.query, text] for text in texts],
    )
    scores = [vector[0] for vector in result.embeddings]
    order = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)
    results: list[dict[str, Any]] = []
    for index in order[: body.top_n]:
        item: dict[str, Any] = {"index": index, "relevance_score": scores[index]}
        if body.return_documents:
            item["document"] = {"text": texts[index]}
        results.append(item)
    usage = {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens}
    return JSONResponse(
        {"model": model.name.short, "object": "list", "usage": usage, "results": results}
    )
