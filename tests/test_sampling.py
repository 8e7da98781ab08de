"""The sampler's plain-greedy shortcut picks what llama.cpp's greedy sampler picks.

A chain that is only greedy (temperature 0, no penalties, bias or grammar) is sampled by
taking the largest logit in Python rather than through ``llama_sampler_sample``. Both are run
on the same logits of a real model (SmolLM2, 49k-token vocabulary) at every position of a
batch, and every option that changes the logits must turn the shortcut off.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import pytest

from localllm.daemon.runner import RunnerConfig, SamplingOptions
from localllm.daemon.runner.model import LlamaModel
from localllm.daemon.runner.sampling import Sampler


@pytest.fixture(scope="module")
def model(smollm2_gguf: Path) -> Iterator[LlamaModel]:
    """SmolLM2 loaded in this process, one slot."""
    llama = LlamaModel(
        RunnerConfig(model_path=str(smollm2_gguf), n_slots=1, n_ctx_per_slot=512, n_threads=2)
    )
    yield llama
    llama.close()


def test_the_greedy_shortcut_picks_llama_cpps_greedy_token_at_every_position(
    model: LlamaModel,
) -> None:
    prompt = model.tokenize("The quick brown fox jumps over the lazy dog. " * 4, add_special=True)
    model.seq_remove(0, 0)
    model.batch.clear()
    indices = [model.batch.add(token, i, 0, True) for i, token in enumerate(prompt)]
    assert model.decode() == 0
    sampler = Sampler(
        model.vocab, model.n_vocab, SamplingOptions(temperature=0, repeat_penalty=1.0), None, 512
    )
    assert sampler.argmax_only
    reference = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    llama_cpp.llama_sampler_chain_add(reference, llama_cpp.llama_sampler_init_greedy())
    try:
        picked = [sampler.sample(model.ctx, index) for index in indices]
        expected = [
            int(llama_cpp.llama_sampler_sample(reference, model.ctx, index)) for index in indices
        ]
    finally:
        llama_cpp.llama_sampler_free(reference)
        sampler.close()
    assert picked == expected
    assert len(set(picked)) > 1  # the positions differ, so the comparison means something


@pytest.mark.parametrize(
    "options, grammar",
    [
        (SamplingOptions(temperature=0.7), None),
        (SamplingOptions(temperature=0), None),  # Ollama's default repeat_penalty, 1.1
        (SamplingOptions(temperature=0, repeat_penalty=1.0, presence_penalty=0.5), None),
        (SamplingOptions(temperature=0, repeat_penalty=1.0, frequency_penalty=0.5), None),
        (SamplingOptions(temperature=0, repeat_penalty=1.0, logit_bias={"42": -5.0}), None),
        (SamplingOptions(temperature=0, repeat_penalty=1.0), 'root ::= "yes" | "no"'),
    ],
    ids=["temperature", "repeat", "presence", "frequency", "bias", "grammar"],
)
def test_options_that_change_the_logits_take_llama_cpps_chain(
    model: LlamaModel, options: SamplingOptions, grammar: str | None
) -> None:
    sampler = Sampler(model.vocab, model.n_vocab, options, grammar, 512)
    try:
        assert not sampler.argmax_only
    finally:
        sampler.close()


def test_a_penalty_over_no_tokens_changes_nothing_and_keeps_the_shortcut(
    model: LlamaModel,
) -> None:
    options = SamplingOptions(temperature=0, repeat_penalty=1.3, repeat_last_n=0)
    sampler = Sampler(model.vocab, model.n_vocab, options, None, 512)
    try:
        assert sampler.argmax_only
    finally:
        sampler.close()
