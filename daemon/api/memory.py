"""``POST /api/plan`` (localllm's own): the memory plan of a model on this machine — slots
and context, where its layers go, the bytes per device — without loading it (or the plan of
the runner serving it, when it is loaded with the same options). ``localllm show`` prints it."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from ..generation import resolve_model
from ..options import merge_options, runner_config
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
    """``{"model", "loaded", "plan"}`` when it fits (``plan``: slots, context, GPU layers,
    ``uses`` per device, ``budgets``, ``warnings``...), else ``{"model", "loaded",
    "nofit", "refusal"}`` with the sentence a load would be refused with."""
    model = resolve_model(state, body.model)
    config = runner_config(state.settings, model, merge_options(model, body.options))
    answer = await state.scheduler.plan(model, config)
    return {"model": model.name.short, **answer}
