"""The speed probe's models of routed experts (mixture-of-experts layers), timed by its child
(:mod:`.measure`) when a model whose experts are of a type not measured yet is first priced.

A batch of a mixture-of-experts model goes through llama.cpp's expert kernel
(``mul_mat_id``), not the dense one whose pace the probe's per-type batch measures: with
weight repacking it multiplies each token routed to an expert by itself (a matrix-vector
product per token, where the dense kernel multiplies tiles of several tokens at once), and
without it the rows of each expert apart. And an expert multiplies only the tokens routed to
it: a 500-token prompt gives each of 32 experts, 4 used a token, about 62, not 500.

So the probe times that kernel: two models of the same layers, one with :data:`FEW` experts
and one with :data:`MANY`, each expert of a Qwen3-MoE expert's shape, every token routed to
every expert (all are used: each expert multiplies exactly the batch's tokens), at two batch
sizes (:data:`TOKENS`). What the extra experts add is the kernel's time at that many tokens
per expert; the two sizes part what grows with the tokens from what an expert costs once a
batch (:func:`~localllm.daemon.speed.model._expert_rates` turns them into rates).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

__all__ = ["EMBD", "FEW", "FFN", "LAYERS", "MANY", "TOKENS", "expert_report", "read_experts"]

EMBD, FFN, HEADS = 1024, 768, 8
"""The models' width and each expert's (Qwen3-30B-A3B's experts are 768 wide)."""
LAYERS = 2
FEW, MANY = 2, 6
"""Experts per layer of the two models (all of them used by every token)."""
TOKENS = (16, 128)
"""Tokens per expert of the two batches: the per-expert batches prompts give (a 512-token
batch: 16 for 256 experts, 8 used; 64 for 32, 4 used; 128 for 8, 2 used)."""

Writer = Callable[[Path, str, int], None]
"""``(path, type, experts)``: writes a probe model of :data:`LAYERS` layers of
:data:`EMBD` width whose FFN is that many experts of :data:`FFN` width, all of ``type``."""


def _name(kind: str, experts: int, tokens: int) -> str:
    return f"experts.{kind}.{experts}x{tokens}"


def read_experts(rounds: Any, workdir: Path, types: Sequence[str], write: Writer) -> None:
    """Each type's two expert models loaded into ``rounds`` (the probe's interleaved rounds,
    :class:`~localllm.daemon.speed.measure._Rounds`), each timed once a round at both batch
    sizes (logits for every token: the last layer's experts run for all of them)."""
    for kind in types:
        for experts in (FEW, MANY):
            path = workdir / f"{kind}-experts-{experts}.gguf"
            write(path, kind, experts)
            (context,) = rounds.load(path, max(TOKENS) + 2)
            for tokens in TOKENS:
                rounds.read(_name(kind, experts, tokens), partial(context.prefill, tokens=tokens))


def expert_report(best: Callable[[str], float], types: Sequence[str]) -> dict[str, Any]:
    """The report's ``experts`` part: per type, the models' shapes and their best batches."""
    return {
        kind: {
            "experts": [FEW, MANY],
            "layers": LAYERS,
            "expert_params": 3 * EMBD * FFN,
            "tokens": list(TOKENS),
            "batch_s": [[best(_name(kind, n, tokens)) for tokens in TOKENS] for n in (FEW, MANY)],
        }
        for kind in types
    }
