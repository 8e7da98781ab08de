"""The runner on the real SmolLM2-135M-Instruct: chat, batching, JSON schema, UTF-8."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from runner_harness import RunnerHarness, greedy

from localllm.daemon.runner import GenerationRequest, RunnerConfig, RunnerError, SamplingOptions


@pytest.fixture(scope="module")
def smol(smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunnerHarness]:
    config = RunnerConfig(model_path=str(smollm2_gguf), n_slots=4, n_ctx_per_slot=1024)
    harness = RunnerHarness(config, tmp_path_factory.mktemp("smol-runner"))
    yield harness
    harness.close()


def chat(text: str, **options: object) -> GenerationRequest:
    return GenerationRequest(
        id="",
        messages=[{"role": "user", "content": text}],
        options=greedy(**options),  # type: ignore[arg-type]
    )


CAPITALS = {
    "France": "Paris",
    "Japan": "Tokyo",
    "Germany": "Berlin",
    "Russia": "Moscow",
    "Egypt": "Cairo",
    "China": "Beijing",
}


def test_concurrent_streams_stay_apart(smol: RunnerHarness) -> None:
    # Exact greedy equality of batched and one-at-a-time runs is asserted on the tiny model
    # (test_runner.py). On this Q4_1 model it does not hold in general, for llama.cpp's
    # reasons: its CPU flash attention takes a split-KV path for a one-token batch over 512+
    # cells and a tiled path for 64+ queries, and their rounding differences (amplified by 8-bit
    # activation quantization) move logits by up to ~0.9, flipping near-ties. So here each of
    # six simultaneous questions (more than the four slots) must get its own answer and no
    # other's: a mix-up of sequences, positions or cached prefixes would show.
    countries = list(CAPITALS)
    answers = smol.generate_many(
        [chat(f"Which city is the capital of {country}?", num_predict=24) for country in countries]
    )
    for country, (text, result) in zip(countries, answers, strict=True):
        assert CAPITALS[country] in text, (country, text)
        others = [city for c, city in CAPITALS.items() if c != country]
        assert not any(city in text for city in others), (country, text)
        assert result.timings.prompt_tokens > 10


def test_answer_is_sensible_and_timed(smol: RunnerHarness) -> None:
    text, result = smol.generate(chat("Which city is the capital of France?", num_predict=16))
    assert "Paris" in text
    timings = result.timings
    assert timings.prompt_tokens > 10
    assert timings.completion_tokens > 0
    assert timings.ttft_ms > 0 and timings.total_ms >= timings.ttft_ms
    assert timings.prompt_tokens_per_s > 0
    assert result.done_reason in ("stop", "length")


def test_json_schema_output_parses_and_matches(smol: RunnerHarness) -> None:
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
        },
        "required": ["name", "age"],
    }
    request = chat("Describe a person as JSON.", num_predict=80)
    request.options = SamplingOptions(temperature=0, num_predict=80, json_schema=schema)
    text, result = smol.generate(request)
    data = json.loads(text)
    assert set(data) == {"name", "age"}
    assert isinstance(data["name"], str) and len(data["name"]) <= 20
    assert isinstance(data["age"], int) and 0 <= data["age"] <= 150
    assert result.done_reason == "stop"

    any_json = chat("Give me a JSON list of two colours.", num_predict=60)
    any_json.options = SamplingOptions(temperature=0, num_predict=60, json_mode=True)
    json.loads(smol.generate(any_json)[0])


def test_multibyte_characters_survive_streaming(smol: RunnerHarness) -> None:
    text, _ = smol.generate(chat("Repeat exactly: café déjà vu 日本語 🙂", num_predict=40))
    assert "é" in text
    assert any(ord(c) > 0xFFFF for c in text)  # an emoji, split over several byte tokens
    assert "\ufffd" not in text


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
