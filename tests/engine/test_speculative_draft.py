"""Speculative decoding with a draft model: real llama.cpp on tiny models, then the daemon.

The engine tests run an in-process :class:`Engine` (as ``test_speculative`` does) with a flat
decode-cost curve and a free draft, so every step drafts; outputs must equal plain decoding.
Two drafts: a copy of the target's own file (it agrees with the target, so nearly every draft
token is accepted) and a same-vocabulary model with other weights (mostly rejected).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from runner_harness import load_failure
from speculative_runs import JOBS, DraftRun, Run, options
from test_daemon_support import Daemon, running_daemon
from tiny_gguf import write_tiny_gguf

from localllm.daemon.engine.model import LlamaModel
from localllm.daemon.errors import HTTPProblem
from localllm.daemon.loadconfig import draft_for, drafter_label, runner_config
from localllm.daemon.runner.protocol import RunnerConfig
from localllm.daemon.speculation.draft_model import (
    PROBE_SHARE,
    DraftModel,
    DraftModelDrafter,
    DraftVocabularyError,
)
from localllm.settings import Settings
from localllm.store.manifest import MEDIA_DRAFT
from localllm.store.modelfile import ModelfileError, parse_modelfile, read_modelfile
from localllm.store.models import create_model, load_model, render_modelfile
from localllm.store.store import Store


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
    # A unified cache (one cell short of 3 x 512), where drafts share batches with other
    # streams; with a stream per slot they go only into batches of one sequence.
    llama = LlamaModel(
        RunnerConfig(
            model_path=str(files["target"]),
            n_slots=3,
            n_ctx_per_slot=512,
            kv_cells=1535,
            n_threads=2,
        )
    )
    assert llama.unified_kv
    yield llama
    llama.close()


@pytest.fixture(scope="module")
def drafts(model: LlamaModel, files: dict[str, Path]) -> Iterator[dict[str, DraftModel]]:
    loaded = {name: DraftModel(model, str(files[name])) for name in ("same", "other")}
    yield loaded
    for draft in loaded.values():
        draft.close()


@pytest.fixture(scope="module")
def reference(model: LlamaModel) -> Run:
    """Plain decoding of JOBS, the reference every drafting run must match."""
    run = Run(model, num_draft=0)
    run.run(JOBS)
    return run


# The draft with other weights is mostly rejected: two draft tokens per step show it as well
# as six, in a third of the draft decodes.
@pytest.mark.parametrize(("which", "num_draft"), [("same", 6), ("other", 2)])
def test_greedy_output_is_identical_with_a_draft_model(
    model: LlamaModel, drafts: dict[str, DraftModel], reference: Run, which: str, num_draft: int
) -> None:
    drafting = DraftRun(model, drafts[which], num_draft=num_draft)
    assert drafting.run(JOBS) == {name: reference.texts.get(name, "") for name, _, _ in JOBS}
    assert not drafting.errors
    for name, result in drafting.results.items():
        assert result.done_reason == reference.results[name].done_reason
        assert result.timings.completion_tokens == reference.results[name].timings.completion_tokens
    timings = [r.timings for r in drafting.results.values()]
    drafted = sum(t.draft_tokens for t in timings)
    accepted = sum(t.draft_accepted for t in timings)
    assert drafted > 0, "the engine must have verified the draft model's tokens"
    assert all(t.draft_accepted <= t.draft_tokens for t in timings)
    assert {t.drafter for t in timings} == {f"draft:{which}.gguf"}
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
    seeded = [("seeded", "draft check: sampled", options(temperature=0.9, seed=42, num_predict=30))]
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


def test_a_draft_sequence_copies_a_prefix_another_one_holds(
    model: LlamaModel, drafts: dict[str, DraftModel], monkeypatch: pytest.MonkeyPatch
) -> None:
    draft = drafts["same"]
    for seq in range(len(draft.seen)):
        draft.model.seq_remove(seq, 0)
        draft.seen[seq] = []
    prompt = model.tokenize("draft check: a prompt two slots share, " * 3, add_special=True)
    first = draft.draft([(0, prompt, 3)])
    decoded: list[int] = []
    decode = draft.model.decode

    def counting() -> int:
        decoded.append(draft.model.batch.size)
        return decode()

    monkeypatch.setattr(draft.model, "decode", counting)
    second = draft.draft([(1, prompt, 3)])
    assert second == {1: first[0]}
    # Only the last prompt token (for its logits) and the two further draft positions were
    # decoded: the rest was shared from sequence 0.
    assert decoded == [1, 1, 1]
    for seq in (0, 1):
        assert draft.seen[seq][: len(prompt)] == prompt
        assert draft.model.seq_pos_max(seq) == len(draft.seen[seq]) - 1
    draft.rollback(1, prompt[:10])
    assert draft.model.seq_pos_max(1) == 9
    assert draft.model.seq_pos_max(0) == len(draft.seen[0]) - 1  # the shared cells stay


def test_a_draft_with_another_vocabulary_is_refused_at_load(
    model: LlamaModel, files: dict[str, Path]
) -> None:
    with pytest.raises(DraftVocabularyError) as caught:
        DraftModel(model, str(files["foreign"]))
    message = str(caught.value)
    assert "foreign.gguf" in message and "target.gguf" in message
    assert "vocabulary" in message


def test_the_runner_process_refuses_an_incompatible_draft_in_one_line(
    files: dict[str, Path], tmp_path: Path
) -> None:
    message = load_failure(
        RunnerConfig(
            model_path=str(files["target"]),
            n_slots=1,
            n_ctx_per_slot=256,
            num_draft=4,
            draft_model=str(files["foreign"]),
            draft_name="foreign:latest",
        ),
        tmp_path,
    )
    assert "\n" not in message
    assert "draft model foreign:latest cannot draft for target.gguf" in message


# -- the Modelfile's DRAFT line, the draft's choice and precedence (no daemon) -----------------


def test_modelfile_draft_line_parses_and_resolves_relative_files(tmp_path: Path) -> None:
    (tmp_path / "small.gguf").write_bytes(b"")
    (tmp_path / "Modelfile").write_text("FROM base:1b\nDRAFT ./small.gguf\n")
    modelfile = read_modelfile(tmp_path / "Modelfile")
    assert modelfile.draft == str(tmp_path / "small.gguf")
    assert modelfile.create_fields()["draft"] == str(tmp_path / "small.gguf")
    assert parse_modelfile("FROM x\ndraft tiny:small\n").draft == "tiny:small"
    with pytest.raises(ModelfileError, match="line 3: only one DRAFT"):
        parse_modelfile("FROM x\nDRAFT a\nDRAFT b\n")
    with pytest.raises(ModelfileError, match="line 2: DRAFT needs"):
        parse_modelfile('FROM x\nDRAFT ""\n')


@pytest.fixture
def drafting_store(store: Store, files: dict[str, Path]) -> Store:
    """target (no draft), layered (DRAFT: other), and the drafts as models of their own."""
    create_model(store, "target", gguf_file=files["target"])
    create_model(store, "layered", gguf_file=files["target"], draft_file=files["other"])
    create_model(store, "same", gguf_file=files["same"])
    create_model(store, "other", gguf_file=files["other"])
    create_model(store, "foreign", gguf_file=files["foreign"])
    return store


def _choice(store: Store, settings: Settings, model: str, **options: object) -> str | None:
    choice = draft_for(settings, load_model(store, model), dict(options))
    return None if choice is None else choice.name


def test_draft_precedence_is_option_then_layer_then_setting(
    drafting_store: Store, settings: Settings
) -> None:
    store = drafting_store
    layered = load_model(store, "layered")
    assert layered.draft_path is not None and layered.draft_path.is_file()
    assert "DRAFT " + str(layered.draft_path) in render_modelfile(layered)
    configured = replace(settings, draft_model="same")
    assert _choice(store, configured, "layered", draft_model="same") == "same:latest"
    assert _choice(store, configured, "layered") == "tiny-llama"  # the layer's GGUF name
    assert _choice(store, configured, "target") == "same:latest"
    assert _choice(store, settings, "target") is None  # auto without a draft: n-gram
    config = runner_config(configured, load_model(store, "target"), {"draft_model": "other"})
    assert config.draft_model == str(load_model(store, "other").gguf_path)
    assert config.draft_name == "other:latest"
    assert drafter_label(config) == "draft:other:latest"
    assert drafter_label(runner_config(settings, load_model(store, "target"), {})) == "ngram"


def test_bad_drafts_are_clear_errors(drafting_store: Store, settings: Settings) -> None:
    store = drafting_store
    with pytest.raises(HTTPProblem) as missing:
        _choice(store, settings, "target", draft_model="nosuch")
    assert missing.value.status == 404 and "nosuch" in missing.value.message
    with pytest.raises(HTTPProblem) as foreign:
        _choice(store, settings, "target", draft_model="foreign")
    assert foreign.value.status == 400
    assert "foreign:latest cannot draft for target:latest" in foreign.value.message
    assert foreign.value.param == "options.draft_model"
    strict = replace(settings, speculative="draft")
    with pytest.raises(HTTPProblem, match="has no draft model") as none:
        _choice(store, strict, "target")
    assert none.value.status == 400
    ngram = replace(settings, speculative="ngram")
    with pytest.raises(HTTPProblem, match="needs LOCALLLM_SPECULATIVE auto or draft"):
        _choice(store, ngram, "target", draft_model="same")
    assert _choice(store, ngram, "layered") is None
    # The setting names one draft for every model: under auto, a model it cannot draft for
    # falls back to n-gram; under draft, that is an error.
    assert _choice(store, replace(settings, draft_model="foreign"), "target") is None
    with pytest.raises(HTTPProblem, match="incompatible"):
        _choice(store, replace(strict, draft_model="foreign"), "target")


# -- a real daemon ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    home = tmp_path_factory.mktemp("draft-daemon") / "home"
    with running_daemon(home, num_parallel=2, num_threads=1, context_length=512) as d:
        yield d


def _cli(daemon: Daemon, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "localllm", *args],
        env=daemon.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_modelfile_draft_round_trip_and_drafting_in_the_daemon(
    daemon: Daemon, files: dict[str, Path], tmp_path: Path
) -> None:
    folder = files["target"].parent
    (folder / "Modelfile").write_text("FROM ./target.gguf\nDRAFT ./same.gguf\n")
    _cli(daemon, "create", "tiny:drafted", "-f", str(folder / "Modelfile"))
    rendered = _cli(daemon, "show", "tiny:drafted", "--modelfile")
    assert "\nDRAFT " in rendered
    (tmp_path / "Modelfile").write_text(rendered)
    _cli(daemon, "create", "tiny:again", "-f", str(tmp_path / "Modelfile"))
    store = Store(daemon.settings.data_dir)
    first, again = load_model(store, "tiny:drafted"), load_model(store, "tiny:again")
    assert first.draft_layer is not None and first.draft_layer.media_type == MEDIA_DRAFT
    assert again.draft_layer == first.draft_layer

    with daemon.http() as http:
        assert http.post("/api/create", json={"model": "tiny:plain", "from": str(files["target"])})
        body = {"prompt": "draft check: the sky is blue and the sea is", "stream": False}
        few = {"temperature": 0, "num_predict": 40, "stop": ["e t"]}
        off = {**few, "num_draft": 0}
        plain = http.post(
            "/api/generate", json={**body, "model": "tiny:plain", "options": off}
        ).json()
        drafted = http.post(
            "/api/generate", json={**body, "model": "tiny:drafted", "options": few}
        ).json()
        assert drafted["response"] == plain["response"]
        assert drafted["eval_count"] == plain["eval_count"]
        if drafted["draft_count"]:  # the policy drafts only while it pays on this CPU
            assert drafted["drafter"] == "draft:tiny-llama"
        assert drafted["draft_accepted_count"] <= drafted["draft_count"]
        loaded = {m["name"]: m for m in http.get("/api/ps").json()["models"]}
        assert loaded["tiny:drafted"]["drafter"] == "draft:tiny-llama"
        assert loaded["tiny:plain"]["drafter"] == "ngram"
        metrics = http.get("/metrics").text
        assert re.search(r'localllm_drafter\{[^}]*drafter="draft:tiny-llama"[^}]*\} 1\.0', metrics)


def test_bad_drafts_are_refused_by_the_daemon(daemon: Daemon, files: dict[str, Path]) -> None:
    with daemon.http() as http:
        refused = http.post(
            "/api/create",
            json={
                "model": "tiny:bad",
                "from": str(files["target"]),
                "draft": str(files["foreign"]),
            },
        )
        assert refused.status_code == 400
        assert "foreign.gguf cannot draft for" in refused.json()["error"]
        assert "target.gguf" in refused.json()["error"]
        assert http.get("/api/tags").json()["models"]  # the daemon is up
        assert http.post("/api/create", json={"model": "foreign", "from": str(files["foreign"])})
        assert http.post("/api/create", json={"model": "tiny:base", "from": str(files["target"])})
        body = {"model": "tiny:base", "prompt": "hi", "stream": False}
        for option, status, words in (
            ("foreign", 400, "foreign:latest cannot draft for tiny:base"),
            ("nosuch", 404, "draft model 'nosuch' not found"),
            (5, 400, "options.draft_model must be a model name"),
        ):
            answer = http.post("/api/generate", json={**body, "options": {"draft_model": option}})
            assert answer.status_code == status, answer.text
            assert words in answer.json()["error"]


def test_verbose_block_names_the_drafter() -> None:
    from localllm.run_stats import format_timings

    final = {"total_duration": 1e9, "eval_count": 10, "eval_duration": 5e8, "draft_count": 8}
    block = format_timings({**final, "draft_accepted_count": 6, "drafter": "draft:tiny:small"})
    assert "6 of 8 accepted (75%, speculative, draft:tiny:small)" in block


def test_probes_that_keep_failing_back_off_and_an_accepted_draft_resets_them() -> None:
    """Each probe makes the draft model catch up on every token since the last one: on text
    the draft cannot predict, probes must not keep costing that every 16 steps."""
    drafter = DraftModelDrafter(model=None)  # type: ignore[arg-type]  # probing needs no model
    drafter.probe(accepted=3)
    assert drafter.misses == 0  # the first probe has nothing to judge
    for expected in (1, 2, 3, 4, 4, 4):
        drafter.probe(accepted=3)  # nothing accepted since the previous probe
        assert drafter.misses == expected
    drafter.probe(accepted=4)
    assert drafter.misses == 0


def test_a_requests_probes_stay_within_their_share_of_its_time() -> None:
    """A draft model the policy stopped using must cost next to nothing: each probe (catching
    up, then one drafted token) must fit in PROBE_SHARE of the request's time so far."""
    drafter = DraftModelDrafter(model=None)  # type: ignore[arg-type]  # no model needed
    drafter.started = 100.0
    one_second_in = 100.0 + 1.0
    assert drafter.may_probe(PROBE_SHARE * 0.5, one_second_in)
    assert not drafter.may_probe(PROBE_SHARE * 2, one_second_in)  # longer than its share
    drafter.probe_seconds = PROBE_SHARE * 0.9  # what earlier probes spent
    assert not drafter.may_probe(PROBE_SHARE * 0.5, one_second_in)
    assert drafter.may_probe(PROBE_SHARE * 0.5, one_second_in + 1.0)  # the share grew


