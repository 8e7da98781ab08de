"""What the runners measured while they served, and what it teaches the speed model.

Each finished request that ran alone on its model (no other stream sharing its steps) and is
long enough to say something (:data:`MIN_DECODED` generated tokens; :data:`MIN_PREFILLED`
prompt tokens evaluated, not taken from the cache) adds its decode and prefill rate to its
model's record. A model's *measured* rate is the median of its last :data:`KEPT` requests.

Against each served model's prediction from the probe alone, the measured rates give a
correction: the median over models of the seconds the prediction missed per decode step and
per prompt token (measured less predicted). It carries what the probe cannot see (the
runner's own work around each step, the machine's usual load) to models not served yet. The
decode step's miss is mostly work of the runner that no weight type changes, so every served
model teaches it; a prompt token's miss is mostly the matrix kernels' pace at the model's own
shapes, which differs by weight type and in either direction (measured here: the probe alone
put a Q4_1 model's prefill 11 % too slow and an F16 one's 16 % too fast), so it is learned
only from models whose main weight type is the predicted model's. The
records are kept per machine and thread count (the probe's key) in the user's cache dir, so
predictions improve with use across restarts.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import statistics
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from localllm._process import write_json
from localllm.gguf_info import inspect_gguf

from ..memory.layout import layout_from_gguf
from .model import Calibration, ModelCost, model_cost, predict

__all__ = ["KEPT", "MIN_DECODED", "MIN_PREFILLED", "Gap", "Observation", "SpeedBook"]

log = logging.getLogger("localllm.speedbook")

KEPT = 16
"""Requests remembered per model."""
MIN_DECODED = 16
"""Generated tokens a request needs for its decode rate to count."""
MIN_PREFILLED = 64
"""Prompt tokens evaluated (not from the cache) a request needs for its prefill rate to count."""


class Gap(NamedTuple):
    """What the probe alone missed for one served model, in seconds (measured less
    predicted; None where not measured)."""

    decode: float | None
    """Per decode step."""
    prefill: float | None
    """Per prompt token."""
    main_type: str | None
    """The model's main weight type (:attr:`~localllm.daemon.speed.model.ModelCost.main_type`)."""


@dataclass
class Observation:
    """One served model's measured rates."""

    name: str
    """The model's name."""
    paths: list[str]
    """Its GGUF file (or parts)."""
    kv_cache_type: str = "f16"
    """How its KV cache was stored."""
    gpu_layers: int = 0
    """Layers it had on a GPU (its rates are then not the CPU's)."""
    decode: list[float] = field(default_factory=list)
    """Recent single-stream decode tokens/s."""
    prefill: list[float] = field(default_factory=list)
    """Recent prompt tokens/s."""
    contexts: list[int] = field(default_factory=list)
    """Tokens in the KV cache during each decode measured (prompt plus half the answer)."""

    @property
    def measured_decode(self) -> float | None:
        """Median recent decode rate."""
        return statistics.median(self.decode) if self.decode else None

    @property
    def measured_prefill(self) -> float | None:
        """Median recent prefill rate."""
        return statistics.median(self.prefill) if self.prefill else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return dataclasses.asdict(self)


def _keep(values: list[Any], value: Any) -> None:
    values.append(value)
    del values[:-KEPT]


