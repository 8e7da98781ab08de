"""``POST /api/plan`` (localllm's own): the memory plan of a model on this machine — slots
and context, where its layers go, the bytes per device — without loading it (or the plan of
the runner serving it, when it is loaded with the same options). ``localllm show`` prints it."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field

from ..generation import resolve_model
from ..loadconfig import runner_config
from ..memory.plan import MemoryPlan
from ..options import merge_options
from ..state import StateDep

__all__ = ["PlanRequest", "router"]

router = APIRouter()


class PlanRequest(BaseModel):
    """POST /api/plan."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field("", description="Model name, e.g. smollm2:135m.")
    options: dict[str, Any] | None = Field(
        None, description="Options as a request would give them (num_ctx, num_gpu...)."
    )


@router.post("/api/plan", summary="The memory plan of a model (localllm)")
async def plan(body: PlanRequest, state: StateDep) -> dict[str, Any]:
    """``{"model", "loaded", "plan", "speed"}`` when it fits (``plan``: slots, context, GPU
    layers, ``uses`` per device, ``budgets``, ``warnings``...; ``speed``: ``predicted`` and
    ``measured`` tokens/s), else ``{"model", "loaded", "nofit", "refusal"}`` with the sentence
    a load would be refused with."""
    from .discover import local_speed

    model = resolve_model(state, body.model)
    config = runner_config(state.settings, model, merge_options(model, body.options))
    answer = await state.scheduler.plan(model, config)
    if "plan" in answer:
        plan = MemoryPlan.from_dict(answer["plan"])
        loaded = state.scheduler.get(model.name.full)
        answer["speed"] = await run_in_threadpool(local_speed, state, loaded, model, plan)
    return {"model": model.name.short, **answer}
