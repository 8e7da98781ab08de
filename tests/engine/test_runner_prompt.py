"""Prompt preparation in the runner: chat templates, truncation, fill-in-the-middle."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from runner_harness import loaded_model

from localllm.daemon.engine.model import LlamaModel
from localllm.daemon.engine.text import TextStream
from localllm.daemon.runner.protocol import GenerationRequest, SamplingOptions
from localllm.daemon.runner.server import PromptError, RunnerServer, prepare, prepare_prompt


@pytest.fixture(scope="module")
def model(tiny_gguf: Path) -> Iterator[LlamaModel]:
    with loaded_model(tiny_gguf, n_slots=1, n_ctx_per_slot=256, n_threads=1) as loaded:
        yield loaded


def tokens_of(model: LlamaModel, text: str) -> list[int]:
    return model.tokenize(text, add_special=False, parse_special=True)


def test_chat_truncation_keeps_the_system_prompt_and_the_last_turn(model: LlamaModel) -> None:
    system = {"role": "system", "content": "You are terse."}
    history = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "sky " * 30}
        for i in range(12)
    ]
    last = {"role": "user", "content": "final question?"}
    request = GenerationRequest(
        id="t", messages=[system, *history, last], options=SamplingOptions(num_predict=16)
    )
    with pytest.raises(PromptError) as info:
        prepare_prompt(model, request, model.chat_template())
    assert info.value.code == "context_overflow"

    request.truncate = True
    tokens = prepare_prompt(model, request, model.chat_template())
    assert len(tokens) <= 256 - 16
    system_tokens = tokens_of(model, "<|im_start|>system\nYou are terse.<|im_end|>\n")
    assert tokens[: len(system_tokens)] == system_tokens
    tail = tokens_of(model, "<|im_start|>user\nfinal question?<|im_end|>\n<|im_start|>assistant\n")
    assert tokens[-len(tail) :] == tail
    assert tokens_of(model, "turn 0") not in [tokens[i : i + 3] for i in range(len(tokens))]


def test_raw_prompts_are_tokenized_exactly(model: LlamaModel) -> None:
    request = GenerationRequest(id="r", prompt="<|im_start|>user", raw=True)
    tokens = prepare_prompt(model, request, None)
    assert tokens == tokens_of(model, "<|im_start|>user")
    assert tokens[0] == model.tokenize("<|im_start|>", add_special=False)[0]
    assert len(tokens) < len("<|im_start|>")  # the control token is parsed, not spelled out


def test_fill_in_the_middle_layout(model: LlamaModel) -> None:
    request = GenerationRequest(id="f", prompt="before", suffix="after")
    tokens = prepare_prompt(model, request, None)
    fim = model.fim
    assert fim is not None
    assert tokens[0] == fim.prefix and tokens[-1] == fim.middle
    assert fim.suffix in tokens
    middle = tokens.index(fim.suffix)
    assert tokens[1:middle] == tokens_of(model, "before")
    assert tokens[middle + 1 : -1] == tokens_of(model, "after")


def test_empty_prompt_is_refused(model: LlamaModel) -> None:
    with pytest.raises(PromptError, match="empty"):
        prepare_prompt(model, GenerationRequest(id="e", prompt="", raw=True), None)


@pytest.mark.parametrize(
    "text", ["héllo wörld", "日本語のテキスト", "emoji 🙂🚀 mix", "a\u0301 combining"]
)
def test_text_stream_never_splits_a_character(text: str) -> None:
    data = text.encode()
    stream = TextStream([])
    pieces = [stream.push(data[i : i + 1]) for i in range(len(data))]
    pieces.append(stream.finish())
    assert "".join(pieces) == text
    assert all("\ufffd" not in piece for piece in pieces)


def test_text_stream_holds_back_a_possible_stop_string() -> None:
    stream = TextStream(["</end>"])
    assert stream.push(b"hello </") == "hello "
    assert stream.push(b"en") == ""
    assert stream.push(b"d> ignored") == ""
    assert stream.stopped and stream.text == "hello "
    other = TextStream(["</end>"])
    assert other.push(b"a </") == "a "
    assert other.push(b"b>") == "</b>"  # not the stop string after all: released
    assert other.finish() == ""


def test_a_templates_compile_is_timed_apart_within_its_render(model: LlamaModel) -> None:
    # a template of this test's own: no other test compiled it before
    template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}#compile"
    request = GenerationRequest(id="c", messages=[{"role": "user", "content": "hello"}])
    first = prepare(model, request, template)
    assert 0 < first.compile_ms <= first.template_ms
    again = prepare(model, request, template)
    assert again.compile_ms == 0 and again.template_ms > 0
    assert again.tokens == first.tokens


def test_a_runner_warms_its_template_up_before_the_first_request(
    model: LlamaModel, tmp_path: Path
) -> None:
    # After a load the runner prepares a chat once, off any request's way: the first
    # message then neither compiles the template nor goes to a thread as a never-rendered one.
    server = RunnerServer(model, None, tmp_path / "runner.sock")  # type: ignore[arg-type]
    server.default_template = "{% for m in messages %}<{{ m['content'] }}>{% endfor %}#warm"
    assert not server._renders.quick(server.default_template)
    server.warm_up()
    assert server._renders.quick(server.default_template)
    request = GenerationRequest(id="w", messages=[{"role": "user", "content": "hello"}])
    first = prepare(model, request, server.default_template)
    assert first.compile_ms == 0 and first.tokens
