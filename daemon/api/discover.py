"""Finding a model on the Hugging Face Hub and knowing how it will run here (localllm's own):

* ``GET /api/search?q=&sort=&limit=&cursor=`` — GGUF repositories on the Hub, one Hub request
  per page (:func:`localllm.sources.hub.search_hub`);
* ``POST /api/hub/show`` (``{"model": "hf.co/<user>/<repo>[:<quant>]"}``) — a repository's
  quantizations before any download: size, fit on this machine's memory plan, the context each
  would get, predicted decode and prefill speed (:mod:`..discover`);
* ``POST /api/speed`` (``{"model": NAME}``) — a stored model's predicted and measured speed.

Also what other routes take from here: :func:`choose_pull` (the quantization ``/api/pull``
takes for ``hf.co/<user>/<repo>`` without a tag) and :func:`local_speed` (predicted and
measured speed of a model in the store, for ``/api/plan`` and ``/api/ps``).

Hub errors keep their meaning: 404 (no such repository, no GGUF in it), 403 (gated or private:
how to log in), 429 with ``Retry-After`` (rate limited), 502 (unreachable, down, timed out).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field

from localllm._exceptions import LocalLLMError
from localllm.sources.hub import SORTS, search_hub
from localllm.store.names import ModelName, parse_name

from ..discover import NothingFits, cached_calibration, pick_quant, probe_threads
from ..errors import HTTPProblem, InsufficientMemoryError
from ..speed.book import SpeedBook
from ..speed.model import ModelCost, model_cost, predict
from ..speed.watch import SHOW_WAIT_S
from ..state import DaemonState, StateDep

if TYPE_CHECKING:
    from ..scheduler import LoadedModel

__all__ = [
    "HubShowRequest",
    "SpeedRequest",
    "choose_pull",
    "local_speed",
    "router",
]

router = APIRouter()

_MAX_LIMIT = 100


class HubShowRequest(BaseModel):
    """POST /api/hub/show."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(..., description="hf.co/<user>/<repo>, optionally :<quant> for one.")


def _hf_name(text: str, field: str = "model") -> ModelName:
    name = parse_name(text)
    if not name.is_huggingface:
        raise HTTPProblem(
            400,
            f"{text} is not a Hugging Face name: use hf.co/<user>/<repo>[:<quant>]",
            param=field,
        )
    return name


# -- routes -----------------------------------------------------------------------------------


@router.get("/api/search", summary="Search the Hugging Face Hub for GGUF models (localllm)")
async def search(
    state: StateDep,
    q: str = Query("", description="Words the repository's name contains."),
    sort: str = Query("downloads", description=f"One of: {', '.join(SORTS)} (descending)."),
    limit: int = Query(20, ge=1, le=_MAX_LIMIT, description="Results per page."),
    cursor: str | None = Query(None, description="next_cursor of the previous page."),
) -> dict[str, Any]:
    """``{"models": [...], "next_cursor"}``: each with ``name`` (to pull), downloads, likes,
    last update, parameters, architecture and context length where the Hub reports them."""
    if sort not in SORTS:
        raise HTTPProblem(400, f"sort must be one of {', '.join(SORTS)}", param="sort")
    page = await run_in_threadpool(
        search_hub, state.settings, q.strip(), sort=sort, limit=limit, cursor=cursor
    )
    return {"models": [m.to_dict() for m in page.models], "next_cursor": page.next_cursor}


@router.post("/api/hub/show", summary="A Hub repository's quantizations on this machine (localllm)")
async def hub_show(body: HubShowRequest, state: StateDep) -> dict[str, Any]:
    """Every GGUF quantization of the repository (only the tag's, with a tag): files and size,
    fit verdict and context from this machine's memory plan, predicted speed. Nothing is
    downloaded but the start of one GGUF file (its header)."""
    name = _hf_name(body.model)
    tag = None if name.tag == "latest" else name.tag
    report = await run_in_threadpool(state.discovery.report, name.repo_id, tag)
    return report.to_dict()


