"""LoRA adapters in a real runner: the output llama-cpp-python's own ``Llama(lora_path=...)``
gives, bad adapters refused while the runner goes on, and caches that never reuse a prefix
across adapter sets (slots, prefix sharing between slots, the RAM and disk tiers), with
speculative drafts verified under the request's own adapters."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import pytest
from lora_support import write_lora_gguf
from runner_harness import RunnerHarness, greedy
from tiny_gguf import write_tiny_gguf

from localllm.daemon.engine.jobs import GenerationJob
from localllm.daemon.engine.loop import Engine
from localllm.daemon.engine.model import LlamaModel
from localllm.daemon.lora.adapterset import NO_ADAPTERS, AdapterSet
from localllm.daemon.runner import GenerationRequest, GenerationResult, RunnerConfig, RunnerError
from localllm.daemon.runner.protocol import (
    AdapterFile,
    AdapterUse,
    DoneEvent,
    ErrorEvent,
    Event,
    TokenEvent,
)
from localllm.daemon.speculation.policy import BatchCost


def digest(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def ask(prompt: str, *uses: AdapterUse, **options: object) -> GenerationRequest:
    options = {"num_predict": 16, "repeat_penalty": 1.0, **options}
    sampling = greedy(**options)  # type: ignore[arg-type]
    return GenerationRequest(id="", prompt=prompt, raw=True, options=sampling, adapters=list(uses))


# -- SmolLM2 with an adapter made here, against llama-cpp-python's Llama -----------------------


@pytest.fixture(scope="module")
def smol_lora(smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_lora_gguf(tmp_path_factory.mktemp("smol-lora") / "lora.gguf", smollm2_gguf)


def test_an_adapter_answers_as_llama_cpp_python_applies_it(
    smollm2_gguf: Path, smol_lora: Path, tmp_path: Path
) -> None:
    # Llama's context: one sequence of 512 cells, no flash attention, one thread: the runner
    # is loaded the same way, so the two compute the same numbers.
    config = RunnerConfig(
        model_path=str(smollm2_gguf),
        n_slots=1,
        n_ctx_per_slot=512,
        n_threads=1,
        flash_attention="off",
    )
    runner = RunnerHarness(config, tmp_path)
    prompt = "The capital of France is"
    try:
        (loaded,) = runner.run(
            runner.client.load_adapters([AdapterFile(digest(smol_lora), str(smol_lora))])
        )
        assert loaded.size > 0 and loaded.alpha == 16.0
        base, _ = runner.generate(ask(prompt))
        adapted, _ = runner.generate(ask(prompt, AdapterUse(loaded.digest)))
        half, _ = runner.generate(ask(prompt, AdapterUse(loaded.digest, 0.5)))
    finally:
        runner.close()
    assert adapted != base
    for scale, ours in ((1.0, adapted), (0.5, half)):
        reference = llama_cpp.Llama(
            str(smollm2_gguf),
            lora_path=str(smol_lora),
            lora_scale=scale,
            n_ctx=512,
            n_threads=1,
            n_threads_batch=1,
            verbose=False,
        )
        try:
            out = reference.create_completion(prompt, max_tokens=16, temperature=0.0)
        finally:
            reference.close()
        assert out["choices"][0]["text"] == ours, f"scale {scale}"


# Long enough (> MIN_SHARED_WAIT tokens) that requests arriving together wait for one prefill
# and copy its cells, as chat prompts do.
AT_ONCE = (
    "Once upon a time, in a small village at the edge of a great forest, there lived",
    "Here is a short list of things to pack for a week of walking in the mountains:",
    "The three most important rules for writing a good function in Python are these:",
)


def test_requests_at_once_answer_as_each_alone_under_an_adapter(
    smollm2_gguf: Path, tmp_path: Path
) -> None:
    # Issue 47 item 5: a random rank-8 adapter on attn_q and ffn_up (alpha = rank), greedy,
    # no repeat penalty; four identical requests at once must each give what the request
    # gives alone. Each prompt runs both ways round: at once on a cold cache then alone
    # (reusing the slots' cells), and alone on a cold cache then at once.
    lora = write_lora_gguf(
        tmp_path / "q-up.gguf", smollm2_gguf, rank=8, alpha=8.0, targets=("attn_q", "ffn_up")
    )
    config = RunnerConfig(model_path=str(smollm2_gguf), n_slots=4, n_ctx_per_slot=512, n_threads=1)
    runner = RunnerHarness(config, tmp_path / "r")
    mismatches: list[str] = []
    shared = 0
    try:
        (loaded,) = runner.run(runner.client.load_adapters([AdapterFile(digest(lora), str(lora))]))
        use = AdapterUse(loaded.digest)
        for n, text in enumerate(AT_ONCE):
            for alone_first in (False, True):
                prompt = f"{'ab'[alone_first]}{n}. {text}"
                if alone_first:
                    alone, _ = runner.generate(ask(prompt, use, num_predict=24))
                together = runner.generate_many([ask(prompt, use, num_predict=24) for _ in "abcd"])
                if not alone_first:
                    alone, _ = runner.generate(ask(prompt, use, num_predict=24))
                shared += sum(1 for _, result in together if result.timings.cached_tokens)
                mismatches += [
                    f"{prompt!r}: alone {alone!r}, at once {answer!r}"
                    for answer, _ in together
                    if answer != alone
                ]
    finally:
        runner.close()
    assert shared, "no request shared another's prefill: the path under test did not run"
    assert not mismatches, "\n".join(mismatches)


# -- the tiny model: bad adapters, and caches keyed by the adapter set ---------------------------


@pytest.fixture(scope="module")
def endless(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("lora-tiny") / "endless.gguf", never_ends=True)


@pytest.fixture(scope="module")
def adapters(endless: Path, tmp_path_factory: pytest.TempPathFactory) -> list[AdapterFile]:
    folder = tmp_path_factory.mktemp("lora-tiny-adapters")
    paths = [write_lora_gguf(folder / f"{n}.gguf", endless, seed=n, std=0.2) for n in (1, 2)]
    return [AdapterFile(digest(p), str(p)) for p in paths]


def tiny_runner(model: Path, workdir: Path, kv_dir: Path, **config: object) -> RunnerHarness:
    settings = RunnerConfig(
        model_path=str(model),
        n_slots=2,
        n_ctx_per_slot=512,
        n_threads=1,
        flash_attention="off",
        kv_cache_dir=str(kv_dir),
        kv_cache_ram=16 << 20,
        kv_cache_disk=64 << 20,
    )
    for key, value in config.items():
        setattr(settings, key, value)
    workdir.mkdir(parents=True, exist_ok=True)
    return RunnerHarness(settings, workdir)


@pytest.fixture
def runner(endless: Path, adapters: list[AdapterFile], tmp_path: Path) -> Iterator[RunnerHarness]:
    harness = tiny_runner(endless, tmp_path / "r1", tmp_path / "kv")
    harness.run(harness.client.load_adapters(adapters))
    yield harness
    harness.close()


def test_bad_adapters_are_refused_and_the_runner_goes_on(
    runner: RunnerHarness, endless: Path, tmp_path: Path
) -> None:
    bent = write_lora_gguf(tmp_path / "bent.gguf", endless, wrong_rank_for="blk.0.attn_q.weight")
    with pytest.raises(RunnerError, match="could not load adapter"):
        runner.run(runner.client.load_adapters([AdapterFile(digest(bent), str(bent))]))
    with pytest.raises(RunnerError, match="is not loaded in this runner") as caught:
        runner.generate(ask("hello", AdapterUse(digest(bent))))
    assert caught.value.code == "bad_request"
    with pytest.raises(RunnerError, match="named twice"):
        runner.generate(ask("hello", AdapterUse(digest(endless)), AdapterUse(digest(endless))))
    text, result = runner.generate(ask("hello"))
    assert result.done_reason == "length" and text


PROMPT = "lora cache check: " + "a long shared prefix that each adapter set computes " * 6


def test_caches_never_reuse_a_prefix_across_adapter_sets(
    endless: Path, adapters: list[AdapterFile], tmp_path: Path
) -> None:
    a, b = (AdapterUse(f.digest) for f in adapters)
    runner = tiny_runner(endless, tmp_path / "r1", tmp_path / "kv")
    try:
        runner.run(runner.client.load_adapters(adapters))
        texts = _first_runner(runner, a, b)
    finally:
        runner.close()  # its idle prefixes go to disk
    # The next runner reads them, each for its own set: a rescaled adapter is another set.
    second = tiny_runner(endless, tmp_path / "r2", tmp_path / "kv")
    try:
        second.run(second.client.load_adapters(adapters))
        text, from_disk = second.generate(ask(PROMPT, a))
        _, rescaled = second.generate(ask(PROMPT, AdapterUse(a.digest, 0.5)))
    finally:
        second.close()
    assert text == texts[0] and from_disk.timings.cached_tokens > 32
    assert rescaled.timings.cached_tokens == 0


def _first_runner(runner: RunnerHarness, a: AdapterUse, b: AdapterUse) -> tuple[str, str]:
    """The slots, prefix sharing and the RAM tier, in one runner; the answers with a and b."""

    def gen(*uses: AdapterUse, prompt: str = PROMPT) -> tuple[str, GenerationResult]:
        return runner.generate(ask(prompt, *uses))

    text_a, first_a = gen(a)
    text_b, first_b = gen(b)  # the cells of the same prompt with a: of no use here
    assert first_a.timings.cached_tokens == 0 and first_b.timings.cached_tokens == 0
    assert len({text_a, text_b}) == 2
    again_a, second_a = gen(a)
    again_b, second_b = gen(b)
    assert (again_a, again_b) == (text_a, text_b)
    assert min(second_a.timings.cached_tokens, second_b.timings.cached_tokens) > 32
    # Other prompts take both slots: the prefixes go to the RAM tier, and come back to the
    # prompts of their own set only (the base model never had this prompt).
    for word in ("first", "second"):  # sharing nothing, so each takes a slot of its own
        gen(prompt=f"{word} filler, something else entirely, long enough to be saved " * 3)
    restored_b, third_b = gen(b)
    assert restored_b == text_b and third_b.timings.cached_tokens > 32
    _, base = gen()
    assert base.timings.cached_tokens == 0
    assert runner.run(runner.client.stats()).prefix_restores == 1
    # Two requests of one new prompt at once, each with its own set: neither shares the
    # other's cells (nor waits for them), and each answers as it does alone.
    both = runner.generate_many([ask("twice: " + PROMPT, a), ask("twice: " + PROMPT, b)])
    assert [r.timings.cached_tokens for _, r in both] == [0, 0]
    assert [text for text, _ in both] == [
        gen(a, prompt="twice: " + PROMPT)[0],
        gen(b, prompt="twice: " + PROMPT)[0],
    ]
    return text_a, text_b


def test_speculative_drafts_are_verified_with_the_requests_adapters(
    endless: Path, adapters: list[AdapterFile]
) -> None:
    # In process, so that drafting is told it always pays (on a busy or slow machine the
    # runner's own cost curve may judge that it never does, and no draft would be tested).
    model = LlamaModel(
        RunnerConfig(
            model_path=str(endless),
            n_slots=1,
            n_ctx_per_slot=512,
            n_threads=1,
            flash_attention="off",
        )
    )
    prompt = model.tokenize("abcdefgh ijklmnop " * 12, add_special=True)
    adapted = AdapterSet.of([AdapterUse(adapters[0].digest)])

    def generate(num_draft: int, aset: AdapterSet) -> tuple[str, GenerationResult]:
        for seq in range(model.n_slots + (model.scratch_seq is not None)):
            model.seq_remove(seq, 0)  # each run from an empty cache
        engine = Engine(model, num_draft=num_draft)
        engine.adapters.load(adapters)
        if num_draft:
            engine.speculation.fixed_cost = BatchCost({1: 1.0, 64: 1.0})
        text: list[str] = []
        done: list[GenerationResult] = []
        finished = threading.Event()

        def emit(event: Event) -> None:
            if isinstance(event, TokenEvent):
                text.append(event.text)
            elif isinstance(event, DoneEvent | ErrorEvent):
                done.extend([event.result] if isinstance(event, DoneEvent) else [])
                finished.set()

        options = greedy(num_predict=48, repeat_penalty=1.0)
        engine.start()
        try:
            job = GenerationJob("lora-draft", prompt, options, None, emit, adapters=aset)
            engine.submit(job)
            assert finished.wait(120) and done, "the generation did not finish"
        finally:  # the thread only: Engine.stop would close the model the runs share
            engine._put("stop", None)
            engine._thread.join(30)
        return "".join(text), done[0]

    try:
        # the base first: a new engine takes its context to run without adapters
        base, _ = generate(0, NO_ADAPTERS)
        plain, _ = generate(0, adapted)
        drafted, result = generate(8, adapted)
    finally:
        model.close()
    assert result.timings.draft_tokens > 0
    assert drafted == plain != base
