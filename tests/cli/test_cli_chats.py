"""``localllm chats`` (list, export, search, prompts) and ``localllm run --system-prompt NAME``
on the terminal UI's chat database: the same chats and prompts, read by the CLI."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_cli_support import CliHome, cli_home

from localllm.chats import ChatStore, StoredMessage, chat_db_path

MODEL = "smollm2:135m"


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliHome]:
    """A CLI home whose chat database has a branched chat and two saved prompts."""
    with cli_home(tmp_path_factory.mktemp("cli-chats") / "home") as home:
        store = ChatStore(chat_db_path(home.settings))
        chat = store.create_chat("Tides", MODEL, "Be brief.")
        question = store.add_message(chat.id, StoredMessage("user", "Why are there tides?"))
        store.add_message(chat.id, StoredMessage("assistant", "The Moon pulls the sea."))
        store.add_message(chat.id, StoredMessage("assistant", "Gravity."), parent=question.id)
        store.create_chat("Empty")
        store.save_prompt("pirate", "Talk like a pirate, always, in every answer you give.")
        store.save_prompt("long", "Talk like a pirate. " + "Use many nautical words. " * 8)
        store.close()
        yield home


def test_list_export_and_search(cli: CliHome, tmp_path: Path) -> None:
    listed = cli.json("chats", "list")
    assert [(c["title"], c["messages"]) for c in listed] == [("Tides", 2), ("Empty", 0)]
    chat_id = listed[0]["id"]

    markdown = cli.ok("chats", "export", str(chat_id))
    assert markdown.startswith("# Tides\n")
    assert "Gravity." in markdown and "The Moon" not in markdown  # the branch on screen

    out = tmp_path / "tides.json"
    cli.ok("chats", "export", str(chat_id), "--format", "json", "-o", str(out))
    assert json.loads(out.read_text()) == {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Why are there tides?"},
            {"role": "assistant", "content": "Gravity."},
        ],
    }
    assert "no chat 999" in cli.fails("chats", "export", "999")
    assert "cannot write" in cli.fails("chats", "export", str(chat_id), "-o", str(tmp_path))

    found = cli.ok("chats", "search", "moon")  # every branch, any case
    assert "The Moon pulls the sea." in found and "Gravity" not in found
    assert "pirate" in cli.ok("chats", "prompts")


def test_run_with_a_saved_system_prompt(cli: CliHome, tmp_path: Path) -> None:
    # The starter with a short answer: only the prompt's tokens are counted here, and a pirate
    # left to talk took up to 1,000 tokens (10 s of CPU on the suite's shared cores).
    modelfile = tmp_path / "Modelfile"
    modelfile.write_text(f"FROM {MODEL}\nPARAMETER num_predict 4\n")
    cli.ok("create", "brief-pirate", "-f", str(modelfile))

    def prompt_tokens(*flags: str) -> int:
        result = cli.run("run", "brief-pirate", "--verbose", *flags, "Hi")
        assert result.returncode == 0, result.stderr
        evaluated = re.search(r"prompt eval count: +(\d+)", result.stderr)
        cached = re.search(r"prompt cached count: +(\d+)", result.stderr)
        assert evaluated and cached, result.stderr
        return int(evaluated.group(1)) + int(cached.group(1))

    # the saved prompt is sent (replacing the template's default): the longer prompt makes
    # the same question longer by its extra words' tokens
    assert (
        prompt_tokens("--system-prompt", "long") > prompt_tokens("--system-prompt", "pirate") + 20
    )
    error = cli.fails("run", "brief-pirate", "--system-prompt", "sailor", "Hi")
    assert "no saved system prompt called 'sailor'" in error and "pirate" in error


def test_no_database_yet_is_said(tmp_path: Path) -> None:
    with cli_home(tmp_path / "empty") as empty:
        assert "no saved chats or prompts" in empty.fails("chats", "list")
        assert "no saved chats or prompts" in empty.fails("run", MODEL, "--system-prompt", "x")
