"""Runners shared by models: one runner serves every model made of the same GGUF blob and
loaded with the same options, each with its own LoRA adapters.

A model made with a Modelfile ``ADAPTER`` line (or a copy of a model, or one with another
template or system prompt) has the weights of its base; loading the base again for it would
double the memory for nothing. The scheduler keeps one :class:`~.scheduler.LoadedModel` per
model name (its keep-alive, its requests, its recent timings) and one :class:`RunnerShare` per
runner process: the runner, its slot permits (for every model on it together: the runner has
one set of slots), the models on it, and the adapters loaded on its base model.

The base is loaded once and counted once: the memory plan, the memory reservations of other
loads, ``max_loaded_models`` and the unloading of idle models to make room all count the
runner, not its models; ``/api/ps`` reports the runner's memory under the model that loaded it
and, for each other model on it, only what its adapters add. The runner stops once its last
model is unloaded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any, Protocol

from localllm.store.models import LocalModel

from ..runner.protocol import AdapterFile, AdapterStats, AdapterUse, RunnerConfig


class Member(Protocol):
    """What a share reads of a model on its runner (the scheduler's ``LoadedModel``)."""

    key: str
    model: LocalModel
    config: RunnerConfig
    handed: int
    closing: bool
    share: RunnerShare

    @property
    def name(self) -> str:
        """The model's name as people write it."""

    @property
    def pinned(self) -> bool:
        """Kept loaded forever."""

    def busy(self) -> bool:
        """True while requests use or wait for it."""

    def alive(self) -> bool:
        """True while its runner runs and it is not being unloaded."""


class AdapterRunner(Protocol):
    """A runner that loads LoRA adapters (the runner process; unit tests' fakes)."""

    async def load_adapters(self, files: list[AdapterFile]) -> list[AdapterStats]:
        """Load adapters on the base model; every adapter it holds afterwards."""


__all__ = [
    "AdapterRunner",
    "Member",
    "RunnerShare",
    "adapter_files",
    "adapter_uses",
    "runner_for",
    "runner_queue",
    "working_runners",
]


def adapter_files(model: LocalModel) -> list[AdapterFile]:
    """The LoRA adapter files of ``model``, for a runner to load."""
    return [AdapterFile(a.digest, str(a.path)) for a in model.adapters]


def adapter_uses(config: RunnerConfig) -> list[AdapterUse]:
    """What a request runs with: the adapters (and scales) its runner config carries."""
    return [AdapterUse(a.digest, a.scale) for a in config.adapters]


def runner_for(models: Iterable[Member], key: str, config: RunnerConfig) -> Member | None:
    """A loaded model whose runner ``key`` can share: the same GGUF blob (``model_path``) and
    the same load options (the config's identity leaves the adapters out)."""
    for other in models:
        if other.key != key and other.alive() and other.config == config:
            return other
    return None


def _shares(models: Iterable[Member]) -> list[RunnerShare]:
    return list({id(m.share): m.share for m in models}.values())


def runner_queue(models: Iterable[Member]) -> int:
    """Requests waiting in the runners' own queues (each runner counted once)."""
    return sum(
        max(0, share.handed - owner.config.n_slots)
        for share in _shares(models)
        if (owner := share.owner) is not None
    )


def working_runners(models: Iterable[Member]) -> dict[str, Any]:
    """The runners with requests, by the name of the model that loaded each (for the
    daemon's share of the cores: a runner once, whatever models use it)."""
    working: dict[str, Any] = {}
    for share in _shares(models):
        owner = share.owner
        if owner is not None and share.handed > 0 and any(m.alive() for m in share.members):
            working[owner.name] = share.runner
    return working


class RunnerShare:
    """One runner and the models it serves."""

    def __init__(self, runner: Any, permits: int) -> None:
        self.runner = runner
        """The runner process (or an in-process fake in unit tests)."""
        self.slots = asyncio.Semaphore(permits)
        """Permits to hand a request to the runner, for all its models together."""
        self.members: list[Member] = []
        """The models it serves, the one that loaded it first."""
        self.adapters: dict[str, AdapterStats] = {}
        """The LoRA adapters loaded on its base model, by digest."""

    @property
    def owner(self) -> Member | None:
        """The model that loaded the runner (or the oldest still on it)."""
        return self.members[0] if self.members else None

    @property
    def handed(self) -> int:
        """Requests handed to the runner by all its models."""
        return sum(m.handed for m in self.members)

    def busy(self) -> bool:
        """True while any of its models has requests."""
        return any(m.busy() for m in self.members)

    def pinned(self) -> bool:
        """True when any of its models is kept loaded forever."""
        return any(m.pinned for m in self.members)

    def live(self, leaving: Member | None = None) -> list[Member]:
        """Its models not being unloaded (``leaving`` excepted)."""
        return [m for m in self.members if m is not leaving and not m.closing]

    def others(self, model: Member) -> list[str]:
        """The names of the other models on this runner."""
        return [m.name for m in self.members if m is not model and not m.closing]

    async def load_adapters(self, model: LocalModel) -> None:
        """Load ``model``'s adapters on the runner unless it holds them already; a refused
        one raises the runner's error (a ``bad_request`` naming it)."""
        missing = [f for f in adapter_files(model) if f.digest not in self.adapters]
        if not missing:
            return
        runner: AdapterRunner = self.runner
        loaded = await runner.load_adapters(missing)
        self.adapters = {a.digest: a for a in loaded}

    def adapter_bytes(self, model: LocalModel) -> int:
        """Bytes the adapters of ``model`` take on the runner."""
        return sum(
            self.adapters[a.digest].size for a in model.adapters if a.digest in self.adapters
        )

    def report(self, loaded: Member) -> dict[str, Any]:
        """What ``/api/ps`` and the stats stream add for a model with LoRA adapters or on a
        shared runner: its ``adapters`` and the ``runner`` (the model that loaded it, every
        model on it, the bytes all its adapters take). Empty for a model alone on its runner
        without adapters."""
        names = [m.name for m in self.members if not m.closing]
        if not loaded.model.adapters and len(names) < 2:
            return {}
        owner = self.owner
        return {
            "adapters": self.describe_adapters(loaded.model),
            "runner": {
                "loaded_by": owner.name if owner is not None else loaded.name,
                "models": names,
                "adapter_bytes": sum(a.size for a in self.adapters.values()),
            },
        }

    def describe_adapters(self, model: LocalModel) -> list[dict[str, Any]]:
        """``model``'s adapters for ``/api/ps``: digest, the scale requests run with by
        default, and the bytes each takes on the runner."""
        return [
            {
                "digest": a.digest,
                "scale": a.scale,
                "size": self.adapters[a.digest].size if a.digest in self.adapters else 0,
            }
            for a in model.adapters
        ]
