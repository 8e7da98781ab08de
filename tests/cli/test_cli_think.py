"""``localllm run --think`` / ``--hidethinking`` and the REPL's ``/set think|nothink``, against a
real daemon with tiny reasoning models (``tiny_gguf`` with the Qwen3-style template of
``test_api_agents``).

The tiny models never end an answer nor write a special token by themselves, so the reasoning
model's answer is all reasoning (its template opens the block). To see reasoning *then* an
answer, :func:`create_thinking_models` also writes ``tiny:mixed``: the same weights, except
that the output row of ``</think>`` is a copy of the row of a token the model writes a few
tokens into its greedy reasoning, scaled up a little, so that ``</think>`` wins where that
token would have come: the reasoning closes there and the answer follows. Which token is
found from the real model's own greedy answer (its log probabilities' bytes), never assumed.
Nothing asserts what a model says: only where its reasoning and its answer are printed, and
that both are the daemon's (the same greedy answer asked for directly).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import pexpect
import pytest
from test_cli_run import _plain, _prompt_tokens
from test_cli_support import CliHome, cli_home
from thinking_models import (
    MIXED,
    PLAIN,
    PROMPT,
    THINKER,
    ask,
    create_thinking_models,
)

from localllm._exceptions import APIError
from localllm.client import AsyncClient

pytestmark = pytest.mark.slow

OPENING = "Thinking...\n"
CLOSING = "...done thinking."


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliHome]:
    folder = tmp_path_factory.mktemp("cli-think")
    with cli_home(folder / "home") as home:
        home.ok("list")  # starts the daemon
        with home.client() as client:
            create_thinking_models(home.settings.base_url, client, folder)
        yield home


def test_the_client_passes_think(cli: CliHome) -> None:
    with cli.client() as client:
        generated = client.generate(THINKER, PROMPT, think=True)
        assert generated["thinking"] and not generated.get("response")
        plain = client.generate(THINKER, PROMPT, think=False)
        assert plain["response"] and not plain.get("thinking")
        chunks = list(client.generate_stream(THINKER, PROMPT, think="low"))
        assert "".join(c.get("thinking", "") for c in chunks)
        with pytest.raises(APIError) as refused:
            client.chat(PLAIN, [{"role": "user", "content": PROMPT}], think="high")
        assert refused.value.status_code == 400
        assert str(refused.value) == f'"{PLAIN}" does not support thinking'

    async def streamed() -> tuple[str, str]:
        async with AsyncClient(cli.settings) as client:
            parts = [
                chunk["message"]
                async for chunk in client.chat_stream(
                    MIXED, [{"role": "user", "content": PROMPT}], think=True
                )
            ]
        return "".join(p.get("thinking", "") for p in parts), "".join(
            p.get("content", "") for p in parts
        )

    with cli.client() as client:
        whole = ask(client, MIXED)["message"]
    assert asyncio.run(streamed()) == (whole["thinking"], whole["content"])


def _split(out: str) -> tuple[str, str]:
    """The reasoning and the answer of plain ``run`` output with a reasoning block."""
    assert out.startswith(OPENING), out
    reasoning, closing, answer = out[len(OPENING) :].partition(f"\n{CLOSING}\n")
    assert closing, out
    return reasoning, answer


def test_think_prints_the_reasoning_then_the_answer(cli: CliHome) -> None:
    with cli.client() as client:
        expected = ask(client, MIXED)["message"]
    result = cli.run("run", MIXED, "--think", "--verbose", PROMPT)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "\x1b" not in out  # piped: plain text
    reasoning, rest = _split(out)
    # the daemon's reasoning between the two lines, then a blank line and its answer
    assert reasoning.rstrip("\n") == expected["thinking"].rstrip("\n")
    assert rest.startswith("\n") and rest.endswith("\n")
    assert rest.strip("\n") == expected["content"].strip("\n")
    assert "eval rate" in result.stderr and "eval rate" not in out  # --verbose as before


def test_hidethinking_and_think_false(cli: CliHome) -> None:
    with cli.client() as client:
        thought = ask(client, MIXED)["message"]["content"]
        unthought = ask(client, MIXED, think=False)["message"]["content"]
    # hidden: only the answer, and it is the answer given with thinking on (think was sent)
    hidden = cli.ok("run", MIXED, "--hidethinking", PROMPT)
    assert hidden.rstrip("\n") == thought.rstrip("\n") and hidden.endswith("\n")
    assert cli.ok("run", MIXED, "--think", "--hidethinking", PROMPT) == hidden
    # off: the model's answer without reasoning (its template closed the block in the prompt)
    off = cli.ok("run", MIXED, "--think=false", PROMPT)
    assert off.rstrip("\n") == unthought.rstrip("\n")
    assert OPENING not in off and CLOSING not in off
    # all reasoning and nothing after: the block is closed, no blank line for an answer
    out = cli.ok("run", THINKER, "--think=high", PROMPT)
    reasoning, rest = _split(out)
    assert reasoning.strip() and rest == ""
    assert cli.ok("run", THINKER, "--hidethinking", PROMPT) == ""


def _prompt_size(cli: CliHome, *flags: str) -> int:
    result = cli.run("run", THINKER, "--verbose", *flags, PROMPT)
    assert result.returncode == 0, result.stderr
    return _prompt_tokens(result.stderr)


def test_the_flag_reaches_the_template(cli: CliHome) -> None:
    # the template renders think's switches: each value gives the prompt another length
    unset = _prompt_size(cli)
    on = _prompt_size(cli, "--think")
    assert on != unset  # think=true sets reasoning_effort "medium": a system line
    assert _prompt_size(cli, "--think=low") not in (on, unset)
    assert _prompt_size(cli, "--think=false") not in (on, unset)  # the block closed
    assert _prompt_size(cli, "--think=true") == on
    assert _prompt_size(cli, "--hidethinking") == on


def test_a_model_that_does_not_reason(cli: CliHome) -> None:
    stderr = cli.fails("run", PLAIN, "--think", PROMPT)
    assert stderr == f'Error: "{PLAIN}" does not support thinking\n'
    assert cli.fails("run", PLAIN, "--think=medium", PROMPT) == stderr
    # off is fine, and --hidethinking alone asks nothing of it
    assert cli.ok("run", PLAIN, "--think=false", PROMPT).strip()
    assert cli.ok("run", PLAIN, "--hidethinking", PROMPT).strip()
    # a value the flag does not take is a usage error, before anything is sent
    bad = cli.run("run", PLAIN, "--think=extreme", PROMPT)
    assert bad.returncode == 2 and "--think" in bad.stderr


def test_reasoning_is_dim_on_a_terminal(cli: CliHome) -> None:
    child = cli.spawn("run", MIXED, "--think", PROMPT)
    child.expect(pexpect.EOF)
    shown = child.before
    # bold dim headings and dim reasoning (rich's styles), then the answer in plain colours
    assert "\x1b[1;2mThinking...\x1b[0m" in shown
    assert "\x1b[1;2m...done thinking.\x1b[0m" in shown
    assert re.search(r"\x1b\[2m[^\x1b]+\x1b\[0m", shown)
    plain = _plain(shown)
    assert plain.index("Thinking...") < plain.index("...done thinking.")
    assert plain.split("...done thinking.")[1].strip()  # the answer, after the block


def _expect_prompt(child: Any) -> str:
    """Wait for the next ``>>>`` prompt; what came before it, plain."""
    child.expect(">>> ")
    return _plain(child.before)


def test_repl_set_think_and_nothink(cli: CliHome) -> None:
    child = cli.spawn("run", THINKER)
    try:
        _expect_prompt(child)
        child.sendline("/? set")
        helped = _expect_prompt(child)
        for line in ("/set think ", "/set think <level>", "/set nothink"):
            assert line in helped
        child.sendline("/set nothink")
        assert "Set 'nothink' mode." in _expect_prompt(child)
        child.sendline(PROMPT)
        answer = _expect_prompt(child)
        assert "Thinking..." not in answer and answer.replace(PROMPT, "").strip()

        child.sendline("/set think high")
        assert "Set 'think' mode to 'high'." in _expect_prompt(child)
        child.sendline("/set think enormous")
        assert "Invalid think level 'enormous'" in _expect_prompt(child)
        child.sendline(PROMPT)
        answer = _expect_prompt(child)
        assert "Thinking..." in answer and "...done thinking." in answer

        child.sendline("/set think")
        set_back = _expect_prompt(child)
        assert "Set 'think' mode." in set_back and "warning" not in set_back

        # another model: one that cannot reason says so, and its refusal keeps the session
        child.sendline(f"/load {PLAIN}")
        _expect_prompt(child)
        child.sendline("/set think")
        assert f'warning: model "{PLAIN}" does not support thinking' in _expect_prompt(child)
        child.sendline(PROMPT)
        assert f'Error: "{PLAIN}" does not support thinking' in _expect_prompt(child)
        child.sendline("/set nothink")
        _expect_prompt(child)
        child.sendline(PROMPT)
        answer = _expect_prompt(child)
        # No error line (the model's own words may say "Error").
        assert not re.search(r"(?m)^Error: ", answer) and answer.replace(PROMPT, "").strip()
        child.sendline("/bye")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0


def test_run_think_holds_for_every_message_of_the_chat(cli: CliHome) -> None:
    child = cli.spawn("run", THINKER, "--think=low")
    try:
        _expect_prompt(child)
        for _ in range(2):
            child.sendline(PROMPT)
            answer = _expect_prompt(child)
            assert answer.index("Thinking...") < answer.index("...done thinking.")
        child.sendline("/bye")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
