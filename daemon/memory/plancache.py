"""Memory plans kept on disk, so a model loaded again skips laying itself out.

Planning a load lays the model out with llama.cpp (``no_alloc`` trial loads): on the starter,
0.6-0.9 s of a cold start on a busy 2-core machine, as long as importing llama.cpp. The plan
depends on the model's files, the load's options and the memory the devices have free, so
a plan is kept under a key made of the files and options (each file's path, size and
modification time, every option of the runner's configuration, the llama.cpp build, each
device's total memory), beside each device's free memory when it was planned. It is used again
only while every device's free memory is within :data:`FREE_STEP` of that (the plan's own
margin absorbs less); further, or a change of any part of the key, plans again, so a stale plan
is never used; a plan that cannot be read is planned again. A distance rather than fixed steps
of free memory: on a busy machine free memory drifts, and one that hovered at a step's edge
planned again on most loads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ..runner.protocol import RunnerConfig
from .plan import Device, MemoryPlan

__all__ = ["FREE_STEP", "PlanCache", "plan_kept"]

log = logging.getLogger("localllm.runner")

FREE_STEP = 256 << 20
"""A kept plan is used while each device's free memory is within this many bytes of what it
was when the plan was made."""

# Options that say where a runner logs, what it is called or what its requests use (adapters
# are loaded per request), not how it loads.
_NOT_PLANNED = ("log_path", "draft_name", "adapters")
# Plans kept; the oldest go first.
_KEEP = 64


def _file(path: str | None) -> list[object]:
    if not path:
        return []
    stat = os.stat(path)
    return [str(path), stat.st_size, stat.st_mtime_ns]


class PlanCache:
    """Plans under ``folder``, one JSON file per key."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    @staticmethod
    def key(config: RunnerConfig, devices: Sequence[Device], build: str) -> str:
        """The key of ``config``'s plan on ``devices`` with llama.cpp ``build``."""
        options = dataclasses.asdict(config)
        for name in _NOT_PLANNED:
            options.pop(name, None)
        files = [
            _file(path)
            for path in (
                config.model_path,
                *config.extra_model_paths,
                config.projector,
                config.draft_model,
            )
        ]
        memory = [(d.name, d.kind, d.total) for d in devices]
        text = json.dumps([files, options, memory, build], sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()

    def get(self, key: str, devices: Sequence[Device]) -> MemoryPlan | None:
        """The plan kept under ``key`` if ``devices`` have about the free memory they had when
        it was made (within :data:`FREE_STEP` each), else None."""
        path = self.folder / f"{key}.json"
        try:
            kept = json.loads(path.read_text())
            if "free" not in kept:
                return None  # kept by an earlier version, under a key that held free memory
            plan = MemoryPlan.from_dict(kept["plan"])
            free = [int(value) for value in kept["free"]]
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("a kept memory plan could not be read (%s): planning again", exc)
            return None
        if len(free) != len(devices) or any(
            abs(device.free - then) >= FREE_STEP for device, then in zip(devices, free, strict=True)
        ):
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: kept longest
        return plan

    def put(self, key: str, plan: MemoryPlan, devices: Sequence[Device]) -> None:
        """Keep ``plan`` under ``key`` with ``devices``' free memory now (written whole or not
        at all; failures only logged)."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(
                "w", dir=self.folder, suffix=".tmp", delete=False
            ) as out:
                json.dump({"plan": plan.to_dict(), "free": [d.free for d in devices]}, out)
            os.replace(out.name, self.folder / f"{key}.json")
            kept = sorted(self.folder.glob("*.json"), key=lambda p: p.stat().st_mtime)
            for old in kept[:-_KEEP]:
                old.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("could not keep the memory plan: %s", exc)


def plan_kept(config: RunnerConfig, folder: Path | None) -> tuple[MemoryPlan, bool]:
    """The memory plan for ``config`` (see :func:`~.measure.plan_load`), and whether it was
    kept from an earlier load with the same files, options and free memory. Without a
    ``folder``, or split across RPC workers (whose memory is not measured here), planned."""
    import llama_cpp

    from .measure import host_device, llama_devices, plan_load

    if folder is None or config.rpc_workers:
        return plan_load(config), False
    llama_cpp.llama_backend_init()
    devices = [host_device(config.mapped_ram), *llama_devices()]
    cache = PlanCache(folder)
    key = cache.key(config, devices, getattr(llama_cpp, "__version__", ""))
    kept = cache.get(key, devices)
    if kept is not None:
        log.info("memory plan kept from an earlier load (same files, options, free memory)")
        return kept, True
    planned = plan_load(config)
    cache.put(key, planned, devices)
    return planned, False