def test_a_probes_cost_counts_the_tokens_its_draft_sequence_must_catch_up_on(
    drafts: dict[str, DraftModel],
) -> None:
    draft = drafts["same"]
    draft.model.interrupt.clear()  # as the idle engine does before it measures
    assert draft.measure()
    assert draft.seconds_per_token is not None and draft.catch_up_seconds_per_token is not None
    seen = len(draft.seen[0])
    # Behind by 100 tokens costs more than behind by none, by the measured catch-up pace.
    near, far = draft.catch_up_cost(0, seen), draft.catch_up_cost(0, seen + 100)
    assert near == pytest.approx(draft.seconds_per_token)
    assert far == pytest.approx(near + 100 * draft.catch_up_seconds_per_token)


def test_a_request_stops_the_draft_models_measurement_too(
    model: LlamaModel, files: dict[str, Path]
) -> None:
    # The draft model's decodes listen to the target's interrupt: a request that arrives
    # while the engine measures the draft model stops it, and it is taken again later.
    draft = DraftModel(model, str(files["same"]))
    try:
        assert draft.model.interrupt is model.interrupt
        model.interrupt.set()
        assert not draft.measure()
        assert draft.seconds_per_token is None and draft.catch_up_seconds_per_token is None
        assert draft.model.seq_pos_max(0) < 0  # nothing of the stopped decode stays
        model.interrupt.clear()
        assert draft.measure()
        assert draft.seconds_per_token is not None and draft.catch_up_seconds_per_token is not None
    finally:
        draft.close()
