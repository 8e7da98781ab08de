"""The LoRA adapter set a request runs with: a value, for jobs, slots and the engine alike
(see :mod:`.adapters` for how the runner applies it)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from ..runner.protocol import AdapterUse

__all__ = ["NO_ADAPTERS", "AdapterLoadError", "AdapterSet"]


class AdapterLoadError(ValueError):
    """llama.cpp refused an adapter, or a request named one that is not loaded."""


@dataclass(frozen=True)
class AdapterSet:
    """The adapters a request runs with, as llama.cpp sees them: (digest, scale) pairs in
    digest order, zero scales left out (llama.cpp leaves them out too)."""

    uses: tuple[tuple[str, float], ...] = ()

    @classmethod
    def of(cls, uses: Iterable[AdapterUse]) -> AdapterSet:
        """The set of ``uses``; raises :class:`AdapterLoadError` for a repeated adapter or a
        scale that is not a finite number."""
        pairs: dict[str, float] = {}
        for use in uses:
            if use.digest in pairs:
                raise AdapterLoadError(f"adapter {use.digest} is named twice")
            scale = float(use.scale)
            if not math.isfinite(scale):
                raise AdapterLoadError(f"adapter {use.digest}: scale {use.scale!r} is not finite")
            pairs[use.digest] = scale
        return cls(tuple(sorted((d, s) for d, s in pairs.items() if s != 0.0)))

    @property
    def key(self) -> str:
        """What caches key on: empty for the base model alone."""
        return ",".join(f"{digest}*{scale!r}" for digest, scale in self.uses)

    def __bool__(self) -> bool:
        return bool(self.uses)

    def describe(self) -> str:
        """``base`` or ``3f2a9c01d4e5 x0.5, ...`` for logs."""
        if not self.uses:
            return "base"
        return ", ".join(f"{d.removeprefix('sha256:')[:12]} x{s:g}" for d, s in self.uses)


NO_ADAPTERS = AdapterSet()
