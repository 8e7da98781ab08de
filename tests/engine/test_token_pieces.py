"""Prompt pieces tokenized once (daemon/engine/tokencache.py): the tokens equal llama.cpp's
of the whole text on real and converted vocabularies (byte-level BPE, SentencePiece with and
without its space prefix, Phi-3's special tokens that strip the spaces after them), and a
chat's next turn tokenizes only what is new."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import pytest
from hf_checkpoint import write_checkpoint
from runner_harness import greedy, loaded_model

from localllm.convert import convert_folder
from localllm.daemon.engine.jobs import GenerationJob
from localllm.daemon.engine.loop import Engine
from localllm.daemon.engine.model import LlamaModel
from localllm.daemon.engine.tokencache import (
    LSTRIP,
    PieceCache,
    prepared,
    self_check_texts,
    split_markers,
)
from localllm.daemon.prompt.template import render_chat
from localllm.daemon.runner.protocol import DoneEvent, ErrorEvent, Event, RunnerConfig


def test_markers_are_the_template_specials_llama_cpp_always_cuts_at() -> None:
    specials = {
        "<|im_start|>": 8,
        "<|im_end|>": 8 | 256,  # RSTRIP takes spaces after: they stay in its own piece
        "<|endoftext|>": 8,  # not in the template
        "<mask>": 8 | LSTRIP,  # would take spaces from the piece before it
        "<tool>": 8,  # inside a longer special token, matched first by llama.cpp
        "<tool>_call": 8,
        "[A]": 8,  # a special token ends with its head
        "x[A": 16,
        "<s>": 8,
    }
    template = "<|im_start|><|im_end|><mask><tool>[A]<s>"
    assert split_markers(specials, template) == ["<s>", "<|im_end|>", "<|im_start|>"]


def _vocab(path: Path) -> Iterator[object]:
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    assert model
    try:
        yield llama_cpp.llama_model_get_vocab(model), model
    finally:
        llama_cpp.llama_model_free(model)


def _whole(vocab: object):  # a closure over the C vocabulary
    def tokenize(text: str, add_special: bool) -> list[int]:
        data = text.encode()
        capacity = len(data) + 8
        out = (llama_cpp.llama_token * capacity)()
        count = llama_cpp.llama_tokenize(vocab, data, len(data), out, capacity, add_special, True)
        assert count >= 0
        return list(out[:count])

    return tokenize


# The converted tiny checkpoints carry no chat template: one in Phi-3's form, written with
# their special tokens.
_TURNS = (
    "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}<|end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def _template(model: object) -> str:
    raw = llama_cpp.llama_model_chat_template(model, None)
    return raw.decode() if raw else _TURNS


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """SentencePiece GGUFs converted from tiny checkpoints: Mistral (space prefix) and
    Phi-3 (llama.cpp makes its special tokens strip the spaces after them)."""
    out = {}
    for family in ("mistral", "phi3"):
        folder = tmp_path_factory.mktemp(family)
        checkpoint = write_checkpoint(folder / family, family)
        out[family] = convert_folder(checkpoint.folder, folder / f"{family}.gguf").path
    return out


def _texts(template: str, markers: list[str], seed: int) -> list[str]:
    """Chats rendered with the model's template, and texts of markers, spaces and words."""
    rng = random.Random(seed)
    words = ["Hello", " world", "\n", "  ", "\n\n", "é", "中文", "42", "x", " ", "\t", "don't"]
    texts = []
    for turns in range(1, 6):
        messages = [{"role": "system", "content": "Be brief. "}]
        for turn in range(turns):
            content = "".join(rng.choice(words) for _ in range(rng.randint(0, 12)))
            messages.append({"role": "user" if turn % 2 == 0 else "assistant", "content": content})
        texts.append(render_chat(template, messages, add_generation_prompt=True, bos_token="<s>"))
    pool = words + markers
    for _ in range(120):
        texts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 16))))
    return texts + self_check_texts(markers) + [""]


@pytest.mark.parametrize("source", ["smollm2", "tiny", "mistral", "phi3"])
def test_pieces_tokenize_as_the_whole_text_does(
    source: str, smollm2_gguf: Path, tiny_gguf: Path, converted: dict[str, Path]
) -> None:
    path = {"smollm2": smollm2_gguf, "tiny": tiny_gguf}.get(source) or converted[source]
    for vocab, model in _vocab(path):
        template = _template(model)
        whole = _whole(vocab)
        cache = prepared(vocab, template, whole)
        assert cache is not None
        markers = [
            m for m in ("<|im_start|>", "<|im_end|>", "<|user|>", "<|end|>") if m in template
        ]
        assert set(markers) <= set(cache.markers), (markers, cache.markers)
        assert markers
        assert len(cache.pieces(template)) > 1  # the template's markers cut its texts
        for text in _texts(template, markers, seed=len(source)):
            for add_special in (True, False):
                assert cache.tokenize(text, add_special) == whole(text, add_special), text
                # the second time from the cache, still the same
                assert cache.tokenize(text, add_special) == whole(text, add_special), text
        assert cache.hits > 0


