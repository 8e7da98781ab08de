"""``localllm run`` with the bundled SmolLM2: one-shot, piped, ``--verbose``, JSON, pulls, and
the interactive chat in a pseudo-terminal (``/set``, multi-line, Ctrl-C, ``/bye``, Ctrl-D)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest
from test_cli_support import CliHome, cli_home, daemon_log, wait_for_stats

MODEL = "smollm2:135m"
# A number, with a unit for durations: what each --verbose line must show.
_DURATION = r"[0-9.]+(?:µs|ms|s)"
VERBOSE_LINES = [
    rf"total duration: +{_DURATION}",
    rf"load duration: +{_DURATION}",
    rf"time to first token: +{_DURATION}",
    r"prompt eval count: +\d+ token\(s\)",
    r"prompt cached count: +\d+ token\(s\) reused from cache",
    rf"prompt eval duration: +{_DURATION}",
    r"prompt eval rate: +[0-9.]+ tokens/s",
    r"eval count: +\d+ token\(s\)",
    rf"eval duration: +{_DURATION}",
    r"eval rate: +[0-9.]+ tokens/s",
]


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliHome]:
    folder = tmp_path_factory.mktemp("cli-run")
    with cli_home(folder / "home") as home:
        # Short answers by default: the starter with num_predict 12 (this auto-starts the daemon).
        (folder / "Modelfile").write_text(f"FROM {MODEL}\nPARAMETER num_predict 12\n")
        home.ok("create", "short", "-f", str(folder / "Modelfile"))
        yield home


def _verbose_values(text: str) -> dict[str, str]:
    values = {}
    for pattern in VERBOSE_LINES:
        # Each line from its start: "eval count" must not match inside "prompt eval count".
        match = re.search(f"^{pattern}", text, re.MULTILINE)
        assert match, f"missing {pattern!r} in:\n{text}"
        values[pattern.split(":")[0]] = match.group(0)
    return values


def test_one_shot_prints_the_answer_and_exits(cli: CliHome) -> None:
    result = cli.run("run", "short", "What is the capital of France?")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip(), "no answer"
    assert result.stdout.endswith("\n")
    assert "eval rate" not in result.stderr  # only with --verbose
    # no prompt and nothing piped (stdin is /dev/null): the model is loaded, nothing said
    cli.ok("stop", "short")
    assert cli.ok("run", "short") == ""
    assert any(m["name"] == "short:latest" for m in cli.json("ps"))


def _prompt_tokens(stderr: str) -> int:
    evaluated = re.search(r"prompt eval count: +(\d+)", stderr)
    cached = re.search(r"prompt cached count: +(\d+)", stderr)
    assert evaluated and cached, stderr
    return int(evaluated.group(1)) + int(cached.group(1))


def test_piped_stdin_is_the_prompt_and_joins_the_argument(cli: CliHome) -> None:
    piped = cli.run("run", "short", "--verbose", input="Reply with the word OK.\n")
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout.strip()
    both = cli.run(
        "run", "short", "--verbose", "And then say it twice.", input="Reply with the word OK.\n"
    )
    assert both.returncode == 0, both.stderr
    # the argument is appended to the piped text: the prompt is longer by its tokens
    assert _prompt_tokens(both.stderr) > _prompt_tokens(piped.stderr)


def test_verbose_prints_both_phases_with_numbers(cli: CliHome) -> None:
    result = cli.run("run", "short", "--verbose", "--keepalive", "10m", "Name a colour.")
    assert result.returncode == 0, result.stderr
    values = _verbose_values(result.stderr)
    generated = int(re.search(r"\d+", values["eval count"]).group(0))  # type: ignore[union-attr]
    assert 1 <= generated <= 12
    assert "eval rate" not in result.stdout  # timings go to stderr, the answer alone to stdout
    # where the time to the first token went, phase by phase, each with its duration
    phases = re.search(r"^first token phases: +(.+)$", result.stderr, re.MULTILINE)
    assert phases, result.stderr
    named = dict(part.rsplit(" ", 1) for part in phases.group(1).split(", "))
    assert {"parse", "template", "tokenize", "prefill"} <= set(named), named
    assert all(re.fullmatch(_DURATION, value) for value in named.values()), named
    # the same system prompt again: part of the prompt now comes from the KV cache
    again = cli.run("run", "short", "--verbose", "Name a colour.")
    cached = re.search(r"prompt cached count: +(\d+)", again.stderr)
    assert cached and int(cached.group(1)) > 0, again.stderr


def test_format_json_answers_json(cli: CliHome) -> None:
    # --format json constrains the answer to JSON, but a JSON string may go on for ever: when
    # the model ends the answer it must parse; when num_predict cuts it, what was printed
    # must be the start of a JSON object (whatever this CPU makes the model say).
    from test_fault_support import is_json_prefix

    limit = 200
    with cli.client() as client:
        for _ in client.create("json", from_=MODEL, parameters={"num_predict": limit, "seed": 3}):
            pass
    result = cli.run(
        "run",
        "json",
        "--verbose",
        "--format",
        "json",
        'Give a JSON object with a key "colour" whose value is a colour.',
    )
    assert result.returncode == 0, result.stderr
    answer = result.stdout.strip()
    assert answer.startswith("{"), result.stdout
    # Anchored: "prompt eval count: N token(s)" comes first and must not be read as this.
    generated = re.search(r"^eval count: +(\d+) token", result.stderr, re.MULTILINE)
    assert generated, result.stderr
    if int(generated.group(1)) < limit:  # the model ended the answer: done_reason "stop"
        assert isinstance(json.loads(answer), dict), result.stdout
    else:  # done_reason "length"
        assert int(generated.group(1)) == limit
        assert is_json_prefix(answer), result.stdout


def test_words_wrap_at_the_terminal_width_unless_told_not_to(cli: CliHome) -> None:
    prompt = "Write three long sentences about the sea."
    with cli.client() as client:
        for _ in client.create("wordy", from_=MODEL, parameters={"num_predict": 60, "seed": 1}):
            pass
    # The unwrapped answer is the reference: what this CPU's model writes is not assumed.
    child = cli.spawn("run", "wordy", "--keepalive", "10m", "--nowordwrap", prompt, columns=40)
    child.expect(pexpect.EOF)
    unwrapped = _plain(child.before)
    child = cli.spawn("run", "wordy", prompt, columns=40)
    child.expect(pexpect.EOF)
    wrapped = _plain(child.before)
    # the same seeded answer both times: wrapping moved line breaks, it lost no word
    assert wrapped.split() == unwrapped.split()
    for line in wrapped.splitlines():
        assert len(line) <= 40 or len(line.split()) == 1, wrapped  # only a lone word is longer
    long_lines = [line for line in unwrapped.splitlines() if len(line) > 40]
    if long_lines:  # each was broken into several
        assert len([ln for ln in wrapped.splitlines() if ln.strip()]) > len(
            [ln for ln in unwrapped.splitlines() if ln.strip()]
        ), wrapped
    cli.ok("rm", "wordy")


def _plain(text: str) -> str:
    """Terminal output without escape sequences, spinner frames and carriage returns."""
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    return re.sub(r"[⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏]", "", text).replace("\r", "")


def test_interactive_session(cli: CliHome) -> None:
    child = cli.spawn("run", MODEL)
    try:
        child.expect(">>> ")
        child.sendline("/set parameter num_predict 12")
        child.expect("Set parameter 'num_predict' to '12'")
        child.expect(">>> ")
        child.sendline("/set parameter temperature warm")
        child.expect("must be a number")
        child.expect(">>> ")
        child.sendline("/set system You are a helpful assistant who answers briefly.")
        child.expect("Set system message.")
        child.expect(">>> ")
        child.sendline("/set verbose")
        child.expect("Set 'verbose' mode.")
        child.expect(">>> ")

        child.sendline("What is 2 + 2?")
        # The last line, from its start ("prompt eval rate" comes before it).
        child.expect(r"\neval rate: +[0-9.]+ tokens/s")
        _verbose_values(child.before + child.after)
        child.expect(">>> ")

        # a multi-line message, and the history goes with it (prompt grows, cache reused)
        child.sendline('"""Now add one to that,')
        child.expect(r"\.\.\. ")
        child.sendline('and say the result."""')
        child.expect(r"prompt cached count: +(\d+)")
        assert int(child.match.group(1)) > 0
        child.expect(">>> ")

        child.sendline("/show info")
        child.expect("architecture +llama")
        child.expect(">>> ")
        child.sendline("/show parameters")
        child.expect("User defined parameters:")
        child.expect("num_predict +12")
        child.expect(">>> ")
        child.sendline("/show system")
        child.expect("You are a helpful assistant who answers briefly.")
        child.expect(">>> ")
        child.sendline("/nonsense")
        child.expect("Unknown command '/nonsense'")
        child.expect(">>> ")
        child.sendline("/clear")
        child.expect("Cleared session context")
        child.expect(">>> ")

        child.sendline("/bye")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    # typed messages are kept for the up arrow of the next session
    assert "What is 2 + 2?" in (cli.home / "history").read_text()


