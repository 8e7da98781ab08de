"""What every route handler shares: settings, the store, the scheduler and the metrics."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Request

from localllm import testhooks
from localllm.settings import Settings
from localllm.store.models import ModelCache
from localllm.store.store import Store

from .metrics import Metrics
from .scheduler import Scheduler

if TYPE_CHECKING:
    from .discover import Discovery
    from .speed.book import SpeedBook
    from .speed.watch import SpeedWatch

__all__ = ["DaemonState", "StateDep", "get_state"]


@dataclass
class DaemonState:
    """The daemon's long-lived objects."""

    settings: Settings
    """Configuration."""
    store: Store
    """The model store."""
    scheduler: Scheduler
    """Runners and their slots."""
    metrics: Metrics
    """Prometheus registry."""
    started_at: float = field(default_factory=time.time)
    """When the daemon started."""
    discovery: Discovery = field(init=False)
    """Hub repositories planned and predicted on this machine (:mod:`.api.discover`)."""
    speedbook: SpeedBook = field(init=False)
    """Speeds the runners measured while serving (:mod:`localllm.daemon.speed.book`)."""
    speedwatch: SpeedWatch = field(init=False)
    """Measures this machine's speed at the first quiet moment
    (:mod:`localllm.daemon.speed.watch`)."""
    models: ModelCache = field(init=False)
    """The store's models, resolved once per manifest (every request names one)."""

    def __post_init__(self) -> None:
        from .discover import wire

        self.models = ModelCache(self.store)
        self.discovery, self.speedbook, self.speedwatch = wire(self.settings, self.scheduler)

    @classmethod
    def create(cls, settings: Settings) -> DaemonState:
        """Build the state for ``settings`` (no runner is started yet)."""
        metrics = Metrics()
        return cls(
            settings=settings,
            store=Store(settings.data_dir, pause=testhooks.store_pause(settings.data_dir)),
            scheduler=Scheduler(settings, on_load=metrics.observe_load),
            metrics=metrics,
        )


async def get_state(request: Request) -> DaemonState:
    """FastAPI dependency: the daemon's state (async: FastAPI runs a plain function
    dependency in its thread pool, a thread hop for every request)."""
    state: DaemonState = request.app.state.daemon
    return state


StateDep = Annotated[DaemonState, Depends(get_state)]
"""Route parameter type that receives the daemon's state."""
