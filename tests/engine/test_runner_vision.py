"""Images in prompts at the runner: real llama.cpp with mtmd, the tiny text model and a tiny
LLaVA-style projector (four embeddings per image). Properties only, never model text."""

from __future__ import annotations

import base64
import math
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from runner_harness import RunnerHarness, greedy, load_failure
from tiny_gguf import write_tiny_gguf
from tiny_mmproj import image_tokens, png_bytes, write_tiny_mmproj

from localllm.daemon.engine.jobs import GenerationJob
from localllm.daemon.engine.loop import Engine
from localllm.daemon.engine.model import LlamaModel
from localllm.daemon.engine.sampling import grammar_for
from localllm.daemon.engine.vision import VisionProjector
from localllm.daemon.runner import (
    GenerationRequest,
    RunnerConfig,
    RunnerError,
    TokenChunk,
)
from localllm.daemon.runner.protocol import (
    IMAGE_MARKER,
    DoneEvent,
    Event,
    GenerationResult,
    TokenEvent,
)
from localllm.daemon.runner.server import prepare
from localllm.daemon.speculation.draft_model import DraftModel
from localllm.daemon.speculation.policy import BatchCost

N_IMAGE = image_tokens()
RED = base64.b64encode(png_bytes((255, 0, 0))).decode()
BLUE = base64.b64encode(png_bytes((0, 0, 255), (20, 12))).decode()
GREEN_JPEG = base64.b64encode(png_bytes((0, 200, 0), fmt="JPEG")).decode()
M = IMAGE_MARKER


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The text model (it never ends by itself: streams run to num_predict) and its projector."""
    folder = tmp_path_factory.mktemp("vision")
    model = write_tiny_gguf(folder / "tiny.gguf", never_ends=True)
    return model, write_tiny_mmproj(folder / "mmproj.gguf")


def _start(
    files: tuple[Path, Path], folder: Path, projector: bool = True, **config: object
) -> RunnerHarness:
    model, mmproj = files
    values: dict[str, object] = {"n_slots": 2, "n_ctx_per_slot": 256, "n_threads": 2, **config}
    settings = RunnerConfig(
        model_path=str(model),
        projector=str(mmproj) if projector else None,
        **values,  # type: ignore[arg-type]
    )
    return RunnerHarness(settings, folder)


@pytest.fixture(scope="module")
def runner(
    files: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunnerHarness]:
    harness = _start(files, tmp_path_factory.mktemp("runner"))
    yield harness
    harness.close()


def raw(prompt: str, images: list[str], num_predict: int = 6) -> GenerationRequest:
    return GenerationRequest(
        id="", prompt=prompt, raw=True, images=images, options=greedy(num_predict)
    )


def first_logprobs(runner: RunnerHarness, request: GenerationRequest) -> list[float]:
    """The top log probabilities of the first generated token (the model's view of the
    prompt, images included)."""
    request.options.logprobs, request.options.top_logprobs = True, 8
    request.options.num_predict = 1

    async def collect() -> list[float]:
        entries = []
        async for event in runner.client.generate(request):
            if isinstance(event, TokenChunk):
                entries += event.logprobs or []
        return [t.logprob for t in entries[0].top_logprobs]

    return runner.run(collect())


def close(a: list[float], b: list[float]) -> bool:
    return all(math.isclose(x, y, abs_tol=2e-3) for x, y in zip(a, b, strict=True))


def test_an_image_is_its_embeddings_in_the_prompt(runner: RunnerHarness) -> None:
    before, after = "look at this: ", " what is it?"
    tokens = len(runner.run(runner.client.tokenize(before))) + len(
        runner.run(runner.client.tokenize(after))
    )
    _, result = runner.generate(raw(f"{before}{IMAGE_MARKER}{after}", [RED]))
    assert result.timings.prompt_tokens == tokens + N_IMAGE
    assert result.timings.completion_tokens == 6
    assert runner.run(runner.client.health())["vision"] is True

    # What the model sees depends on the image: the first token's distribution moves with
    # it, and comes back for the same image (here from the cache, in another batch shape).
    prompt = f"{before}{IMAGE_MARKER}{after} and"
    red = first_logprobs(runner, raw(prompt, [RED]))
    blue = first_logprobs(runner, raw(prompt, [BLUE]))
    jpeg = first_logprobs(runner, raw(prompt, [GREEN_JPEG]))
    red_again = first_logprobs(runner, raw(prompt, [RED]))
    assert close(red, red_again)
    assert not close(red, blue) and not close(red, jpeg) and not close(blue, jpeg)


def test_an_image_ending_the_prompt_gives_the_first_token(runner: RunnerHarness) -> None:
    text, result = runner.generate(raw(f"end on an image {IMAGE_MARKER}", [BLUE], 4))
    assert result.timings.completion_tokens == 4 and result.done_reason == "length"
    again, result = runner.generate(raw(f"end on an image {IMAGE_MARKER}", [BLUE], 4))
    assert again == text  # the image is evaluated again (its last cell gives the logits)
    assert result.timings.cached_tokens == result.timings.prompt_tokens - N_IMAGE


def test_the_cache_reuses_an_image_only_for_the_same_image(runner: RunnerHarness) -> None:
    before = "cache check with a picture: "
    prefix = len(runner.run(runner.client.tokenize(before)))
    _, first = runner.generate(raw(f"{before}{IMAGE_MARKER} one", [RED]))
    _, same = runner.generate(raw(f"{before}{IMAGE_MARKER} one two", [RED]))
    # Everything up to the new text is reused, the image's cells included.
    assert same.timings.cached_tokens == first.timings.prompt_tokens > prefix + N_IMAGE
    _, other = runner.generate(raw(f"{before}{IMAGE_MARKER} one two", [BLUE]))
    assert other.timings.cached_tokens == prefix  # reuse stops where the images differ


def test_concurrent_requests_with_different_images_match_their_solo_runs(
    runner: RunnerHarness,
) -> None:
    requests = [
        lambda: raw(f"{IMAGE_MARKER} first picture, then text", [RED], 10),
        lambda: raw(f"second: {IMAGE_MARKER} and {IMAGE_MARKER} too", [BLUE, GREEN_JPEG], 10),
    ]
    solo = [runner.generate(make())[0] for make in requests]
    # Other prompts take both slots, so the pair below is prefilled from scratch, together.
    runner.generate_many([raw("zz flush one", []), raw("yy flush two", [])])
    together = runner.generate_many([make() for make in requests])
    assert [text for text, _ in together] == solo
    for _, result in together:
        assert result.timings.cached_tokens == 0
    assert together[1][1].timings.prompt_tokens > 2 * N_IMAGE


def _engine_run(
    model: LlamaModel,
    projector: VisionProjector,
    request: GenerationRequest,
    num_draft: int,
    draft: DraftModel | None = None,
) -> tuple[str, GenerationResult]:
    """One request through an engine of its own on ``model``, drafting forced to pay."""
    model.seq_remove(0, 0)
    engine = Engine(model, num_draft=num_draft, draft=draft)
    engine.speculation.fixed_cost = BatchCost({1: 1.0, 64: 1.0})
    engine.speculation.draft_cost = 0.0
    prompt = prepare(model, request, None, projector)
    done = threading.Event()
    text: list[str] = []
    results: list[GenerationResult] = []

    def emit(event: Event) -> None:
        if isinstance(event, TokenEvent):
            text.append(event.text)
        elif isinstance(event, DoneEvent):
            results.append(event.result)
            done.set()

    engine.start()
    job = GenerationJob(
        id="spec",
        prompt=prompt.tokens,
        options=request.options,
        grammar=grammar_for(request.options),
        emit=emit,
        images=prompt.images,
    )
    engine.submit(job)
    assert done.wait(60)
    engine._put("stop", None)  # ends the thread; the model stays for the next run
    engine._thread.join(30)
    return "".join(text), results[0]


def test_speculation_around_images_drafts_text_only(files: tuple[Path, Path]) -> None:
    """In process: drafts come from the prompt's text (a pseudo-token in a batch would fail
    the decode) and change nothing in the output."""
    model_path, mmproj = files
    model = LlamaModel(RunnerConfig(model_path=str(model_path), n_slots=1, n_ctx_per_slot=256))
    projector = VisionProjector(str(mmproj), model)
    request = raw(f"one two three one two three {M} one two three one two", [RED], 16)
    # The grammar makes the output repeat the prompt's text, so n-gram drafts find matches.
    request.options.grammar = 'root ::= " three one two three one two three one two three"'
    try:
        drafted, with_drafts = _engine_run(model, projector, request, 4)
        plain, without = _engine_run(model, projector, request, 0)
    finally:
        projector.close()
        model.close()
    assert with_drafts.done_reason == without.done_reason == "length"
    assert with_drafts.timings.draft_accepted > 0
    assert drafted == plain


def test_a_runner_with_a_draft_model_drafts_image_requests_by_ngram(
    files: tuple[Path, Path],
) -> None:
    """The draft model has no projector, so it cannot follow a sequence holding image
    embeddings: such a request drafts from its text by n-gram, and the output is unchanged."""
    model_path, mmproj = files
    model = LlamaModel(RunnerConfig(model_path=str(model_path), n_slots=1, n_ctx_per_slot=256))
    projector = VisionProjector(str(mmproj), model)
    draft = DraftModel(model, str(model_path))
    request = raw(f"one two three one two three {M} one two three one two", [RED], 16)
    request.options.grammar = 'root ::= " three one two three one two three one two three"'
    try:
        drafted, with_drafts = _engine_run(model, projector, request, 4, draft)
        plain, without = _engine_run(model, projector, request, 0)
        assert draft.seen[0] == []  # the draft model never saw this request
    finally:
        draft.close()
        projector.close()
        model.close()
    assert with_drafts.done_reason == without.done_reason == "length"
    assert with_drafts.timings.draft_accepted > 0
    assert with_drafts.timings.drafter == "ngram"
    assert drafted == plain


def test_an_image_sent_again_is_not_encoded_again(files: tuple[Path, Path]) -> None:
    model_path, mmproj = files
    model = LlamaModel(RunnerConfig(model_path=str(model_path), n_slots=1, n_ctx_per_slot=256))
    projector = VisionProjector(str(mmproj), model)
    try:
        first = prepare(model, raw(f"a {M}", [RED]), None, projector)
        turn = prepare(model, raw(f"a {M} b {M}", [RED, BLUE]), None, projector)
        (red,) = first.images.values()
        red_again, blue = (turn.images[start] for start in sorted(turn.images))
        assert red_again.data is red.data  # the same embeddings, kept from the first request
        assert blue.data is not red.data
        assert list(blue.data) != list(red.data)
        assert turn.tokens[: len(first.tokens)] == first.tokens
    finally:
        projector.close()
        model.close()


def test_cancelling_a_request_with_images_frees_its_slot(runner: RunnerHarness) -> None:
    async def scenario() -> str:
        stream = runner.client.generate(raw(f"cancel me {M} please", [BLUE], 100000))
        async for event in stream:
            if isinstance(event, TokenChunk):
                break
        await stream.aclose()  # cancels in the runner, and returns once it did
        return "cancelled"

    runner.run(scenario())
    stats = runner.run(runner.client.stats())
    assert [slot.state for slot in stats.slots] == ["idle", "idle"]
    _, result = runner.generate(raw(f"cancel me {M} please", [BLUE], 3))
    assert result.timings.completion_tokens == 3


def test_a_context_with_an_image_is_returned_but_not_continued(runner: RunnerHarness) -> None:
    request = raw(f"context {M} here", [RED], 3)
    request.return_context = True
    _, result = runner.generate(request)
    assert result.context is not None
    assert len(result.context) == result.timings.prompt_tokens + 3
    assert sum(token < 0 for token in result.context) == N_IMAGE  # the image's positions
    follow_up = raw(" and more", [], 3)
    follow_up.context = result.context
    with pytest.raises(RunnerError, match="a context with images cannot be continued") as refused:
        runner.generate(follow_up)
    assert refused.value.code == "bad_request"


GARBAGE = base64.b64encode(b"not an image at all").decode()
TRUNCATED = base64.b64encode(png_bytes()[:40]).decode()


@pytest.mark.parametrize(
    ("prompt", "images", "words"),
    [
        (f"a {M}", [GARBAGE], "image 1 could not be decoded"),
        (f"a {M} b {M}", [RED, TRUNCATED], "image 2 could not be decoded"),
        (f"only {M}", [RED, BLUE], "1 image marker"),
        ("none here", [RED], "0 image markers"),
        (f"a {M}", ["@@not base64@@"], "image 1 is not valid base64"),
    ],
)
def test_bad_images_end_with_a_specific_error(
    runner: RunnerHarness, prompt: str, images: list[str], words: str
) -> None:
    with pytest.raises(RunnerError, match=words) as refused:
        runner.generate(raw(prompt, images))
    assert refused.value.code == "bad_request"
    _, result = runner.generate(raw(f"still serving {M}", [RED], 2))
    assert result.timings.completion_tokens == 2


def test_chat_messages_carry_images_and_never_shift_or_truncate(runner: RunnerHarness) -> None:
    chat = GenerationRequest(
        id="",
        messages=[{"role": "user", "content": f"what is in {IMAGE_MARKER}?"}],
        images=[RED],
        options=greedy(300),
    )
    _, result = runner.generate(chat)
    # The context (256) ends the request: a shift could cut the image in half.
    assert result.done_reason == "length"
    assert result.timings.prompt_tokens + result.timings.completion_tokens <= 256
    chat.truncate = True
    chat.messages = [{"role": "user", "content": f"{'long words ' * 200}{IMAGE_MARKER}"}]
    with pytest.raises(RunnerError, match="only whole earlier chat turns are dropped") as refused:
        runner.generate(chat)
    assert refused.value.code == "context_overflow"


def test_truncating_a_chat_drops_old_turns_with_their_images(runner: RunnerHarness) -> None:
    words = "many words in this turn " * 12
    messages = [
        {"role": "user", "content": f"{M} first {words}"},
        {"role": "assistant", "content": f"a reply {words}"},
        {"role": "user", "content": f"second {M} {words}"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": f"last {M} and {M}"},
    ]

    def chat(messages: list[dict[str, str]], images: list[str]) -> GenerationRequest:
        return GenerationRequest(id="", messages=messages, images=images, options=greedy(8))

    truncated = chat(messages, [RED, BLUE, GREEN_JPEG, RED])
    truncated.truncate = True
    text, result = runner.generate(truncated)
    # Only the turns after the long ones fit: the reply "ok" and the last turn, with its two
    # images; the same as sending just those.
    reference, expected = runner.generate(chat(messages[3:], [GREEN_JPEG, RED]))
    assert result.timings.prompt_tokens == expected.timings.prompt_tokens
    assert text == reference
    untruncated = chat(messages, [RED, BLUE, GREEN_JPEG, RED])
    with pytest.raises(RunnerError) as refused:
        runner.generate(untruncated)
    assert refused.value.code == "context_overflow"


@pytest.mark.parametrize("tier", ["ram", "disk"])
def test_saved_prefixes_with_images_restore_only_for_the_same_image(
    files: tuple[Path, Path], tmp_path: Path, tier: str
) -> None:
    budget: dict[str, object] = (
        {"kv_cache_ram": 64 << 20}
        if tier == "ram"
        else {"kv_cache_disk": 64 << 20, "kv_cache_dir": str(tmp_path / "kv")}
    )
    harness = _start(files, tmp_path, n_slots=1, **budget)
    try:
        long_text = "a system prompt long enough to be worth saving, with a picture: "
        prefix = len(harness.run(harness.client.tokenize(long_text)))
        assert prefix >= 32  # what the engine bothers to save
        prompt = f"{long_text}{IMAGE_MARKER} describe"
        reference, _ = harness.generate(raw(prompt, [RED]))
        harness.generate(raw("something else entirely, which evicts the slot", []))
        text, again = harness.generate(raw(prompt, [RED]))
        assert again.timings.cached_tokens == again.timings.prompt_tokens - 1
        assert text == reference
        assert harness.run(harness.client.stats()).prefix_restores == 1
        harness.generate(raw("something else entirely, which evicts the slot", []))
        _, other = harness.generate(raw(prompt, [BLUE]))
        assert other.timings.cached_tokens == prefix  # the text before the image only
    finally:
        harness.close()


def test_images_without_a_projector_are_unsupported(
    files: tuple[Path, Path], tmp_path: Path
) -> None:
    harness = _start(files, tmp_path, projector=False)
    try:
        with pytest.raises(RunnerError) as refused:
            harness.generate(raw(f"see {IMAGE_MARKER}", [RED]))
        assert refused.value.code == "unsupported"
        assert str(refused.value) == "this model cannot read images: it has no vision projector"
        _, result = harness.generate(raw("text still works", [], 2))
        assert result.timings.completion_tokens == 2
        assert harness.run(harness.client.health())["vision"] is False
    finally:
        harness.close()


def test_a_projector_for_another_model_fails_the_load_in_one_line(
    files: tuple[Path, Path], tmp_path: Path
) -> None:
    model, _ = files
    wrong = write_tiny_mmproj(tmp_path / "wrong.gguf", n_embd_text=128)
    message = load_failure(
        RunnerConfig(model_path=str(model), projector=str(wrong), n_slots=1, n_ctx_per_slot=256),
        tmp_path,
    )
    assert "\n" not in message
    assert f"could not load the vision projector {wrong}" in message
    assert "mismatch between text model (n_embd = 256) and mmproj (n_embd = 128)" in message


def _threads(pid: int) -> set[str]:
    """The ids of the process's threads."""
    return set(os.listdir(f"/proc/{pid}/task"))


def test_encoding_images_leaves_no_idle_openmp_team_behind(
    files: tuple[Path, Path], tmp_path: Path
) -> None:
    """Images are encoded off the engine thread; llama.cpp's OpenMP keeps a team of worker
    threads for every thread that ever computed a graph, and with more such threads than
    cores libgomp stops spinning at the engine's barriers (decoding measured 11-15 % slower
    for the runner's life). So after image requests the runner has the threads it had after
    text requests: whatever encoded the images has ended, and its team with it."""
    harness = _start(files, tmp_path)
    try:
        pid = harness.process.pid
        assert pid is not None
        harness.generate(raw("only text here", []))
        harness.generate(raw("more text", []))
        # Thread ids, not a count: a text request's preparation thread may still be ending
        # now (it computes no graph, so it leaves no team); it must not raise the baseline.
        settled = _threads(pid)
        for image in (RED, BLUE, GREEN_JPEG):
            harness.generate(raw(f"look {IMAGE_MARKER} here", [image]))
        # A thread's team ends as it exits, just after the request's answer: bounded poll.
        deadline = time.monotonic() + 10
        while not _threads(pid) <= settled and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _threads(pid) <= settled
    finally:
        harness.close()