def test_ctrl_c_stops_the_answer_and_keeps_the_session(cli: CliHome) -> None:
    child = cli.spawn("run", MODEL, "--verbose")
    try:
        child.expect(">>> ")
        child.sendline("/set parameter num_predict 2000")
        child.expect(">>> ")
        child.sendline("Write a very long story about a dragon and a knight.")
        child.expect("knight.\r\n")
        child.expect("[A-Za-z]{2}")  # the answer is being written (escape codes have no pairs)
        child.sendintr()
        child.expect(">>> ")
        assert "total duration" not in child.before  # the answer did not finish
        # the daemon saw the client go and gave the slot back
        wait_for_stats(
            cli,
            lambda snapshot: (
                f"{MODEL}: request ended early" in daemon_log(cli)
                and all(m["active_requests"] == 0 for m in snapshot["models"])
            ),
        )

        child.sendline("/set parameter num_predict 4")
        child.expect(">>> ")
        child.sendline("Say hi.")
        # "\n" first: not the "prompt eval count" line before it
        child.expect(r"\neval count: +[1-4] token\(s\)")  # the session still answers
        child.expect(">>> ")
        child.sendintr()  # Ctrl-C at the prompt only explains how to leave
        child.expect("Use Ctrl \\+ d or /bye to exit.")
        child.expect(">>> ")
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0