class SpeedBook:
    """Measured rates per model digest, kept in ``folder`` under the probe's ``key``."""

    def __init__(self, folder: Path, key: Callable[[], str]) -> None:
        self._folder = folder
        self._key = key
        self._lock = threading.Lock()
        self._entries: dict[str, Observation] | None = None
        self._costs: dict[str, ModelCost | None] = {}

    def _file(self) -> Path:
        return self._folder / f"{self._key()}.json"

    def _load(self) -> dict[str, Observation]:
        if self._entries is None:
            entries: dict[str, Observation] = {}
            try:
                data = json.loads(self._file().read_text())
                for digest, raw in data.items():
                    entries[str(digest)] = Observation(**raw)
            except (OSError, ValueError, TypeError):
                pass
            self._entries = entries
        return self._entries

    def _save(self, entries: dict[str, Observation]) -> None:
        file = self._file()
        try:
            write_json(file, {k: v.to_dict() for k, v in entries.items()})
        except OSError as exc:
            log.warning("could not keep measured speeds in %s: %s", file, exc)

    def observe(
        self,
        digest: str,
        name: str,
        paths: Sequence[str],
        *,
        alone: bool,
        decoded: int,
        decode_rate: float,
        prefilled: int,
        prefill_rate: float,
        context: int,
        kv_cache_type: str = "f16",
        gpu_layers: int = 0,
    ) -> bool:
        """Record one finished request's rates; True when it counted (see the module
        docstring for which do)."""
        counts_decode = alone and decoded >= MIN_DECODED and decode_rate > 0
        counts_prefill = alone and prefilled >= MIN_PREFILLED and prefill_rate > 0
        if not (counts_decode or counts_prefill):
            return False
        with self._lock:
            entries = self._load()
            entry = entries.get(digest)
            if entry is None or entry.paths != list(paths) or entry.gpu_layers != gpu_layers:
                entry = entries[digest] = Observation(name, list(paths), kv_cache_type, gpu_layers)
            entry.name = name
            if counts_decode:
                _keep(entry.decode, decode_rate)
                _keep(entry.contexts, context)
            if counts_prefill:
                _keep(entry.prefill, prefill_rate)
            self._save(entries)
        return True

    def measured(self, digest: str) -> Observation | None:
        """The record of the model with this digest, if it was measured."""
        with self._lock:
            return self._load().get(digest)

    def _cost(self, entry: Observation) -> ModelCost | None:
        key = "\n".join(entry.paths) + entry.kv_cache_type
        if key not in self._costs:
            try:
                parts = [inspect_gguf(p) for p in entry.paths]
                layout = layout_from_gguf(parts, entry.kv_cache_type)
                self._costs[key] = model_cost(parts, layout.kv_per_cell)
            except Exception:  # a model removed since: nothing to learn from it
                self._costs[key] = None
        return self._costs[key]

    def gaps(self, calibration: Calibration, exclude: str | None = None) -> dict[str, Gap]:
        """Per served model (by digest): measured less predicted-from-the-probe seconds per
        decode step and per prompt token (None where not measured or not predicted)."""
        with self._lock:
            entries = dict(self._load())
        found: dict[str, Gap] = {}
        for digest, entry in entries.items():
            if digest == exclude or entry.gpu_layers:
                continue
            cost = self._cost(entry)
            if cost is None or any(t not in calibration.types for t in cost.types):
                continue
            context = round(statistics.median(entry.contexts)) if entry.contexts else 0
            guess = predict(cost, calibration, context=context, kv_cache_type=entry.kv_cache_type)
            decode = entry.measured_decode
            prefill = entry.measured_prefill
            found[digest] = Gap(
                1 / decode - 1 / guess.decode_full if decode and guess.decode_full else None,
                1 / prefill - 1 / guess.prefill if prefill and guess.prefill else None,
                cost.main_type,
            )
        return found

    def correction(
        self,
        calibration: Calibration,
        exclude: str | None = None,
        main_type: str | None = None,
    ) -> tuple[float, float]:
        """(seconds a decode step, seconds a prompt token) to add to the predictions of a
        model whose main weight type is ``main_type``: the median gap over served models (for
        a prompt token, over those of the same main type; see the module docstring), 0 where
        none was measured. ``exclude`` leaves one model out (to predict that model honestly)."""
        gaps = self.gaps(calibration, exclude).values()
        decode = [gap.decode for gap in gaps if gap.decode is not None]
        prefill = [
            gap.prefill
            for gap in gaps
            if gap.prefill is not None and main_type is not None and gap.main_type == main_type
        ]
        return (
            statistics.median(decode) if decode else 0.0,
            statistics.median(prefill) if prefill else 0.0,
        )
