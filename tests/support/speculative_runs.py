"""In-process engine runs for the speculative-decoding tests (engine/test_speculative.py,
engine/test_speculative_draft.py, devices/test_gpu.py): an :class:`Engine` on a shared model
that collects each request's text and result, the jobs every run decodes, and
:class:`DraftRun`, whose engine drafts with a draft model."""

from __future__ import annotations

import threading

from localllm.daemon.engine.jobs import GenerationJob
from localllm.daemon.engine.loop import Engine
from localllm.daemon.engine.model import LlamaModel
from localllm.daemon.engine.sampling import grammar_for
from localllm.daemon.runner.protocol import (
    DoneEvent,
    ErrorEvent,
    Event,
    GenerationResult,
    SamplingOptions,
    TokenEvent,
    TokenLogprob,
)
from localllm.daemon.speculation.draft_model import DraftModel
from localllm.daemon.speculation.policy import BatchCost

__all__ = ["JOBS", "DraftRun", "Run", "options"]


class Run:
    """An engine on the shared model; collects each request's text and result."""

    def __init__(self, model: LlamaModel, num_draft: int, measure: bool = False) -> None:
        self.engine = Engine(model, num_draft=num_draft)
        if num_draft and not measure:
            self.engine.speculation.fixed_cost = BatchCost(
                {1: 1.0, 64: 1.0}
            )  # drafting always pays
        self.texts: dict[str, str] = {}
        self.events: dict[str, int] = {}
        """Token events per request."""
        self.logprobs: dict[str, list[TokenLogprob]] = {}
        self.results: dict[str, GenerationResult] = {}
        self.errors: dict[str, str] = {}
        self._done = threading.Condition()

    def emit(self, event: Event) -> None:
        """Collect one engine event."""
        with self._done:
            if isinstance(event, TokenEvent):
                self.texts[event.id] = self.texts.get(event.id, "") + event.text
                self.events[event.id] = self.events.get(event.id, 0) + 1
                self.logprobs.setdefault(event.id, []).extend(event.logprobs or [])
            elif isinstance(event, DoneEvent):
                self.results[event.id] = event.result
            elif isinstance(event, ErrorEvent):
                self.errors[str(event.id)] = event.message
            self._done.notify_all()

    def run(self, jobs: list[tuple[str, str, SamplingOptions]]) -> dict[str, str]:
        """Decode ``jobs`` from an empty cache; each one's text by name."""
        model = self.engine.model
        # Each run starts from an empty cache: the runs compare decoding, not caching.
        for seq in range(model.n_slots + (model.scratch_seq is not None)):
            model.seq_remove(seq, 0)
        self.engine.start()
        try:
            for name, prompt, options in jobs:
                self.engine.submit(
                    GenerationJob(
                        id=name,
                        prompt=model.tokenize(prompt, add_special=True),
                        options=options,
                        grammar=grammar_for(options),
                        emit=self.emit,
                    )
                )
            with self._done:
                assert self._done.wait_for(lambda: len(self.results) == len(jobs), 120)
            # A rejected draft leaves no cells: every sequence holds exactly its cache.
            for slot in self.engine.slots:
                assert model.seq_pos_max(slot.seq_id) == len(slot.cache) - 1
        finally:
            self.engine._put("stop", None)
            self.engine._thread.join(30)
        return {name: self.texts.get(name, "") for name, _, _ in jobs}


def options(**changes: object) -> SamplingOptions:
    """Greedy sampling of 60 tokens with ``changes``."""
    base = SamplingOptions(temperature=0.0, num_predict=60, repeat_penalty=1.0)
    for key, value in changes.items():
        setattr(base, key, value)
    return base


JOBS = [
    ("plain", "speculation check: the sky is blue and the sea is", options()),
    ("stops", "speculation check: a stop string ends this", options(stop=["e t"])),
    ("grammar", "speculation check: json", options(grammar='root ::= "{" [a-z ]* "}"')),
]


class DraftRun(Run):
    """A :class:`Run` whose engine drafts with ``draft`` (free, so that it always drafts)."""

    def __init__(self, model: LlamaModel, draft: DraftModel, num_draft: int = 6) -> None:
        super().__init__(model, num_draft=num_draft)
        self.draft = draft
        self.engine.speculation.draft = draft
        self.engine.speculation.draft_cost = 0.0

    def run(self, jobs: list[tuple[str, str, object]]) -> dict[str, str]:  # type: ignore[override]
        """As :meth:`Run.run`, the draft context emptied first and checked after."""
        for seq in range(len(self.draft.seen)):
            self.draft.model.seq_remove(seq, 0)
            self.draft.seen[seq] = []
        texts = super().run(jobs)  # type: ignore[arg-type]
        for slot in self.engine.slots:
            seen = self.draft.seen[slot.seq_id]
            # Rejected drafts left the draft context: it holds a prefix of what the target
            # accepted, and nothing else.
            assert seen == slot.cache[: len(seen)]
            assert self.draft.model.seq_pos_max(slot.seq_id) == len(seen) - 1
        return texts
