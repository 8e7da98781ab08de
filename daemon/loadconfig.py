"""How a request's runner is loaded, decided in one pass (:func:`runner_config`): the merged
options' load fields (:data:`~localllm.daemon.options.LOAD_OPTIONS`) over the settings, the
LoRA adapters, the draft model, the RPC workers, and the memory plan left to the runner.

The draft model for speculative decoding (:func:`draft_for`): the ``draft_model`` option (a
request's, else the model's ``PARAMETER``) wins over the Modelfile's ``DRAFT`` layer, which wins
over ``LOCALLLM_DRAFT_MODEL``. ``LOCALLLM_SPECULATIVE=auto`` drafts with it when there is one
(n-gram lookup otherwise); ``draft`` makes a missing draft a 400; ``ngram`` and ``off`` use no
draft model, and a ``draft_model`` option under them is a 400 rather than silently ignored. A
draft whose vocabulary does not match the model's is a 400 naming both, except the setting's
under ``auto`` (it applies to every model: others fall back to n-gram with a logged warning).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localllm._exceptions import LocalLLMError, ModelNotFoundError
from localllm.gguf_info import GGUFInfo, draft_incompatibility
from localllm.settings import Settings, parse_rpc_workers
from localllm.store.models import LocalModel, load_model

from .errors import HTTPProblem
from .runner.protocol import AdapterUse, RunnerConfig

__all__ = [
    "DraftChoice",
    "adapter_choice",
    "draft_for",
    "drafter_label",
    "runner_config",
]

log = logging.getLogger("localllm.daemon")


def adapter_choice(model: LocalModel, options: dict[str, Any]) -> list[AdapterUse]:
    """The adapters a request runs with: its ``adapters`` option, else the model's own, at
    their Modelfile scales."""
    if "adapters" in options:
        return list(options["adapters"])
    return [AdapterUse(a.digest, a.scale) for a in model.adapters]


@dataclass(frozen=True)
class DraftChoice:
    """The draft model a runner loads."""

    path: str
    """Its GGUF."""
    name: str
    """What reports call it: the model's name, or the draft layer's GGUF name."""


@dataclass(frozen=True)
class _DraftSource:
    """Where a runner's draft model comes from (before it is read)."""

    name: str | None
    """The model to load as the draft; None: the Modelfile's ``DRAFT`` layer."""
    where: str
    """What a 400 about it names."""
    strict: bool
    """A problem with it is a 400 (else: a logged warning, and n-gram drafting)."""


def _draft_source(
    settings: Settings, model: LocalModel, options: dict[str, Any]
) -> _DraftSource | None:
    """Which draft the precedence picks (the module's docstring); None: none to load."""
    mode = settings.speculative
    requested = options.get("draft_model")
    if requested is not None and mode in ("ngram", "off"):
        raise HTTPProblem(
            400,
            f"draft_model {requested!r} needs LOCALLLM_SPECULATIVE auto or draft (it is {mode})",
            param="options.draft_model",
        )
    if mode in ("ngram", "off") or model.info.is_embedding_only:
        return None
    if requested is not None:
        return _DraftSource(requested, "options.draft_model", strict=True)
    if model.draft_layer is not None:
        return _DraftSource(None, "model", strict=True)
    if settings.draft_model:
        return _DraftSource(settings.draft_model, "LOCALLLM_DRAFT_MODEL", strict=mode == "draft")
    if mode == "draft":
        raise HTTPProblem(
            400,
            f"LOCALLLM_SPECULATIVE is draft but {model.name.short} has no draft model: "
            "add a DRAFT line to its Modelfile, set LOCALLLM_DRAFT_MODEL or pass "
            "options.draft_model",
            param="model",
        )
    return None


