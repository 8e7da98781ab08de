"""Request options → what the runner needs: sampling options and the runner's load config.

Ollama's layering: the model's params layer gives defaults, the request's ``options`` override
them. Four options change how the model is *loaded* (``num_ctx``, ``num_batch``, ``num_gpu``,
``num_thread``); a request whose load options differ from the loaded runner's reloads it.
Unknown option names are ignored (as Ollama does); known ones with a bad type or range are a
400 naming the option.
"""

from __future__ import annotations

import logging
from typing import Any

from localllm.models import OPTION_TYPES, LocalModel
from localllm.settings import Settings

from .errors import HTTPProblem
from .runner.protocol import RunnerConfig, SamplingOptions

__all__ = ["LOAD_OPTIONS", "merge_options", "runner_config", "sampling_options"]

log = logging.getLogger("localllm.daemon")

LOAD_OPTIONS = frozenset({"num_ctx", "num_batch", "num_gpu", "num_thread"})

# Inclusive bounds; None means unbounded on that side.
_RANGES: dict[str, tuple[float | None, float | None]] = {
    "num_ctx": (1, 1 << 20),
    "num_batch": (1, 1 << 16),
    "num_gpu": (-1, 1 << 12),
    "num_thread": (0, 1 << 10),
    "num_predict": (-2, 1 << 24),
    "num_keep": (-1, None),
    "num_draft": (0, 64),
    "top_k": (0, 1 << 20),
    "repeat_last_n": (-1, 1 << 20),
    "temperature": (0, None),
    "top_p": (0, 1),
    "min_p": (0, 1),
    "typical_p": (0, 1),
    "repeat_penalty": (0, None),
    "presence_penalty": (-100, 100),
    "frequency_penalty": (-100, 100),
    "seed": (-(1 << 63), (1 << 64) - 1),
}

_SAMPLING_FIELDS = (
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "typical_p",
    "repeat_penalty",
    "repeat_last_n",
    "presence_penalty",
    "frequency_penalty",
    "num_predict",
    "num_keep",
    "num_draft",
)


def _check(key: str, value: Any, prefix: str) -> Any:
    expected = OPTION_TYPES[key]
    where = f"{prefix}{key}"
    if key == "stop":
        if value is None:
            return []
        if isinstance(value, str):
            return [value]
        if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
            raise HTTPProblem(400, f"{where} must be a string or a list of strings", param=where)
        return value
    if expected is bool:
        if not isinstance(value, bool):
            raise HTTPProblem(400, f"{where} must be true or false", param=where)
        return value
    if isinstance(value, bool) or value is None:
        raise HTTPProblem(400, f"{where} must be a number, got {value!r}", param=where)
    if expected is int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int):
            raise HTTPProblem(400, f"{where} must be an integer, got {value!r}", param=where)
    elif not isinstance(value, int | float) or value != value:  # NaN compares unequal
        raise HTTPProblem(400, f"{where} must be a number, got {value!r}", param=where)
    low, high = _RANGES.get(key, (None, None))
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise HTTPProblem(400, f"{where} must be {bounds}, got {value!r}", param=where)
    return value


def merge_options(
    model: LocalModel, request_options: dict[str, Any] | None, prefix: str = "options."
) -> dict[str, Any]:
    """The model's parameters overridden by the request's options, validated."""
    merged: dict[str, Any] = {}
    for source, where in ((model.parameters, "model parameter "), (request_options or {}, prefix)):
        if not isinstance(source, dict):
            raise HTTPProblem(400, "options must be an object", param="options")
        for key, value in source.items():
            if key not in OPTION_TYPES:
                log.debug("ignoring unknown option %r", key)
                continue
            merged[key] = _check(key, value, where)
    return merged


def sampling_options(options: dict[str, Any]) -> SamplingOptions:
    """SamplingOptions for the runner from merged options."""
    sampling = SamplingOptions()
    for key in _SAMPLING_FIELDS:
        if key in options:
            setattr(sampling, key, options[key])
    if sampling.num_predict == -2:  # Ollama's "fill the context": stop there, no shift
        sampling.num_predict = -1
        sampling.shift = False
    if "seed" in options:
        seed = int(options["seed"])
        # llama.cpp seeds are uint32 and -1 means random; fold others into range.
        sampling.seed = -1 if seed < 0 else seed & 0xFFFFFFFF
    if options.get("stop"):
        sampling.stop = list(options["stop"])
    return sampling


def runner_config(settings: Settings, model: LocalModel, options: dict[str, Any]) -> RunnerConfig:
    """How the runner for ``model`` should be loaded for a request with ``options``."""
    n_ctx = int(options.get("num_ctx", settings.context_length))
    trained = model.info.context_length
    if trained:
        n_ctx = min(n_ctx, trained)
    first, *rest = model.gguf_paths
    return RunnerConfig(
        model_path=str(first),
        extra_model_paths=[str(part) for part in rest],
        n_slots=settings.num_parallel,
        n_ctx_per_slot=max(n_ctx, 64),
        n_batch=int(options.get("num_batch", 512)),
        n_threads=int(options.get("num_thread", settings.num_threads)),
        n_gpu_layers=int(options.get("num_gpu", -1)),
        kv_cache_type=settings.kv_cache_type,
        flash_attention=settings.flash_attention,
        num_draft=settings.num_draft if settings.speculative != "off" else 0,
        kv_cache_dir=str(settings.kv_cache_dir),
        kv_cache_ram=settings.kv_cache_ram,
        kv_cache_disk=settings.kv_cache_disk,
        projector=str(model.projector_path) if model.projector_path is not None else None,
    )
