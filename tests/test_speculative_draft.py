"""Speculative decoding with a draft model: real llama.cpp on tiny models, then the daemon.

The engine tests run an in-process :class:`Engine` (as ``test_speculative`` does) with a flat
decode-cost curve and a free draft, so every step drafts; outputs must equal plain decoding.
Two drafts: a copy of the target's own file (it agrees with the target, so nearly every draft
token is accepted) and a same-vocabulary model with other weights (mostly rejected).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_speculative import JOBS, Run, options
from tiny_gguf import write_tiny_gguf

from localllm.daemon.runner.draft import DraftModel, DraftVocabularyError
from localllm.daemon.runner.model import LlamaModel
from localllm.daemon.runner.protocol import RunnerConfig


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("draft")
    target = write_tiny_gguf(folder / "target.gguf", never_ends=True)
    return {
        "target": target,
        "same": Path(shutil.copy(target, folder / "same.gguf")),
        "other": write_tiny_gguf(folder / "other.gguf", never_ends=True, seed=7, n_layers=1),
        "foreign": write_tiny_gguf(folder / "foreign.gguf", extra_tokens=200),
    }


@pytest.fixture(scope="module")
def model(files: dict[str, Path]) -> Iterator[LlamaModel]:
    llama = LlamaModel(
        RunnerConfig(model_path=str(files["target"]), n_slots=3, n_ctx_per_slot=512, n_threads=2)
    )
    yield llama
    llama.close()


@pytest.fixture(scope="module")
def drafts(model: LlamaModel, files: dict[str, Path]) -> Iterator[dict[str, DraftModel]]:
    loaded = {name: DraftModel(model, str(files[name])) for name in ("same", "other")}
    yield loaded
    for draft in loaded.values():
        draft.close()


class DraftRun(Run):
    """A :class:`Run` whose engine drafts with ``draft`` (free, so that it always drafts)."""

    def __init__(self, model: LlamaModel, draft: DraftModel, num_draft: int = 6) -> None:
        super().__init__(model, num_draft=num_draft)
        self.draft = draft
        self.engine.draft = draft
        self.engine.draft_cost = 0.0

    def run(self, jobs: list[tuple[str, str, object]]) -> dict[str, str]:  # type: ignore[override]
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


@pytest.mark.parametrize("which", ["same", "other"])
def test_greedy_output_is_identical_with_a_draft_model(
    model: LlamaModel, drafts: dict[str, DraftModel], which: str
) -> None:
    reference = Run(model, num_draft=0)
    plain = reference.run(JOBS)
    drafting = DraftRun(model, drafts[which])
    assert drafting.run(JOBS) == plain
    assert not drafting.errors
    for name, result in drafting.results.items():
        assert result.done_reason == reference.results[name].done_reason
        assert result.timings.completion_tokens == reference.results[name].timings.completion_tokens
    timings = [r.timings for r in drafting.results.values()]
    drafted = sum(t.draft_tokens for t in timings)
    accepted = sum(t.draft_accepted for t in timings)
    assert drafted > 0, "the engine must have verified the draft model's tokens"
    assert all(t.draft_accepted <= t.draft_tokens for t in timings)
    if which == "same":
        # The target drafting for itself agrees with itself wherever no grammar or stop
        # string intervenes.
        plain_timings = drafting.results["plain"].timings
        assert plain_timings.draft_accepted >= 0.9 * plain_timings.draft_tokens
        assert accepted > 0
    else:
        assert accepted < drafted
    assert drafts[which].seconds_per_token is not None


def test_seeded_sampling_is_reproducible_with_a_draft_model(
    model: LlamaModel, drafts: dict[str, DraftModel]
) -> None:
    seeded = [("seeded", "draft check: sampled", options(temperature=0.9, seed=42))]
    plain = Run(model, num_draft=0).run(seeded)
    first = DraftRun(model, drafts["same"]).run(seeded)
    second = DraftRun(model, drafts["same"]).run(seeded)
    assert first == second == plain


def test_a_reused_slot_drafts_from_its_new_prompt(
    model: LlamaModel, drafts: dict[str, DraftModel]
) -> None:
    # More requests than slots, sharing a prefix: slots are reused, draft sequences are
    # trimmed to the new prompt or copied from another draft sequence.
    jobs = [
        (f"reuse{i}", f"draft check shared prefix, then {i} " + "x" * i, options(num_predict=20))
        for i in range(5)
    ]
    plain = Run(model, num_draft=0).run(jobs)
    drafting = DraftRun(model, drafts["same"])
    assert drafting.run(jobs) == plain
    assert all(r.timings.draft_accepted > 0 for r in drafting.results.values())


def test_a_draft_with_another_vocabulary_is_refused_at_load(
    model: LlamaModel, files: dict[str, Path]
) -> None:
    with pytest.raises(DraftVocabularyError) as caught:
        DraftModel(model, str(files["foreign"]))
    message = str(caught.value)
    assert "foreign.gguf" in message and "target.gguf" in message
    assert "vocabulary" in message
