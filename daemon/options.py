"""Request options → what the runner needs: the options checked and merged, and the sampling
options (the runner's load config is :mod:`.loadconfig`'s).

Ollama's layering: the model's params layer gives defaults, the request's ``options`` override
them. Ten options change how the model is *loaded* (``num_ctx``, ``num_parallel``,
``num_batch``, ``num_gpu``, ``main_gpu``, ``use_mmap``, ``use_mlock``, ``num_thread``,
``draft_model``, ``rpc_workers``: :data:`LOAD_OPTIONS`); a request whose load options differ
from the loaded runner's reloads it. ``rpc_workers`` (``host:port,...``; empty for none)
overrides ``LOCALLLM_RPC_WORKERS``. ``num_ctx`` and ``num_gpu`` not given (nor
``LOCALLLM_CONTEXT_LENGTH``) are left to the memory plan (:mod:`localllm.daemon.memory.plan`); a
``num_ctx`` above
the trained length is honoured, and the plan warns about it. ``keep_alive`` is a model parameter
only (a Modelfile's ``PARAMETER keep_alive``, the model's default): a request gives its own at
the top level.

No option is ignored without a word: an unknown name is a 400 naming it (Ollama only logs a
warning), and so is a known one with a bad type or range. Options llama.cpp fixes to one
behaviour (``tfs_z``, ``penalize_newline``, ``numa``, ...:
:data:`~localllm.store.models.FIXED_OPTIONS`) are honoured at that value and refused with the
reason at any other. A ``null`` value means "not given".

``adapters`` chooses and rescales a model's LoRA adapters for one request, as llama-server's
per-request ``lora`` does: ``[{"id": 0, "scale": 0.5}]``, ``id`` the adapter's place in the
model's list (``show``; a ``digest`` prefix of 12 or more hex digits names it too); adapters
not listed are off for the request, so ``[]`` runs the base model alone. Requests of different
adapter sets are served by one runner, taking turns step by step
(:mod:`localllm.daemon.lora.adapters`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from localllm._exceptions import SettingsError
from localllm.settings import parse_rpc_workers
from localllm.store.models import (
    FIXED_OPTIONS,
    LOAD_OPTIONS,
    OPTION_TYPES,
    LocalModel,
    fixed_option_problem,
)

from .errors import HTTPProblem
from .runner.protocol import AdapterUse, SamplingOptions

__all__ = [
    "LOAD_OPTIONS",
    "merge_options",
    "named_options",
    "sampling_options",
]


# Inclusive bounds; None means unbounded on that side.
_RANGES: dict[str, tuple[float | None, float | None]] = {
    "num_ctx": (64, 1 << 20),
    "num_parallel": (1, 256),
    "num_batch": (1, 1 << 16),
    "num_gpu": (-1, 1 << 12),
    "main_gpu": (0, 1 << 8),
    "num_thread": (0, 1 << 10),
    "num_predict": (-2, 1 << 24),
    "num_keep": (-1, None),
    "num_draft": (0, 64),
    "mirostat": (0, 2),
    "mirostat_tau": (0, None),
    "mirostat_eta": (0, None),
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
    "thinking_budget": (-1, 1 << 24),
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
    "mirostat",
    "mirostat_tau",
    "mirostat_eta",
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
    if key == "rpc_workers":
        if not isinstance(value, str):
            raise HTTPProblem(400, f"{where} must be a string of host:port,...", param=where)
        try:
            return ",".join(parse_rpc_workers(value, where))
        except SettingsError as exc:
            raise HTTPProblem(400, str(exc), param=where) from None
    if expected is str:
        if not isinstance(value, str) or not value.strip():
            raise HTTPProblem(400, f"{where} must be a model name, got {value!r}", param=where)
        return value.strip()
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


def named_options(
    body: Any, names: Iterable[str], num_predict: int | None = None
) -> dict[str, Any]:
    """Request options from the fields of an API's request ``body`` that carry Ollama's
    option of the same name (those given: not None), and ``num_predict`` when given."""
    options: dict[str, Any] = {} if num_predict is None else {"num_predict": num_predict}
    for name in names:
        value = getattr(body, name)
        if value is not None:
            options[name] = value
    return options


def merge_options(
    model: LocalModel, request_options: dict[str, Any] | None, prefix: str = "options."
) -> dict[str, Any]:
    """The model's parameters overridden by the request's options, validated."""
    merged: dict[str, Any] = {}
    for source, where in ((model.parameters, "model parameter "), (request_options or {}, prefix)):
        if not isinstance(source, dict):
            raise HTTPProblem(400, "options must be an object", param="options")
        for key, value in source.items():
            if value is None and key != "stop":
                continue  # JSON's way of not giving it
            if key == "keep_alive":
                if source is model.parameters:
                    continue  # the scheduler applies it (validated when the model was created)
                raise HTTPProblem(
                    400,
                    f"{where}keep_alive is not an option: give keep_alive at the top level of "
                    "the request",
                    param=f"{where}keep_alive",
                )
            if key in FIXED_OPTIONS:
                if (problem := fixed_option_problem(key, value)) is not None:
                    raise HTTPProblem(400, f"{where}{key}: {problem}", param=f"{where}{key}")
                continue
            if key == "adapters" and source is not model.parameters:
                merged[key] = _adapters_option(model, value, f"{where}{key}")
                continue
            if key not in OPTION_TYPES:
                raise HTTPProblem(400, f"unknown option {where}{key}", param=f"{where}{key}")
            merged[key] = _check(key, value, where)
    return merged


def _adapters_option(model: LocalModel, value: Any, where: str) -> list[AdapterUse]:
    """A request's ``adapters`` (llama-server's ``lora`` shape) as the adapters it runs with."""
    adapters = model.adapters
    if not isinstance(value, list) or not all(isinstance(e, dict) for e in value):
        raise HTTPProblem(
            400, f'{where} must be a list of {{"id": N, "scale": S}} objects', param=where
        )
    chosen: dict[str, float] = {}
    for index, entry in enumerate(value):
        at = f"{where}[{index}]"
        unknown = set(entry) - {"id", "digest", "scale"}
        if unknown:
            raise HTTPProblem(400, f"{at} has unknown field {sorted(unknown)[0]!r}", param=at)
        if ("id" in entry) == ("digest" in entry):
            raise HTTPProblem(400, f"{at} needs an id or a digest (one of them)", param=at)
        digest = _adapter_digest(model.name.short, adapters, entry, at)
        scale = entry.get("scale", 1.0)
        if isinstance(scale, bool) or not isinstance(scale, int | float) or scale != scale:
            raise HTTPProblem(400, f"{at}.scale must be a number, got {scale!r}", param=at)
        if abs(scale) == float("inf"):
            raise HTTPProblem(400, f"{at}.scale must be finite", param=at)
        if digest in chosen:
            raise HTTPProblem(400, f"{at} names an adapter listed already", param=at)
        chosen[digest] = float(scale)
    return [AdapterUse(digest, scale) for digest, scale in chosen.items()]


def _adapter_digest(name: str, adapters: list[Any], entry: dict[str, Any], at: str) -> str:
    if "id" in entry:
        index = entry["id"]
        if isinstance(index, bool) or not isinstance(index, int):
            raise HTTPProblem(400, f"{at}.id must be an integer", param=at)
        if not 0 <= index < len(adapters):
            held = f"adapters 0 to {len(adapters) - 1}" if adapters else "no adapters"
            raise HTTPProblem(400, f"{at}.id is {index}, but {name} has {held}", param=at)
        return str(adapters[index].digest)
    prefix = str(entry["digest"]).lower().removeprefix("sha256:").removeprefix("sha256-")
    matches = [a.digest for a in adapters if a.digest.removeprefix("sha256:").startswith(prefix)]
    if len(prefix) < 12 or len(matches) != 1:
        raise HTTPProblem(
            400, f"{at}.digest {entry['digest']!r} names none of {name}'s adapters", param=at
        )
    return str(matches[0])


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