class SpeedRequest(BaseModel):
    """POST /api/speed."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(..., description="A model in the store, e.g. smollm2:135m.")


@router.post("/api/speed", summary="A stored model's predicted and measured speed (localllm)")
async def speed(body: SpeedRequest, state: StateDep) -> dict[str, Any]:
    """``{"model", "predicted", "measured"}``: the speed model's decode and prefill tokens/s
    for one stream here (at the loaded context, or the configured one), and what the runner
    measured while serving it. Cheap: no plan is made and no probe runs."""
    from ..generation import resolve_model

    model = resolve_model(state, body.model)
    loaded = state.scheduler.get(model.name.full)
    plan = loaded.plan if loaded is not None else None
    answer = await run_in_threadpool(local_speed, state, loaded, model, plan, probe=False)
    return {"model": model.name.short, **answer}


# -- for the other routes -----------------------------------------------------------------------


def choose_pull(state: DaemonState, name: ModelName) -> tuple[str, str] | None:
    """For ``hf.co/<user>/<repo>`` without a tag: ``(tag, why)`` of the quantization that fits
    this machine best (see :func:`..discover.pick_quant`); None for any other name. Blocking."""
    if not name.is_huggingface or name.tag != "latest":
        return None
    # The pick needs no speed: a pull never waits for the probe (figures measured before
    # still say how fast the pick will run).
    report = state.discovery.report(name.repo_id, probe=False)
    has_gpu = any(not d.is_host for d in report.devices)
    try:
        best, why = pick_quant(report.quants, has_gpu)
    except NothingFits as exc:
        raise InsufficientMemoryError(f"hf.co/{name.repo_id}: {exc}") from None
    size = best.quant.size
    speed = ""
    if best.prediction is not None and best.prediction.decode:
        speed = f", predicted {best.prediction.decode:.0f} tokens/s"
    note = f"picked {best.quant.label} ({size / 1e9:.2f} GB, {best.verdict}{speed}): {why}"
    return best.quant.tag, note


@functools.lru_cache(maxsize=32)
def _local_cost(paths: tuple[str, ...], kv_cache_type: str) -> ModelCost:
    """A stored model's cost per token (blobs never change, so it is read once)."""
    from localllm.gguf_info import inspect_gguf

    from ..memory.layout import layout_from_gguf

    parts = [inspect_gguf(p) for p in paths]
    return model_cost(parts, layout_from_gguf(parts, kv_cache_type).kv_per_cell)


def local_speed(
    state: DaemonState, loaded: LoadedModel | None, model: Any, plan: Any, *, probe: bool = True
) -> dict[str, Any]:
    """Predicted and measured speed of a model in the store (``model``: its LocalModel) under
    ``plan`` (a MemoryPlan or None). Uses the probe's cached figures; with ``probe``, measures
    weight types they lack (a second or so each) and, while the machine's figures are being
    measured (:mod:`localllm.daemon.speed.watch`), waits for them up to a few seconds; without it,
    says the
    figures are coming (``measuring``: true). Blocking (reads the GGUF header)."""
    answer: dict[str, Any] = {}
    book: SpeedBook = state.speedbook
    digest = model.entry.digest
    observed = book.measured(digest)
    if observed is not None:
        answer["measured"] = {
            "decode": observed.measured_decode,
            "prefill": observed.measured_prefill,
            "requests": max(len(observed.decode), len(observed.prefill)),
        }
    calibration = cached_calibration(state.settings)
    watch = state.speedwatch
    if calibration is None and probe:
        calibration = watch.wait(SHOW_WAIT_S)
    if calibration is None:
        answer["predicted"] = None
        answer["why"] = watch.why() or "this machine's speed is not measured yet"
        answer["measuring"] = watch.measuring
        return answer
    kv_type = loaded.config.kv_cache_type if loaded is not None else state.settings.kv_cache_type
    try:
        cost = _local_cost(tuple(str(p) for p in model.gguf_paths), kv_type)
    except LocalLLMError as exc:
        answer["predicted"] = None
        answer["why"] = f"its GGUF could not be read: {exc}"
        return answer
    missing = sorted(t for t in cost.types if t not in calibration.types)
    # A mixture-of-experts model's routed experts are priced at their own kernel's pace.
    experts = sorted(t for t in cost.expert_types if t not in calibration.experts)
    unmeasured = ""
    if (missing or experts) and probe:
        from ..speed.probe import ProbeFailed, calibrate

        try:
            calibration = calibrate(
                state.settings,
                threads=probe_threads(state.settings),
                types=missing,
                experts=experts,
            )
        except ProbeFailed as exc:
            # The missing types' probe did not run or did not keep its figures (a busy
            # machine): the prediction says which types have none, and why.
            unmeasured = str(exc)
    context = plan.n_ctx_per_slot if plan is not None else state.settings.context_length or 4096
    prediction = predict(
        cost,
        calibration,
        context=context,
        gpu_layers=plan.n_gpu_layers if plan is not None else 0,
        kv_cache_type=kv_type,
        correction=book.correction(calibration, exclude=digest, main_type=cost.main_type),
    )
    if unmeasured and prediction.decode is None:
        prediction = dataclasses.replace(prediction, why=f"{prediction.why}: {unmeasured}")
    answer["predicted"] = prediction.to_dict()
    return answer
