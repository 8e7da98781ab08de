"""The sampler's shortcuts pick what llama.cpp's own samplers pick.

A chain that is only greedy (temperature 0, no penalties, bias or grammar) is sampled by
taking the largest logit in Python rather than through ``llama_sampler_sample``; repetition
penalties are applied in Python to the tokens of their window rather than by llama.cpp's
penalties sampler, which looks up every token of the vocabulary. Each is run against
llama.cpp's chain on the same logits of a real model (SmolLM2, 49k-token vocabulary) at every
position of a batch, and every option that changes the logits must turn the greedy shortcut
off.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import pytest
from runner_harness import loaded_model

from localllm.daemon.engine.model import LlamaModel
from localllm.daemon.engine.sampling import Sampler, logits_at
from localllm.daemon.runner import SamplingOptions


@pytest.fixture(scope="module")
def model(smollm2_gguf: Path) -> Iterator[LlamaModel]:
    """SmolLM2 loaded in this process, one slot."""
    with loaded_model(smollm2_gguf, n_slots=1, n_ctx_per_slot=512, n_threads=2) as llama:
        yield llama


def _decode_every_position(model: LlamaModel, text: str) -> tuple[list[int], list[int]]:
    """``text``'s tokens decoded alone in sequence 0 with logits at every position: the
    tokens and their batch indices."""
    prompt = model.tokenize(text, add_special=True)
    model.seq_remove(0, 0)
    model.batch.clear()
    indices = [model.batch.add(token, i, 0, True) for i, token in enumerate(prompt)]
    assert model.decode() == 0
    return prompt, indices


def _both_pick(
    model: LlamaModel, sampler: Sampler, reference: Any, indices: list[int]
) -> tuple[list[int], list[int]]:
    """The tokens ``sampler`` and llama.cpp's ``reference`` chain pick at every batch index,
    in order; both are freed."""
    try:
        picked = [sampler.sample(model.ctx, index) for index in indices]
        expected = [
            int(llama_cpp.llama_sampler_sample(reference, model.ctx, index)) for index in indices
        ]
    finally:
        llama_cpp.llama_sampler_free(reference)
        sampler.close()
    return picked, expected


def test_the_greedy_shortcut_picks_llama_cpps_greedy_token_at_every_position(
    model: LlamaModel,
) -> None:
    _, indices = _decode_every_position(model, "The quick brown fox jumps over the lazy dog. " * 4)
    sampler = Sampler(
        model.vocab, model.n_vocab, SamplingOptions(temperature=0, repeat_penalty=1.0), None, 512
    )
    assert sampler.argmax_only
    reference = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    llama_cpp.llama_sampler_chain_add(reference, llama_cpp.llama_sampler_init_greedy())
    picked, expected = _both_pick(model, sampler, reference, indices)
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


def _reference_chain(model: LlamaModel, options: SamplingOptions, grammar: str | None) -> Any:
    """The chain as llama.cpp composes it, its own penalties sampler included (grammar,
    penalties, then greedy or top-k, top-p, temperature and distribution)."""
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    add = lambda sampler: llama_cpp.llama_sampler_chain_add(chain, sampler)  # noqa: E731
    if grammar is not None:
        add(llama_cpp.llama_sampler_init_grammar(model.vocab, grammar.encode(), b"root"))
    o = options
    add(
        llama_cpp.llama_sampler_init_penalties(
            model.n_vocab,
            o.repeat_last_n,
            o.repeat_penalty,
            o.frequency_penalty,
            o.presence_penalty,
        )
    )
    if o.temperature <= 0:
        add(llama_cpp.llama_sampler_init_greedy())
    else:
        add(llama_cpp.llama_sampler_init_top_k(o.top_k))
        add(llama_cpp.llama_sampler_init_top_p(o.top_p, 1))
        add(llama_cpp.llama_sampler_init_temp(o.temperature))
        add(llama_cpp.llama_sampler_init_dist(o.seed))
    return chain


@pytest.mark.parametrize(
    "options, grammar",
    [
        (SamplingOptions(temperature=0, repeat_penalty=1.5, repeat_last_n=16), None),
        (SamplingOptions(temperature=0), None),  # Ollama's defaults: 1.1 over the last 64
        (
            SamplingOptions(
                temperature=0, repeat_penalty=1.2, frequency_penalty=0.7, presence_penalty=0.4
            ),
            None,
        ),
        # below 1 a repeat penalty raises repeated tokens: the greedy shortcut must not stand
        (SamplingOptions(temperature=0, repeat_penalty=0.5, repeat_last_n=16), None),
        (SamplingOptions(temperature=0.9, top_k=40, top_p=0.9, seed=7), None),
        (SamplingOptions(temperature=0, repeat_penalty=1.5), "root ::= [a-z ]+"),
    ],
    ids=[
        "greedy-strong",
        "greedy-default",
        "greedy-all-three",
        "greedy-boost",
        "seeded-sampling",
        "grammar",
    ],
)
def test_penalties_applied_here_pick_what_llama_cpps_penalties_sampler_picks(
    model: LlamaModel, options: SamplingOptions, grammar: str | None
) -> None:
    prompt, indices = _decode_every_position(
        model, "the cat sat on the mat and the cat sat on the hat " * 3
    )
    sampler = Sampler(model.vocab, model.n_vocab, options, grammar, 512)
    assert sampler.penalties is not None
    reference = _reference_chain(model, options, grammar)
    penalties = llama_cpp.llama_sampler_chain_get(reference, 1 if grammar else 0)
    learnt = prompt[:8]  # the prompt's start, as the engine teaches the window
    sampler.learn_prompt(learnt)
    for token in learnt:
        llama_cpp.llama_sampler_accept(penalties, token)
    plain = [int(logits_at(model.ctx, index, model.n_vocab).argmax()) for index in indices]
    before = [logits_at(model.ctx, index, model.n_vocab).copy() for index in indices]
    picked, expected = _both_pick(model, sampler, reference, indices)
    assert picked == expected
    assert picked != plain  # the penalties (or the sampling) changed some picks
    after = [logits_at(model.ctx, index, model.n_vocab) for index in indices]
    assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))
