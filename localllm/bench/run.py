"""A benchmark run: a :class:`Workload` (a concurrency sweep, a conversation trace replayed
turn by turn, then a prompt-length sweep cold and cached) against one or more :class:`Target` s,
interleaved level by level so that machine noise hits every target alike (:class:`Bench`,
:func:`run_bench`); each level summarized as a :class:`~.stats.Point`, everything kept in a
:class:`BenchResult` (its JSON document: :mod:`.schema`)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from .._exceptions import BenchError
from ..store.models import LOAD_OPTIONS
from .conversation import Conversation, Histories, run_turn
from .drivers import Completion, Driver, describe_error
from .load import PromptMaker, run_level
from .schema import RATIO_FIGURES, SCHEMA_ID
from .stats import Point, Sample, summarize

__all__ = [
    "DEFAULT_LEVELS",
    "DEFAULT_PROMPT_LENGTHS",
    "Bench",
    "BenchResult",
    "PointCallback",
    "ProgressCallback",
    "Stoppable",
    "Target",
    "Workload",
    "run_bench",
]

DEFAULT_LEVELS = (1, 2, 4, 8, 16)
"""Concurrent clients of the default sweep (capped at twice the model's slots)."""
DEFAULT_PROMPT_LENGTHS = (128, 512, 1024, 2048, 4096)
"""Prompt tokens of the default prompt-length sweep (capped by the context of a slot)."""


class Stoppable(Protocol):
    """Something started for a target that must be stopped with the run (a daemon)."""

    async def stop(self) -> None:
        """Stop it and release what it holds."""
        ...


@dataclass
class Target:
    """One server, model and setting a workload runs against."""

    label: str
    """Name in tables and plots (``localllm``, ``kv_cache_type=q8_0``, the peer's URL)."""
    driver: Driver
    """How requests reach it."""
    model: str
    """The model name on that server."""
    options: dict[str, Any] = field(default_factory=dict)
    """Request options sent with every request (a ``--compare`` request option)."""
    setting: dict[str, Any] = field(default_factory=dict)
    """What ``--compare`` set for this target (request option or daemon setting)."""
    daemon: Stoppable | None = None
    """The private daemon started for a daemon setting (a
    :class:`~.compare.SpawnedDaemon`), stopped by :meth:`Bench.close`."""
    error: str | None = None
    """Why it could not be warmed up (its levels are still run, and fail, reported)."""
    facts: dict[str, Any] = field(default_factory=dict)
    """What the server said about the model (slots, context, memory)."""

    def to_json(self) -> dict[str, Any]:
        """The target as the JSON document describes it."""
        return {
            "label": self.label,
            "kind": self.driver.kind,
            "url": self.driver.url,
            "model": self.model,
            "options": self.options,
            "setting": self.setting,
            "error": self.error,
            "memory": self.facts.get("memory"),
        }

    @property
    def load_key(self) -> tuple[Any, ...]:
        """Requests with the same key need no reload of the model between them (targets that
        differ in it are warmed up again before each level: a reload is not a TTFT)."""
        loads = tuple(sorted((k, v) for k, v in self.options.items() if k in LOAD_OPTIONS))
        return (id(self.driver), self.model, loads)


@dataclass
class Workload:
    """What to measure."""

    levels: list[int] = field(default_factory=lambda: list(DEFAULT_LEVELS))
    """Concurrent clients of the concurrency sweep (empty: no such sweep)."""
    prompt_tokens: int = 128
    """Prompt length of the concurrency sweep."""
    answer_tokens: int = 64
    """Tokens each request asks for (``num_predict`` / ``max_tokens``)."""
    prompt_lengths: list[int] = field(default_factory=lambda: list(DEFAULT_PROMPT_LENGTHS))
    """Prompt lengths of the prompt-length sweep (empty: no such sweep)."""
    prefill_answer_tokens: int = 4
    """Tokens asked for in the prompt-length sweep (it measures prefill and TTFT)."""
    rounds: int = 1
    """Times each level runs per target (targets take turns within a round)."""
    options: dict[str, Any] = field(default_factory=dict)
    """Request options for every target."""
    conversation: Conversation | None = None
    """The conversation trace to replay (None: no conversation sweep); ``rounds`` times,
    each a new set of conversations, ``answer_tokens`` per answer."""

    def to_json(self) -> dict[str, Any]:
        """The workload as a JSON object."""
        return dataclasses.asdict(self)

    def check(self) -> None:
        """Refuse values that cannot be measured."""
        if any(n < 1 for n in self.levels):
            raise BenchError("concurrency levels must be at least 1")
        if any(n < 1 for n in self.prompt_lengths) or self.prompt_tokens < 1:
            raise BenchError("prompt lengths must be at least 1 token")
        if self.answer_tokens < 1 or self.prefill_answer_tokens < 1:
            raise BenchError("answers must be at least 1 token")
        if self.rounds < 1:
            raise BenchError("rounds must be at least 1")
        if self.conversation is not None:
            self.conversation.check()
        if not self.levels and not self.prompt_lengths and self.conversation is None:
            raise BenchError(
                "nothing to measure: no concurrency levels, no prompt lengths, no conversation"
            )


@dataclass
class BenchResult:
    """Everything one run measured."""

    model: str
    """The model benchmarked (on the reference target)."""
    workload: Workload
    """What was asked."""
    targets: list[Target]
    """Servers and settings, the reference first."""
    points: list[Point]
    """One per level, sweep and target."""
    samples: list[Sample]
    """Every request."""
    started_at: float = field(default_factory=time.time)
    """When the run began (seconds since the epoch)."""
    notes: list[str] = field(default_factory=list)
    """What was adjusted or skipped, for people (levels capped, prompts too long...)."""

    def ratios(self) -> list[dict[str, Any]]:
        """Each non-reference target's figures divided by the reference's, level by level."""
        if len(self.targets) < 2:
            return []
        reference = self.targets[0].label
        by_key = {p.key: p for p in self.points}
        rows = []
        for point in self.points:
            if point.target == reference:
                continue
            base = by_key.get((reference, *point.key[1:]))
            if base is None:
                continue

            def ratio(name: str, point: Point = point, base: Point = base) -> float | None:
                mine, theirs = getattr(point, name), getattr(base, name)
                if mine is None or not theirs:
                    return None
                return mine / theirs

            rows.append(
                {
                    "target": point.target,
                    "reference": reference,
                    "sweep": point.sweep,
                    "clients": point.clients,
                    "prompt_tokens": point.prompt_tokens,
                    "cache": point.cache,
                    **{name: ratio(name) for name in RATIO_FIGURES},
                }
            )
        return rows

    @property
    def failed(self) -> int:
        """Requests that failed, over the whole run."""
        return sum(1 for s in self.samples if not s.ok)

    def to_json(self) -> dict[str, Any]:
        """The JSON document (see the module docstring and :data:`JSON_SCHEMA`)."""
        from .. import __version__

        return {
            "schema": SCHEMA_ID,
            "created_at": datetime.fromtimestamp(self.started_at, UTC).isoformat(),
            "localllm_version": __version__,
            "host": {
                "platform": platform.platform(),
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
            },
            "model": self.model,
            "workload": self.workload.to_json(),
            "targets": [t.to_json() for t in self.targets],
            "notes": list(self.notes),
            "points": [p.to_json() for p in self.points],
            "ratios": self.ratios(),
            "samples": [s.to_json() for s in self.samples],
        }


ProgressCallback = Callable[[int, int, str], None]
"""``(steps done, steps in all, what runs now)``."""
PointCallback = Callable[[Point], None]
"""Called with a point each time one of its rounds ends (the same object, updated)."""


class Bench:
    """Runs a :class:`Workload` against :class:`Target` s (the first is the reference: its
    slots and context cap the default sweeps, and ratios are against it)."""

    def __init__(
        self,
        targets: Sequence[Target],
        workload: Workload,
        *,
        on_progress: ProgressCallback | None = None,
        on_point: PointCallback | None = None,
        cap_levels: bool = True,
    ) -> None:
        if not targets:
            raise BenchError("no target to benchmark")
        workload.check()
        self.targets = list(targets)
        """Servers and settings, the reference first."""
        self.workload = workload
        """What to measure."""
        self.on_progress = on_progress
        """Told before each step."""
        self.on_point = on_point
        """Told after each round of a level."""
        self.cap_levels = cap_levels
        """Cap the concurrency levels at twice the reference's slots."""
        self.points: dict[tuple[str, str, int, int, str], Point] = {}
        """Points by :attr:`Point.key`, in the order they appeared."""
        self.samples: list[Sample] = []
        """Every request so far."""
        self.notes: list[str] = []
        """Adjustments made, for people."""
        self.prompts = PromptMaker()
        """Prompt texts of the run."""
        self._origin = time.perf_counter()
        self._walls: dict[tuple[str, str, int, int, str], float] = {}
        self._loaded: tuple[Any, ...] | None = None
        self._step = 0
        self._steps = 0

    # -- steps ---------------------------------------------------------------------------

    def _progress(self, what: str) -> None:
        if self.on_progress is not None:
            self.on_progress(self._step, self._steps, what)
        self._step += 1

    async def _warm(self, target: Target) -> None:
        """Load ``target``'s model with its load options before anything is timed."""
        if self._loaded == target.load_key:
            return
        self._loaded = target.load_key
        options = {**self.workload.options, **target.options}
        try:
            prompt = self.prompts.make(8, f"warm {target.label}")
            await target.driver.complete(
                Completion(target.model, prompt, 1, options), lambda piece: None
            )
        except Exception as exc:
            target.error = target.error or describe_error(exc)[0]

    async def _level(
        self,
        target: Target,
        sweep: str,
        clients: int,
        prompt_tokens: int,
        cache: str,
        round_: int,
        prompts: Sequence[str],
        max_tokens: int,
    ) -> Point:
        await self._warm(target)
        template = Sample(
            target=target.label,
            sweep=sweep,
            clients=clients,
            prompt_tokens_target=prompt_tokens,
            cache=cache,
            round=round_,
        )
        options = {**self.workload.options, **target.options}
        samples, wall = await run_level(
            target.driver,
            target.model,
            prompts,
            max_tokens,
            options=options,
            template=template,
            origin=self._origin,
        )
        return self._record(samples, wall)

    def _record(self, samples: Sequence[Sample], wall: float) -> Point:
        """Add a round of a level's samples (one template's copies) to its point."""
        first = samples[0]
        target, sweep, clients = first.target, first.sweep, first.clients
        prompt_tokens, cache = first.prompt_tokens_target, first.cache
        self.samples.extend(samples)
        key = (target, sweep, clients, prompt_tokens, cache)
        self._walls[key] = self._walls.get(key, 0.0) + wall
        point = self.points.get(key) or Point(target, sweep, clients, prompt_tokens, cache)
        self.points[key] = point
        mine = [
            s
            for s in self.samples
            if (s.target, s.sweep, s.clients, s.prompt_tokens_target, s.cache) == key
        ]
        summarize(mine, self._walls[key], point)
        if self.on_point is not None:
            self.on_point(point)
        return point

    async def _conversations(self, shape: Conversation) -> None:
        """Replay the conversation trace ``rounds`` times, turn by turn, the targets taking
        turns (their order alternating) so that the machine's noise hits them alike."""
        work = self.workload
        for round_ in range(work.rounds):
            histories = {
                target.label: Histories(shape, self.prompts, f"r{round_} {target.label}")
                for target in self.targets
            }
            for turn in range(shape.turns):
                order = self.targets if (round_ + turn) % 2 == 0 else self.targets[::-1]
                for target in order:
                    self._progress(f"{target.label}: conversation turn {turn + 1}")
                    await self._warm(target)
                    history = histories[target.label]
                    prompts = history.prompts_for(turn)
                    template = Sample(
                        target=target.label,
                        sweep="conversation",
                        clients=shape.users,
                        prompt_tokens_target=turn + 1,
                        cache="cold" if turn == 0 else "warm",
                        round=round_,
                    )
                    samples, answers, wall = await run_turn(
                        target.driver,
                        target.model,
                        prompts,
                        work.answer_tokens,
                        template=template,
                        options={**work.options, **target.options},
                        origin=self._origin,
                    )
                    history.answered(prompts, answers)
                    self._record(samples, wall)

    # -- the run -------------------------------------------------------------------------

    async def _prepare(self) -> tuple[list[int], list[int]]:
        """Calibrate prompts and load models; returns the levels and prompt lengths to run."""
        reference = self.targets[0]
        options = {**self.workload.options, **reference.options}
        try:
            await self.prompts.calibrate(reference.driver, reference.model, options)
            self._loaded = reference.load_key
        except Exception as exc:
            reference.error = describe_error(exc)[0]
        for target in self.targets:
            await self._warm(target)
            with contextlib.suppress(Exception):
                target.facts.update(await target.driver.describe_model(target.model))
        levels = list(self.workload.levels)
        slots = reference.facts.get("slots")
        if self.cap_levels and isinstance(slots, int) and slots > 0:
            capped = [n for n in levels if n <= 2 * slots]
            if capped != levels:
                self.notes.append(
                    f"concurrency capped at {2 * slots} (twice the {slots} slots of the "
                    f"reference); skipped {', '.join(str(n) for n in levels if n > 2 * slots)}"
                )
            levels = capped or levels[:1]
        lengths = list(self.workload.prompt_lengths)
        context = reference.facts.get("context_length")
        if isinstance(context, int) and context > 0:
            room = context - self.workload.prefill_answer_tokens - 16
            fitting = [n for n in lengths if n <= room]
            if fitting != lengths:
                self.notes.append(
                    f"prompt lengths over the {context}-token context of a slot skipped: "
                    + ", ".join(str(n) for n in lengths if n > room)
                )
            lengths = fitting
        return levels, lengths

    async def run(self) -> BenchResult:
        """Measure everything; returns the result (failed requests are in it, not raised)."""
        started = time.time()
        self._origin = time.perf_counter()
        self._progress("loading the model")
        levels, lengths = await self._prepare()
        work = self.workload
        turns = work.conversation.turns if work.conversation is not None else 0
        self._steps = 1 + len(self.targets) * (
            work.rounds * (len(levels) + turns) + 2 * len(lengths)
        )
        for clients in levels:
            for round_ in range(work.rounds):
                for target in self.targets:
                    self._progress(f"{target.label}: {clients} client{'s' * (clients > 1)}")
                    prompts = [
                        self.prompts.make(
                            work.prompt_tokens, f"c{clients} r{round_} n{i} {target.label}"
                        )
                        for i in range(clients)
                    ]
                    await self._level(
                        target,
                        "concurrency",
                        clients,
                        work.prompt_tokens,
                        "cold",
                        round_,
                        prompts,
                        work.answer_tokens,
                    )
        if work.conversation is not None:
            await self._conversations(work.conversation)
        for length in lengths:
            for target in self.targets:
                prompt = self.prompts.make(length, f"p{length} {target.label}")
                for cache in ("cold", "warm"):
                    self._progress(f"{target.label}: {length}-token prompt, {cache}")
                    await self._level(
                        target,
                        "prompt",
                        1,
                        length,
                        cache,
                        0,
                        [prompt],
                        work.prefill_answer_tokens,
                    )
        # Memory after the run: the KV cache has grown to what the workload needed.
        for target in self.targets:
            with contextlib.suppress(Exception):
                target.facts.update(await target.driver.describe_model(target.model))
        if self.on_progress is not None:
            self.on_progress(self._steps, self._steps, "done")
        return BenchResult(
            model=self.targets[0].model,
            workload=work,
            targets=self.targets,
            points=list(self.points.values()),
            samples=self.samples,
            started_at=started,
            notes=self.notes,
        )

    async def close(self) -> None:
        """Close the drivers and stop the daemons started for the targets."""
        for target in self.targets:
            with contextlib.suppress(Exception):
                await target.driver.close()
            if target.daemon is not None:
                await target.daemon.stop()


async def run_bench(
    targets: Sequence[Target],
    workload: Workload,
    *,
    on_progress: ProgressCallback | None = None,
    on_point: PointCallback | None = None,
    cap_levels: bool = True,
) -> BenchResult:
    """Run a :class:`Bench` and close it (drivers, spawned daemons) whatever happens."""
    bench = Bench(
        targets, workload, on_progress=on_progress, on_point=on_point, cap_levels=cap_levels
    )
    try:
        return await bench.run()
    finally:
        await asyncio.shield(bench.close())