def test_the_chat_starts_the_daemon_again_when_it_went_away(cli: CliHome) -> None:
    child = cli.spawn("run", "short")
    try:
        child.expect(">>> ")
        cli.stop_daemon()
        child.sendline("Hello?")
        child.expect("Error: no localllm daemon answers")
        child.expect(">>> ")
        child.sendline("Hello again?")  # the daemon is started again, the chat goes on
        child.expect("\r\n\r\n>>> ")
        # No error line (the model's own words may say "Error", as in "ImportError").
        assert not re.search(r"(?m)^Error: ", child.before), child.before
        child.sendline("/bye")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    assert cli.daemon_pid() is not None


def test_a_model_that_is_not_here_is_pulled_first(cli: CliHome) -> None:
    # no network in tests: the registry is a closed loopback port, so the pull says so
    lines = cli.fails("run", "nosuchmodel", "hi").strip().splitlines()
    assert lines[0] == "pulling manifest"  # the pull began, with its progress lines
    assert lines[-1].startswith("Error: cannot reach the registry 127.0.0.1")
    assert len([line for line in lines if "Error" in line]) == 1
    # the starter model comes back from its package, with no network
    cli.ok("rm", MODEL)
    result = cli.run("run", MODEL, "--verbose", "Hi")
    assert result.returncode == 0, result.stderr
    assert "success" in result.stderr and "eval count" in result.stderr
    assert MODEL in cli.ok("list")


def test_a_runner_killed_mid_answer_is_named_on_the_error_line(
    cli: CliHome, tmp_path: Path
) -> None:
    import os
    import signal
    import subprocess
    import sys

    from tiny_gguf import write_tiny_gguf

    # Thousands of tokens a second: a long context, so it is still answering when killed.
    write_tiny_gguf(tmp_path / "e.gguf", never_ends=True, context_length=32768)
    (tmp_path / "Modelfile").write_text("FROM ./e.gguf\nPARAMETER num_ctx 32768\n")
    cli.ok("create", "endless", "-f", str(tmp_path / "Modelfile"))
    child = subprocess.Popen(
        [sys.executable, "-m", "localllm", "run", "endless", "Go on for ever."],
        env=cli.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        # The answer has begun.
        assert child.stdout is not None and child.stdout.read(1)
        with cli.client() as client:
            pid = next(m for m in client.ps() if m["model"] == "endless:latest")["runner_pid"]
        os.kill(pid, signal.SIGILL)  # as a fault in llama.cpp's native code would
        out, err = child.communicate(timeout=120)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == 1, err
    assert out.endswith(b"\n"), "the answer so far ends its line before the error"
    error = err.decode().strip().splitlines()[-1]
    assert error.startswith("Error: the model runner for endless"), error
    assert "was killed by SIGILL (illegal instruction)" in error, error
