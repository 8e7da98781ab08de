"""The runner on the real SmolLM2-135M-Instruct: one stream against a plain llama.cpp loop,
concurrent streams kept apart, JSON schema, UTF-8, seeds, FIM.

Nothing here asserts what the model knows or says: greedy text of a 135M Q4_1 model changes
with the CPU's instruction set (AVX2 vs AVX-512). A single stream is compared with a plain
low-level llama.cpp loop run in this process, on this machine, with the same context
parameters; everything else asserts properties (each stream copies its own marker, grammar
output parses, counts and reasons).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from plain_loop import PlainLoop
from runner_harness import RunnerHarness, greedy
from test_fault_support import is_json_prefix

from localllm.daemon.runner import (
    GenerationRequest,
    RunnerConfig,
    RunnerError,
    SamplingOptions,
)

pytestmark = pytest.mark.slow

# One thread: on a shared two-core machine llama.cpp's spinning worker threads slow each
# other down tenfold when another process holds a core.
THREADS = 1


@pytest.fixture(scope="module")
def smol(smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunnerHarness]:
    config = RunnerConfig(
        model_path=str(smollm2_gguf), n_slots=4, n_ctx_per_slot=1024, n_threads=THREADS
    )
    harness = RunnerHarness(config, tmp_path_factory.mktemp("smol-runner"))
    yield harness
    harness.close()


def chat(text: str, **options: object) -> GenerationRequest:
    return GenerationRequest(
        id="",
        messages=[{"role": "user", "content": text}],
        options=greedy(**options),  # type: ignore[arg-type]
    )


def raw(prompt: str, **options: object) -> GenerationRequest:
    # repeat_penalty 1.0: the sampler chain is then greedy alone, as in the plain loop.
    return GenerationRequest(
        id="",
        prompt=prompt,
        raw=True,
        options=greedy(repeat_penalty=1.0, **options),  # type: ignore[arg-type]
    )


def test_one_stream_equals_a_plain_llama_cpp_loop_and_is_timed(
    smollm2_gguf: Path, tmp_path: Path
) -> None:
    # A fresh runner and a plain loop with the same context parameters run the same kernels
    # on the same cells, so greedy decoding gives the same tokens whatever this CPU is.
    config = RunnerConfig(
        model_path=str(smollm2_gguf), n_slots=2, n_ctx_per_slot=512, n_threads=THREADS
    )
    prompt = "Once upon a time, in a small village by the sea, there lived"
    plain = PlainLoop(smollm2_gguf, config)
    try:
        prompt_tokens, generated, expected = plain.greedy(prompt, 24)
    finally:
        plain.close()
    harness = RunnerHarness(config, tmp_path)
    try:
        text, result = harness.generate(raw(prompt, num_predict=24))
    finally:
        harness.close()
    assert generated, "the plain loop generated nothing"
    assert text == expected
    timings = result.timings
    assert timings.prompt_tokens == len(prompt_tokens)
    assert timings.completion_tokens == len(generated)
    assert result.done_reason == ("length" if len(generated) == 24 else "stop")
    assert timings.ttft_ms > 0 and timings.total_ms >= timings.ttft_ms
    assert timings.prompt_tokens_per_s > 0


MARKERS = ["kiwi-17", "plum-42", "fig-08", "lime-93", "pear-56", "date-31"]


def _copy_prompt(marker: str) -> str:
    # A shared opening (so prefix sharing between slots is exercised), then the stream's own
    # marker, repeated: any language model continues such a pattern by copying it.
    lines = "".join(f"Code: {marker}\n" for _ in range(8))
    return f"Copy the code on every line, exactly.\n{lines}Code:"


def test_concurrent_streams_stay_apart(smol: RunnerHarness, smollm2_gguf: Path) -> None:
    # Exact greedy equality of batched and one-at-a-time runs is asserted on the tiny model
    # (test_runner.py). On this Q4_1 model it does not hold in general, for llama.cpp's
    # reasons: its CPU flash attention takes a split-KV path for a one-token batch over 512+
    # cells and a tiled path for 64+ queries, and their rounding differences (amplified by 8-bit
    # activation quantization) move logits by up to ~0.9, flipping near-ties. So each of six
    # simultaneous streams (more than the four slots) copies its own marker, and none shows
    # another's: a mix-up of sequences, positions, cached prefixes or events would.
    plain = PlainLoop(
        smollm2_gguf, RunnerConfig(model_path="", n_slots=1, n_ctx_per_slot=512, n_threads=THREADS)
    )
    try:
        alone = {m: plain.greedy(_copy_prompt(m), 12)[2] for m in MARKERS}
    finally:
        plain.close()
    for marker, text in alone.items():
        assert marker in text, f"even alone the model does not copy {marker!r}: {text!r}"

    answers = smol.generate_many([raw(_copy_prompt(marker), num_predict=12) for marker in MARKERS])
    for marker, (text, result) in zip(MARKERS, answers, strict=True):
        assert marker in text, (marker, text)
        others = [m for m in MARKERS if m != marker]
        assert not any(m in text for m in others), (marker, text)
        assert result.timings.prompt_tokens > 40
        assert result.timings.completion_tokens == 12


def test_json_schema_output_parses_and_matches(smol: RunnerHarness) -> None:
    # Every string and number in the schema is bounded, so the grammar ends the answer long
    # before 400 tokens: done_reason must be "stop" and the text must parse.
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
        },
        "required": ["name", "age"],
    }
    request = chat("Describe a person as JSON.")
    request.options = SamplingOptions(temperature=0, num_predict=400, json_schema=schema)
    text, result = smol.generate(request)
    assert result.done_reason == "stop", text
    data = json.loads(text)
    assert set(data) == {"name", "age"}
    assert isinstance(data["name"], str) and len(data["name"]) <= 20
    assert isinstance(data["age"], int) and 0 <= data["age"] <= 150


def test_json_mode_output_is_json_or_a_json_prefix(smol: RunnerHarness) -> None:
    # Any JSON may be unbounded (a string can go on): if num_predict cut it, what came is the
    # start of a JSON value; if the model ended it, it parses.
    request = chat("Give me a JSON object with two colours.")
    request.options = SamplingOptions(temperature=0, num_predict=60, json_mode=True)
    text, result = smol.generate(request)
    assert text.strip(), "nothing generated"
    assert result.done_reason in ("stop", "length")
    if result.done_reason == "stop":
        json.loads(text)
    else:
        assert result.timings.completion_tokens == 60
        assert is_json_prefix(text), text


def test_multibyte_characters_survive_streaming(smol: RunnerHarness) -> None:
    # The grammar forces characters of two, three and four UTF-8 bytes, which the byte-level
    # vocabulary may spell with tokens that split them: no chunk may carry a broken character.
    wanted = "café déjà vu 日本語 🙂"
    request = chat("Say something.", num_predict=60)
    request.options.grammar = f'root ::= "{wanted}"'
    chunks, result = smol.run(smol.collect(request))
    assert result.text == wanted
    assert "".join(chunks) == wanted
    assert not any("\ufffd" in chunk for chunk in chunks), chunks
    assert result.done_reason == "stop"


def test_seeded_sampling_is_reproducible(smol: RunnerHarness) -> None:
    def sampled(seed: int) -> str:
        request = chat("Write a word.", num_predict=12)
        request.options = SamplingOptions(temperature=1.0, seed=seed, num_predict=12)
        return smol.generate(request)[0]

    assert sampled(7) == sampled(7)


def test_fill_in_the_middle_needs_fim_tokens(smol: RunnerHarness) -> None:
    with pytest.raises(RunnerError) as info:
        smol.generate(GenerationRequest(id="", prompt="def f(", suffix="):\n    pass"))
    assert info.value.code == "unsupported"
