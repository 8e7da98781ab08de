"""Tiny reasoning models for the tests of ``think`` (cli/test_cli_think.py, tui/test_tui_think.py,
api/test_api_agents.py): a Qwen3-style template, the special tokens reasoning and tool-calling
templates use, and :func:`create_thinking_models`, which puts :data:`THINKER`, :data:`PLAIN`
and :data:`MIXED` in a daemon's store.

The tiny models never end an answer nor write a special token by themselves, so the reasoning
model's answer is all reasoning (its template opens the block). ``tiny:mixed`` is the same
weights, except that the output row of ``</think>`` is a copy of the row of a token the model
writes a few tokens into its greedy reasoning, scaled up a little, so that ``</think>`` wins
where that token would have come. Which token is found from the real model's own greedy
answer (its log probabilities' bytes), never assumed.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import gguf
import httpx
import pytest
import tiny_gguf
from tiny_gguf import write_tiny_gguf

from localllm.client import ChatChunk, Client, Think

__all__ = [
    "ANSWER_TOKENS",
    "EXTRA_SPECIAL",
    "GREEDY",
    "MIXED",
    "PLAIN",
    "PROMPT",
    "THINKER",
    "THINKER_TEMPLATE",
    "ask",
    "create_thinking_models",
    "write_with_special",
]

# A Qwen3-style template with both switches: enable_thinking (off writes an empty reasoning
# block) and reasoning_effort (a system line); on or unset, the prompt opens the block itself,
# as DeepSeek-R1's and Qwen3's templates do, so the answer starts as reasoning.
THINKER_TEMPLATE = (
    "{%- if reasoning_effort is defined %}<|im_start|>system\nReasoning: {{ reasoning_effort }}"
    "<|im_end|>\n{% endif %}"
    "{%- for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}"
    "<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{%- else %}<think>\n{% endif %}{% endif %}"
)
# The tokens reasoning and tool-calling templates use, as single (control) tokens.
EXTRA_SPECIAL = ["<tool_call>", "</tool_call>", "<think>", "</think>"]

THINKER = "tiny:thinker"
"""Reasons (its template opens the block) and never closes the block: all reasoning."""
MIXED = "tiny:mixed"
"""Reasons a few tokens, then answers (for :data:`PROMPT` with ``think`` on)."""
PLAIN = "tiny:plain"
"""Does not reason (ChatML template)."""
PROMPT = "Hello there"
"""The message :data:`MIXED` was tuned on."""
ANSWER_TOKENS = 24
GREEDY = {"temperature": 0, "repeat_penalty": 1.0, "num_predict": ANSWER_TOKENS}
"""Every model's parameters: short greedy answers, the same each time."""


def write_with_special(path: Path, template: str) -> Path:
    """A tiny model that never ends: ``template``, and :data:`EXTRA_SPECIAL` as control tokens."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tiny_gguf, "SPECIAL_TOKENS", [*tiny_gguf.SPECIAL_TOKENS, *EXTRA_SPECIAL])
        return write_tiny_gguf(path, chat_template=template, never_ends=True)


def _create(client: Client, name: str, path: Path) -> None:
    for _ in client.create(name, from_=str(path), parameters=GREEDY):
        pass


def ask(client: Client, model: str, think: Think | None = True) -> ChatChunk:
    """The daemon's whole answer to :data:`PROMPT` (what the CLI and the TUI also send)."""
    return client.chat(model, [{"role": "user", "content": PROMPT}], think=think)


def _greedy_tokens(base_url: str, model: str, vocabulary: list[str]) -> list[int]:
    """The token ids of ``model``'s greedy answer to :data:`PROMPT` with ``think`` on."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "think": True,
        "logprobs": True,
        "stream": False,
    }
    response = httpx.post(f"{base_url}/api/chat", json=body, timeout=120)
    assert response.status_code == 200, response.text
    to_text = tiny_gguf.byte_to_unicode()  # the byte-level vocabulary's spelling of bytes
    pieces = ["".join(to_text[b] for b in entry["bytes"]) for entry in response.json()["logprobs"]]
    return [vocabulary.index(piece) for piece in pieces]


def _close_on(source: Path, target: Path, trigger: int, close: int) -> Path:
    """A copy of ``source`` whose token ``close`` wins wherever ``trigger`` would have."""
    shutil.copyfile(source, target)
    reader = gguf.GGUFReader(target, "r+")
    output = next(t for t in reader.tensors if t.name == "output.weight")
    output.data[close] = output.data[trigger] * 1.01  # numpy rows are the vocabulary
    reader.data.flush()
    return target


def create_thinking_models(base_url: str, client: Client, folder: Path) -> None:
    """:data:`THINKER`, :data:`PLAIN` and :data:`MIXED` in the daemon's store."""
    _create(client, PLAIN, write_with_special(folder / "plain.gguf", tiny_gguf.CHATML_TEMPLATE))
    thinker = write_with_special(folder / "thinker.gguf", THINKER_TEMPLATE)
    _create(client, THINKER, thinker)
    vocabulary = [
        str(token) for token in gguf.GGUFReader(thinker).fields["tokenizer.ggml.tokens"].contents()
    ]
    close = vocabulary.index("</think>")
    tokens = _greedy_tokens(base_url, THINKER, vocabulary)
    # a token first written at position 3 or later: some reasoning comes before the close
    half = tokens[: ANSWER_TOKENS // 2]
    candidates = [t for k, t in enumerate(half) if k >= 3 and tokens.index(t) == k]
    for trigger in candidates:
        _create(client, MIXED, _close_on(thinker, folder / f"mixed-{trigger}.gguf", trigger, close))
        message = ask(client, MIXED)["message"]
        if message.get("thinking") and message.get("content", "").strip():
            return
    raise AssertionError(f"no token of {tokens} closes the reasoning with an answer after it")