def test_the_next_turn_tokenizes_only_its_new_pieces(smollm2_gguf: Path) -> None:
    for vocab, model in _vocab(smollm2_gguf):
        template = _template(model)
        cache = prepared(vocab, template, _whole(vocab))
        assert cache is not None
        chat = [
            {"role": "system", "content": "You answer in one line."},
            {"role": "user", "content": "What is a lighthouse?"},
        ]
        first = render_chat(template, chat, add_generation_prompt=True)
        cache.tokenize(first, True)
        pieces = cache.pieces(first)
        # "<|im_end|>\n" ends both turns: tokenized once
        assert cache.misses == len(set(pieces)) < len(pieces)
        chat += [
            {"role": "assistant", "content": "A tower with a light."},
            {"role": "user", "content": "Who keeps it?"},
        ]
        second = render_chat(template, chat, add_generation_prompt=True)
        misses, hits = cache.misses, cache.hits
        assert cache.tokenize(second, True) == _whole(vocab)(second, True)
        # only the two new turns were tokenized; the system turn, the first question, the
        # turns' ends and the assistant header came from the cache
        assert cache.misses - misses == 2
        assert cache.hits - hits == len(cache.pieces(second)) - 2


def test_a_bounded_cache_forgets_the_least_recently_used() -> None:
    calls: list[str] = []

    def tokenize(text: str, add_special: bool) -> list[int]:
        calls.append(text)
        return [ord(c) for c in text]

    cache = PieceCache(tokenize, ["<m>"], budget=12)
    cache.tokenize("<m>abc<m>def", False)  # two pieces of 6 tokens: the budget
    cache.tokenize("<m>abc", False)  # used again: the most recent
    cache.tokenize("<m>xyz", False)  # a third: the least recent (def) goes
    calls.clear()
    assert cache.tokenize("<m>abc", False) + cache.tokenize("<m>xyz", False) == [
        ord(c) for c in "<m>abc<m>xyz"
    ]
    assert calls == []
    cache.tokenize("<m>def", False)
    assert calls == ["<m>def"]


def test_the_runner_model_uses_the_cache_once_ready(tiny_gguf: Path) -> None:
    with loaded_model(tiny_gguf, n_slots=1, n_ctx_per_slot=256, n_threads=1) as model:
        text = "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n"
        first = model.tokenize(text, add_special=True)  # whole: the cache is not made yet
        assert model._pieces is None
        steps = 0
        while model.prepare_pieces_step():
            steps += 1
        assert steps >= 1 and model._pieces is not None
        assert not model.prepare_pieces_step()  # made once
        assert model.tokenize(text, add_special=True) == first
        assert model.tokenize(text, add_special=True) == model.tokenize_whole(text, True)
        assert model._pieces.hits > 0
        # without special tokens parsed, the text is tokenized whole, as before
        spelled = model.tokenize(text, add_special=False, parse_special=False)
        assert len(spelled) > len(first)


def test_the_engine_makes_the_cache_only_while_no_request_is_served(
    smollm2_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Made beside a model's first request, the cache's ~0.3 µs a token of Python took a core
    from that request's prefill; the engine takes its steps while idle, between requests."""
    model = LlamaModel(
        RunnerConfig(model_path=str(smollm2_gguf), n_slots=1, n_ctx_per_slot=512, n_threads=1)
    )
    engine = Engine(model)
    events: list[str] = []
    made = threading.Event()
    real_step, real_decode = model.prepare_pieces_step, model.decode

    def step() -> bool:
        more = real_step()
        events.append("step" if more else "made")
        if not more:
            made.set()
        return more

    def decode() -> int:
        events.append("decode")
        return real_decode()

    monkeypatch.setattr(model, "prepare_pieces_step", step)
    monkeypatch.setattr(model, "decode", decode)
    finished = threading.Semaphore(0)
    done: list[Event] = []

    def emit(event: Event) -> None:
        if isinstance(event, DoneEvent | ErrorEvent):
            done.append(event)
            finished.release()

    text = "<|im_start|>user\nTell me about rivers.<|im_end|>\n"
    prompt = model.tokenize(text, True)
    engine.submit(GenerationJob("first", prompt, greedy(num_predict=8), None, emit))
    engine.start()  # the request is waiting before the engine's first idle moment
    try:
        assert finished.acquire(timeout=120)
        assert made.wait(timeout=120)
        assert model._pieces is not None
        assert model.tokenize(text, True) == model.tokenize_whole(text, True)
    finally:
        engine.stop()  # closes the model
    assert isinstance(done[0], DoneEvent)
    served = [i for i, event in enumerate(events) if event == "decode"]
    # the vocabulary's 49k tokens take several steps, none while the request was served
    assert events.count("step") >= 8
    assert "step" not in events[served[0] : served[-1]]
    assert events.index("step") > served[-1]