def _draft_model(model: LocalModel, source: _DraftSource) -> tuple[GGUFInfo, DraftChoice]:
    """The draft's header and where it is: the Modelfile's layer, or a model of the store."""
    if source.name is None:
        info, path = model.draft_info, model.draft_path
        assert info is not None and path is not None
        return info, DraftChoice(str(path), info.name or f"draft of {model.name.short}")
    name, where = source.name, source.where
    try:
        draft = load_model(model.store, name)
        info = draft.info
    except ModelNotFoundError:
        raise HTTPProblem(
            404,
            f"draft model {name!r} not found; try `localllm pull {name}`",
            param=where,
            code="model_not_found",
        ) from None
    except LocalLLMError as exc:
        raise HTTPProblem(400, f"draft model {name!r}: {exc}", param=where) from None
    if len(draft.gguf_paths) > 1:
        raise HTTPProblem(400, f"draft model {name!r} is split in parts; use one file", param=where)
    return info, DraftChoice(str(draft.gguf_path), draft.name.short)


def draft_for(settings: Settings, model: LocalModel, options: dict[str, Any]) -> DraftChoice | None:
    """The draft model for ``model`` under these options and settings (see the module's
    docstring for the precedence); None for n-gram lookup or no speculation."""
    source = _draft_source(settings, model, options)
    if source is None:
        return None
    try:
        info, choice = _draft_model(model, source)
    except HTTPProblem as exc:
        if source.strict:
            raise
        log.warning("LOCALLLM_DRAFT_MODEL unusable, drafting with n-grams: %s", exc.message)
        return None
    reason = draft_incompatibility(model.info, info)
    if reason is not None:
        message = (
            f"draft model {choice.name} cannot draft for {model.name.short}: its vocabulary "
            f"is incompatible ({reason})"
        )
        if source.strict:
            raise HTTPProblem(400, message, param=source.where)
        log.warning("%s; drafting with n-grams instead", message)
        return None
    return choice


def drafter_label(config: RunnerConfig) -> str:
    """Which drafter a runner uses, for reports: ``draft:<name>``, ``ngram`` or ``off``."""
    if config.draft_model:
        return f"draft:{config.draft_name or Path(config.draft_model).name}"
    return "ngram" if config.num_draft > 0 else "off"


def runner_config(settings: Settings, model: LocalModel, options: dict[str, Any]) -> RunnerConfig:
    """How the runner for ``model`` should be loaded for a request with ``options``: a context
    of 0 and GPU layers of -1 leave the choice to the runner's memory plan."""
    n_ctx = int(options.get("num_ctx", settings.context_length))
    first, *rest = model.gguf_paths
    adapters = adapter_choice(model, options)
    draft = draft_for(settings, model, options)
    rpc_workers = (
        parse_rpc_workers(options["rpc_workers"])
        if "rpc_workers" in options
        else settings.rpc_workers
    )
    n_slots = int(options.get("num_parallel", settings.num_parallel))
    return RunnerConfig(
        model_path=str(first),
        extra_model_paths=[str(part) for part in rest],
        n_slots=n_slots,
        n_ahead=n_slots if settings.prefill_ahead < 0 else settings.prefill_ahead,
        n_ctx_per_slot=n_ctx,
        n_batch=int(options.get("num_batch", 512)),
        n_threads=int(options.get("num_thread", settings.num_threads)),
        # A count asked for is kept as asked; the setting's is the most the governor uses.
        fixed_threads=bool(options.get("num_thread")) or not settings.governor,
        n_gpu_layers=int(options.get("num_gpu", -1)),
        main_gpu=int(options.get("main_gpu", 0)),
        use_mmap=bool(options.get("use_mmap", True)),
        use_mlock=bool(options.get("use_mlock", False)),
        kv_cache_type=settings.kv_cache_type,
        flash_attention=settings.flash_attention,
        num_draft=settings.num_draft if settings.speculative != "off" else 0,
        draft_model=draft.path if draft is not None else None,
        draft_name=draft.name if draft is not None else None,
        kv_cache_dir=str(settings.kv_cache_dir),
        kv_cache_ram=settings.kv_cache_ram,
        kv_cache_disk=settings.kv_cache_disk,
        projector=str(model.projector_path) if model.projector_path is not None else None,
        rpc_workers=list(rpc_workers),
        memory_plan=True,
        adapters=adapters,
        gpu_memory=settings.gpu_memory,
    )
