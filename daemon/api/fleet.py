"""What a gateway in front of many daemons reads: ``GET /v1/loads``, the daemon's load.

``localllm gateway`` starts the Shepherd Model Gateway (smg). It health-checks each worker
at ``GET /health``, learns its models from ``GET /v1/models``, and every few seconds polls
``GET /v1/loads?include=core,disagg,queues,memory`` for the worker's load, in the shape of
SGLang's ``/v1/loads`` (smg's ``WorkerLoadResponse``): one snapshot per data-parallel rank,
each with running and waiting requests and KV-cache use. A daemon is one rank: its snapshot
adds up every loaded model (requests holding a slot, requests waiting for one or for a load,
slots, KV cells), so the gateway's load figures, its ``/get_loads``, its least-load scores and
its overload checks see our queue and slot use.

Two choices make the figures mean what smg reads into them (SGLang's meaning):

* KV "in use" is what running requests hold. A slot that finished keeps its tokens as a
  prefix cache, but a new request takes that slot over, as SGLang reuses the evictable
  tokens of its radix cache, which it does not count as used either. Counting idle prefixes
  would make a daemon that caches well look full.
* With no model loaded, the capacity is the one a model gets when it loads (each model gets
  ``LOCALLLM_NUM_PARALLEL`` slots of ``LOCALLLM_CONTEXT_LENGTH`` cells), not zero: smg
  compares workers by these figures, and a daemon that has not loaded its model yet is not
  one with no room.

Only the ``core`` section has figures here: ``disagg`` (prefill/decode disaggregation),
``queues`` and ``memory`` are SGLang's sections for engines that split work across stages
and report memory pools; a localllm daemon has none of them, so asking for them adds no
field (as smg expects from engines without them). Another section name is a 400.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter

from ..errors import HTTPProblem
from ..scheduler import LoadedModel
from ..state import StateDep

__all__ = ["LOAD_SECTIONS", "router"]

router = APIRouter()

LOAD_SECTIONS = frozenset({"core", "disagg", "queues", "memory"})
"""Section names ``/v1/loads?include=`` accepts (SGLang's)."""


def _cache_hit_rate(models: list[LoadedModel]) -> float:
    """Share of recent prompt tokens served from the prefix cache (0 when none ran)."""
    prompt = cached = 0
    for model in models:
        for record in model.recent:
            prompt += record.prompt_tokens
            cached += record.cached_tokens
    return cached / prompt if prompt else 0.0


@router.get("/loads", summary="Load of this daemon for a gateway (SGLang's /v1/loads shape)")
async def loads(state: StateDep, include: str = "core") -> dict[str, Any]:
    """One snapshot summing every loaded model: requests holding a slot
    (``num_running_reqs``), requests waiting for a slot or a load (``num_waiting_reqs``),
    slots (``max_running_requests``), KV cells running requests hold and cells in all
    (``num_used_tokens``, ``max_total_num_tokens``, ``token_usage`` their ratio), decode
    tokens/s (``gen_throughput``), busy slots' share (``utilization``) and the share of recent
    prompt tokens served from the prefix cache (``cache_hit_rate``)."""
    sections = {part.strip() for part in include.split(",") if part.strip()}
    unknown = sorted(sections - LOAD_SECTIONS)
    if unknown:
        raise HTTPProblem(
            400,
            f"unknown load section {', '.join(unknown)}: use {', '.join(sorted(LOAD_SECTIONS))}",
            param="include",
        )
    models = state.scheduler.loaded()
    stats = [
        s
        for s in await asyncio.gather(*(state.scheduler.stats(m, timeout=1.0) for m in models))
        if s is not None
    ]
    running = sum(m.active for m in models)
    waiting = sum(m.waiting for m in models)
    if models:
        slots = sum(m.config.n_slots for m in models)
        total = sum(s.kv_cells_total for s in stats)
    else:
        settings = state.settings
        slots, total = settings.num_parallel, settings.num_parallel * settings.context_length
    used = sum(slot.cached_tokens for s in stats for slot in s.slots if slot.state != "idle")
    snapshot = {
        "dp_rank": 0,
        "num_running_reqs": running,
        "num_waiting_reqs": waiting,
        "num_waiting_uncached_tokens": 0,  # not counted: a waiting request is not tokenized yet
        "num_total_reqs": running + waiting,
        "num_used_tokens": used,
        "max_total_num_tokens": total,
        "token_usage": min(used / total, 1.0) if total else 0.0,
        "gen_throughput": sum(s.decode_tokens_per_s for s in stats),
        "cache_hit_rate": _cache_hit_rate(models),
        "utilization": running / slots if slots else 0.0,
        "max_running_requests": slots,
    }
    return {
        "timestamp": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        "dp_rank_count": 1,
        "loads": [snapshot],
    }
