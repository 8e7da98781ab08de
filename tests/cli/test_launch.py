"""``localllm launch``: for each supported tool, a stand-in executable on ``PATH`` records the
environment, the arguments and the config files the real tool would read (the locations its
documentation gives, under a temporary ``HOME`` and ``XDG_CONFIG_HOME``), proving what
``launch`` writes and runs; configs the user had survive, with a backup. What the stand-in
got is then used the way the tool would, through the official ``anthropic`` and ``openai``
clients against the real daemon, with a tiny model whose template calls tools.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from ruamel.yaml import YAML
from test_daemon_support import Daemon, running_daemon
from tiny_gguf import HERMES_TEMPLATE, write_tiny_gguf

from localllm import LaunchError
from localllm.client import Client
from localllm.launch import TOOLS
from localllm.launch.configfile import update_json, update_toml
from localllm.launch.context import WANTED, choose_context, context_tag
from localllm.launch.pick import ask, installed_tools, local_models

pytestmark = pytest.mark.slow

HERMES = "tiny:hermes"
PLAIN = "tiny:plain"
TAG = context_tag(HERMES, WANTED)

# The stand-in: writes what it was started with, and the files it would read (those listed
# in NAME.reads.json beside it, and any argument naming a file), to NAME.record.json.
STANDIN = """#!{python}
import json, os, sys
from pathlib import Path
here = Path(__file__).resolve().parent
name = Path(sys.argv[0]).name
listed = here / f"{{name}}.reads.json"
reads = json.loads(listed.read_text()) if listed.exists() else []
reads += [a for a in sys.argv[1:] if os.path.isfile(a)]
files = {{p: (Path(p).read_text() if os.path.exists(p) else None) for p in reads}}
record = {{"argv": sys.argv[1:], "env": dict(os.environ), "files": files}}
(here / f"{{name}}.record.json").write_text(json.dumps(record))
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    models = tmp_path_factory.mktemp("models")
    # trained for the 64k coding tools want; the plain one for 4096 tokens
    hermes = write_tiny_gguf(
        models / "hermes.gguf", chat_template=HERMES_TEMPLATE, context_length=WANTED
    )
    plain = write_tiny_gguf(models / "plain.gguf")
    with running_daemon(tmp_path_factory.mktemp("launch") / "home", num_parallel=1) as d:
        client = Client(d.settings)
        list(client.create(HERMES, from_=str(hermes)))
        list(client.create(PLAIN, from_=str(plain)))
        yield d


class Launch:
    """A temporary HOME with stand-ins on PATH, and ``localllm launch`` run in it."""

    def __init__(self, daemon: Daemon, root: Path) -> None:
        self.daemon = daemon
        self.home = root / "home"
        self.xdg = root / "xdg"
        self.bin = root / "bin"
        for folder in (self.home, self.xdg, self.bin):
            folder.mkdir()

    def standin(self, command: str, reads: list[Path]) -> None:
        """Put a stand-in for ``command`` on PATH that records the ``reads`` files too."""
        path = self.bin / command
        path.write_text(STANDIN.format(python=sys.executable))
        path.chmod(0o755)
        (self.bin / f"{command}.reads.json").write_text(json.dumps([str(p) for p in reads]))

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in self.daemon.env.items() if k not in ("HOME", "XDG_CONFIG_HOME")}
        env.update(
            HOME=str(self.home),
            XDG_CONFIG_HOME=str(self.xdg),
            PATH=f"{self.bin}{os.pathsep}{os.path.dirname(sys.executable)}",
        )
        return env

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "localllm", "launch", *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=300,
            stdin=subprocess.DEVNULL,
        )
        if check:
            assert done.returncode == 0, done.stderr
        return done

    def record(self, command: str) -> dict[str, Any]:
        return json.loads((self.bin / f"{command}.record.json").read_text())  # type: ignore[no-any-return]


@pytest.fixture
def launch(daemon: Daemon, tmp_path: Path) -> Launch:
    return Launch(daemon, tmp_path)


def _backups(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f"{path.name}.localllm-backup-*"))


def _chat_works(base_url: str, key: str, model: str) -> None:
    """The endpoint, key and model a tool was given answer a chat through ``openai``."""
    client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)
    answer = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=3, temperature=0
    )
    assert answer.choices[0].finish_reason in ("stop", "length")


# --- Claude Code --------------------------------------------------------------------------


def test_claude_code(launch: Launch, daemon: Daemon) -> None:
    settings = launch.home / ".claude" / "settings.json"
    settings.parent.mkdir()
    mine = {"theme": "dark", "env": {"MY_VAR": "1"}, "permissions": {"allow": ["Bash(ls)"]}}
    settings.write_text(json.dumps(mine))
    launch.standin("claude", [settings])
    done = launch.run("claude", "--model", HERMES, "--", "--resume", "x y")
    record = launch.record("claude")
    assert record["argv"] == ["--model", TAG, "--resume", "x y"]
    env = record["env"]
    assert env["ANTHROPIC_BASE_URL"] == daemon.url
    assert env["ANTHROPIC_API_KEY"] == ""  # a user's Anthropic key never goes to the daemon
    for name in ("MODEL", "DEFAULT_OPUS_MODEL", "DEFAULT_SONNET_MODEL", "DEFAULT_HAIKU_MODEL"):
        assert env[f"ANTHROPIC_{name}"] == TAG
    assert env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] == str(WANTED)
    # a launch writes no file: the user's settings are as they were
    assert json.loads(record["files"][str(settings)]) == mine
    assert f"context of {WANTED} tokens" in done.stderr
    # what Claude Code would send, through the official client
    client = anthropic.Anthropic(
        base_url=env["ANTHROPIC_BASE_URL"], auth_token=env["ANTHROPIC_AUTH_TOKEN"], max_retries=0
    )
    message = client.messages.create(
        model=env["ANTHROPIC_MODEL"], max_tokens=3, messages=[{"role": "user", "content": "hi"}]
    )
    assert message.usage.output_tokens > 0
    counted = client.messages.count_tokens(
        model=env["ANTHROPIC_MODEL"], messages=[{"role": "user", "content": "hi"}]
    )
    assert counted.input_tokens > 0


def test_claude_code_config(launch: Launch) -> None:
    settings = launch.home / ".claude" / "settings.json"
    settings.parent.mkdir()
    original = json.dumps({"theme": "dark", "env": {"MY_VAR": "1"}}, indent=4)
    settings.write_text(original)
    done = launch.run("claude", "--config", "--model", HERMES)
    data = json.loads(settings.read_text())
    assert data["theme"] == "dark" and data["env"]["MY_VAR"] == "1"
    assert data["env"]["ANTHROPIC_MODEL"] == TAG
    (backup,) = _backups(settings)
    assert backup.read_text() == original
    assert "env.ANTHROPIC_BASE_URL" in done.stderr and "start it with: claude" in done.stderr
    # nothing to start, and Claude Code need not even be installed for --config
    assert not (launch.bin / "claude.record.json").exists()
    # a second --config changes nothing and makes no second backup
    again = launch.run("claude", "--config", "--model", HERMES)
    assert "already set up" in again.stderr and len(_backups(settings)) == 1


# --- Codex --------------------------------------------------------------------------------


def _overrides(argv: list[str]) -> dict[str, Any]:
    """Codex's ``-c key=value`` arguments, each value read as TOML, as Codex reads them."""
    out = {}
    for flag, value in itertools.pairwise(argv):
        if flag == "-c":
            key, _, text = value.partition("=")
            out[key] = tomllib.loads(f"v = {text}")["v"]
    return out


def test_codex(launch: Launch, daemon: Daemon) -> None:
    config = launch.home / ".codex" / "config.toml"
    config.parent.mkdir()
    config.write_text('# mine\nmodel = "gpt-5"\n')
    launch.standin("codex", [config])
    launch.run("codex", "--model", HERMES, "--", "exec", "hello")
    record = launch.record("codex")
    argv = record["argv"]
    assert argv[-4:] == ["-m", TAG, "exec", "hello"]
    overrides = _overrides(argv)
    assert overrides["model_provider"] == "localllm"
    assert overrides["model_context_window"] == WANTED
    assert overrides["web_search"] == "disabled"  # a hosted tool the daemon cannot run
    assert overrides["model_providers.localllm.wire_api"] == "responses"
    base_url = overrides["model_providers.localllm.base_url"]
    assert base_url == f"{daemon.url}/v1"
    assert record["files"][str(config)] == '# mine\nmodel = "gpt-5"\n'  # untouched
    # what Codex would send: a streamed Responses request with a function tool
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    shell = {
        "type": "function",
        "name": "shell",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        "strict": False,
    }
    with client.responses.stream(
        model=TAG,
        instructions="You are Codex.",
        input=[
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "ls"}]}
        ],
        tools=[shell],  # type: ignore[list-item]
        tool_choice="auto",
        parallel_tool_calls=False,
        store=False,
        include=["reasoning.encrypted_content"],
        prompt_cache_key="session-1",
        max_output_tokens=4,
    ) as stream:
        kinds = [event.type for event in stream]
    # the tiny model is cut at 4 tokens (Codex reads response.incomplete as such)
    history: list[Any] = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "x"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "ls"}]},
        {"type": "reasoning", "summary": [], "encrypted_content": "thought"},
        {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": '{"cmd":"ls"}'},
        # newer Codex sends a tool's output as content items
        {
            "type": "function_call_output",
            "call_id": "c1",
            "output": [{"type": "input_text", "text": "a"}],
        },
    ]
    again = client.responses.create(
        model=TAG, input=history, tools=[shell], tool_choice="required", max_output_tokens=64
    )  # type: ignore[call-overload]
    (call,) = [item for item in again.output if item.type == "function_call"]
    assert call.name == "shell" and isinstance(json.loads(call.arguments), dict)
    assert kinds[0] == "response.created" and kinds[-1] in (
        "response.completed",
        "response.incomplete",
    )


def test_codex_config(launch: Launch) -> None:
    config = launch.home / "elsewhere" / "config.toml"  # CODEX_HOME moves it
    config.parent.mkdir()
    original = '# my settings\nmodel = "gpt-5"\n\n[profiles.deep]\nmodel = "o3" # keep\n'
    config.write_text(original)
    env = launch.env()
    env["CODEX_HOME"] = str(config.parent)
    done = subprocess.run(
        [sys.executable, "-m", "localllm", "launch", "codex", "--config", "--model", HERMES],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    text = config.read_text()
    assert "# my settings" in text and 'model = "o3" # keep' in text
    data = tomllib.loads(text)
    assert data["model"] == TAG and data["model_provider"] == "localllm"
    assert data["model_providers"]["localllm"]["wire_api"] == "responses"
    assert data["profiles"]["deep"]["model"] == "o3"
    assert '"gpt-5" -> ' in done.stderr
    (backup,) = _backups(config)
    assert backup.read_text() == original


# --- OpenCode -----------------------------------------------------------------------------


def test_opencode(launch: Launch) -> None:
    config = launch.xdg / "opencode" / "opencode.json"
    launch.standin("opencode", [config])
    launch.run("opencode", "--model", HERMES)
    record = launch.record("opencode")
    assert record["argv"] == ["--model", f"localllm/{TAG}"]
    inline = json.loads(record["env"]["OPENCODE_CONFIG_CONTENT"])
    provider = inline["provider"]["localllm"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["models"][TAG]["limit"]["context"] == WANTED
    assert record["files"][str(config)] is None  # no file written by a launch
    _chat_works(provider["options"]["baseURL"], provider["options"]["apiKey"], TAG)


def test_opencode_config_keeps_other_providers(launch: Launch) -> None:
    config = launch.xdg / "opencode" / "opencode.json"
    config.parent.mkdir(parents=True)
    mine = {"theme": "tokyonight", "provider": {"other": {"npm": "x", "models": {"m": {}}}}}
    config.write_text(json.dumps(mine))
    launch.run("opencode", "--config", "--model", HERMES)
    data = json.loads(config.read_text())
    assert data["theme"] == "tokyonight" and data["provider"]["other"] == mine["provider"]["other"]
    assert data["model"] == f"localllm/{TAG}"
    assert data["provider"]["localllm"]["models"][TAG]["limit"]["context"] == WANTED
    assert json.loads(_backups(config)[0].read_text()) == mine


# --- Continue -----------------------------------------------------------------------------


def test_continue(launch: Launch, daemon: Daemon) -> None:
    launch.standin("cn", [])
    launch.run("continue", "--model", HERMES, "--", "-p", "hi")
    record = launch.record("cn")
    assert record["argv"][0] == "--config" and record["argv"][2:] == ["-p", "hi"]
    written = YAML(typ="safe").load(record["files"][record["argv"][1]])
    assert written["schema"] == "v1"
    (model,) = written["models"]
    assert model["provider"] == "openai" and model["model"] == TAG
    assert model["defaultCompletionOptions"]["contextLength"] == WANTED
    assert model["capabilities"] == ["tool_use"]
    _chat_works(model["apiBase"], model["apiKey"], model["model"])


def test_continue_config_keeps_comments_and_models(launch: Launch) -> None:
    config = launch.home / ".continue" / "config.yaml"
    config.parent.mkdir()
    original = (
        "name: Mine  # my config\nversion: 0.0.1\nschema: v1\nmodels:\n"
        "  - name: GPT\n    provider: openai\n    model: gpt-4o\n"
    )
    config.write_text(original)
    launch.run("continue", "--config", "--model", HERMES)
    text = config.read_text()
    assert "# my config" in text
    data = YAML(typ="safe").load(io.StringIO(text))
    assert [m["name"] for m in data["models"]] == ["GPT", f"{TAG} (localllm)"]
    assert _backups(config)[0].read_text() == original


# --- Aider --------------------------------------------------------------------------------


def test_aider(launch: Launch) -> None:
    conf = launch.home / ".aider.conf.yml"
    conf.write_text("dark-mode: true\n")
    launch.standin("aider", [conf])
    launch.run("aider", "--model", HERMES)
    record = launch.record("aider")
    argv = record["argv"]
    assert argv[:2] == ["--model", f"openai/{TAG}"]
    metadata = json.loads(record["files"][argv[argv.index("--model-metadata-file") + 1]])
    assert metadata[f"openai/{TAG}"]["max_input_tokens"] == WANTED
    assert record["files"][str(conf)] == "dark-mode: true\n"
    env = record["env"]
    _chat_works(env["OPENAI_API_BASE"], env["OPENAI_API_KEY"], TAG)


def test_aider_config(launch: Launch) -> None:
    conf = launch.home / ".aider.conf.yml"
    conf.write_text("# aider settings\ndark-mode: true\n")
    launch.run("aider", "--config", "--model", HERMES)
    data = YAML(typ="safe").load(conf.read_text())
    assert data["dark-mode"] is True and data["model"] == f"openai/{TAG}"
    assert "# aider settings" in conf.read_text()
    metadata = json.loads((launch.home / ".aider.model.metadata.json").read_text())
    assert metadata[f"openai/{TAG}"]["max_input_tokens"] == WANTED


# --- Zed ----------------------------------------------------------------------------------


def test_zed_keeps_the_users_settings(launch: Launch) -> None:
    settings = launch.xdg / "zed" / "settings.json"
    settings.parent.mkdir(parents=True)
    original = (
        '// my Zed settings\n{\n  "theme": "One Dark", // dark\n  "language_models": '
        '{"openai_compatible": {"localllm": {"available_models": [{"name": "old", '
        '"max_tokens": 8}]}}},\n}\n'
    )
    settings.write_text(original)
    launch.standin("zed", [settings])
    done = launch.run("zed", "--model", HERMES, "--", "project/")
    record = launch.record("zed")
    assert record["argv"] == ["project/"]
    data = json.loads(record["files"][str(settings)])
    assert data["theme"] == "One Dark"
    provider = data["language_models"]["openai_compatible"]["localllm"]
    assert [m["name"] for m in provider["available_models"]] == ["old", TAG]
    assert provider["available_models"][1]["max_tokens"] == WANTED
    assert data["agent"]["default_model"] == {"provider": "localllm", "model": TAG}
    assert "comments were not kept" in done.stderr
    assert _backups(settings)[0].read_text() == original
    _chat_works(provider["api_url"], record["env"]["LOCALLLM_API_KEY"], TAG)


# --- Droid --------------------------------------------------------------------------------


def test_droid(launch: Launch) -> None:
    settings = launch.home / ".factory" / "settings.json"
    settings.parent.mkdir()
    theirs = {"model": "gpt-5", "baseUrl": "https://example.invalid/v1", "displayName": "Mine"}
    settings.write_text(json.dumps({"customModels": [theirs], "autonomy": "low"}))
    launch.standin("droid", [settings])
    launch.run("droid", "--model", HERMES)
    data = json.loads(launch.record("droid")["files"][str(settings)])
    assert data["autonomy"] == "low"
    mine, ours = data["customModels"]
    assert mine == theirs
    assert ours["provider"] == "generic-chat-completion-api" and ours["model"] == TAG
    _chat_works(ours["baseUrl"], ours["apiKey"], TAG)
    # launched again: the entry is not duplicated, the file not rewritten
    launch.run("droid", "--model", HERMES)
    assert len(json.loads(settings.read_text())["customModels"]) == 2
    assert len(_backups(settings)) == 1


# --- pickers, errors, the context ---------------------------------------------------------


def test_pickers(launch: Launch, daemon: Daemon) -> None:
    launch.standin("aider", [])
    launch.standin("cn", [])
    found = installed_tools({"PATH": str(launch.bin)})
    assert [tool.name for tool, _ in found] == ["continue", "aider"]
    models = local_models(daemon.client())
    names = [m.name for m in models]
    # the model that calls tools first; the tag launch made is one of them
    assert names.index(HERMES) < names.index(PLAIN)
    assert not next(m for m in models if m.name == PLAIN).calls_tools
    answers = iter(["9", "x", "2"])
    out = io.StringIO()
    picked = ask("Which?", ["a", "b", "c"], read=lambda _: next(answers), out=out, interactive=True)
    assert picked == 1 and "1. a" in out.getvalue() and "from 1 to 3" in out.getvalue()
    with pytest.raises(LaunchError, match=r"no terminal.*a, b"):
        ask("Which?", ["a", "b"], interactive=False)
    # no TOOL and no terminal: the installed tools are named
    done = launch.run("--model", HERMES, check=False)
    assert done.returncode == 1 and "aider" in done.stderr and "no terminal" in done.stderr


def test_errors(launch: Launch) -> None:
    done = launch.run("claude", "--model", HERMES, check=False)
    assert done.returncode == 1 and "not on PATH" in done.stderr and "--config" in done.stderr
    launch.standin("claude", [])
    done = launch.run("claude", "--model", "nope:1", check=False)
    assert done.returncode == 1 and "localllm pull nope:1" in done.stderr
    done = launch.run("vim", check=False)
    assert done.returncode == 1 and "unknown tool" in done.stderr
    done = launch.run("claude", "--model", PLAIN, check=False)
    assert done.returncode == 0 and "no tool calls" in done.stderr
    launch.standin("aider", [])  # Aider edits through text: no warning for it
    done = launch.run("aider", "--model", PLAIN, check=False)
    assert done.returncode == 0 and "no tool calls" not in done.stderr
    bad = launch.home / ".factory" / "settings.json"
    bad.parent.mkdir()
    bad.write_text("{not json")
    launch.standin("droid", [])
    done = launch.run("droid", "--model", HERMES, check=False)
    assert done.returncode == 1 and "not valid" in done.stderr
    assert bad.read_text() == "{not json"  # left alone


def test_the_context_tag(daemon: Daemon) -> None:
    client = daemon.client()
    chosen = choose_context(client, HERMES)
    assert (chosen.model, chosen.context, chosen.notes) == (TAG, WANTED, [])
    assert f"num_ctx {WANTED}" in " ".join(client.show(TAG).get("parameters", "").split())
    # the tag shares the model's weights and keeps its template (it calls tools)
    assert "tools" in client.show(TAG).get("capabilities", [])
    # chosen again: the same tag, not made twice
    assert choose_context(client, HERMES).model == TAG
    # a model trained for fewer tokens gets its trained length, and the launcher says so
    short = choose_context(client, PLAIN)
    assert (short.model, short.context) == ("tiny:plain-4k", 4096)
    assert "trained for 4096 tokens" in short.notes[0]
    assert context_tag("hf.co/Org/Repo-GGUF:Q4_K_M", 65536) == "repo-gguf:q4_k_m-64k"
    assert context_tag("qwen3:8b", 40000) == "qwen3:8b-40000"


def test_config_files_edits(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[a]\nx = 1\n")

    def edit(document: Any) -> list[str]:
        document["top"] = 2
        return ["top = 2"]

    change = update_toml(path, edit)
    assert tomllib.loads(path.read_text()) == {"top": 2, "a": {"x": 1}}
    assert change.backup is not None and change.backup.read_text() == "[a]\nx = 1\n"
    listed = tmp_path / "l.json"
    listed.write_text("[1]")
    with pytest.raises(LaunchError, match="not an object"):
        update_json(listed, lambda data: [])
    assert listed.read_text() == "[1]"


def test_every_tool_has_a_test() -> None:
    tested = {"claude", "codex", "opencode", "continue", "aider", "zed", "droid"}
    assert set(TOOLS) == tested


def test_the_context_in_a_small_memory_cgroup(tmp_path: Path) -> None:
    """Where 64k tokens do not fit with the model's slots: one slot when that fits, else the
    largest context that fits, and the launcher says which (a daemon held to 900 MiB)."""
    from cgroup_support import memory_limited

    # 64k-trained tiny models whose KV cache is 4 KiB and 16 KiB a token (f16)
    one_slot, shorter = (
        write_tiny_gguf(tmp_path / f"kv{n}.gguf", n_layers=n, n_head_kv=4, context_length=WANTED)
        for n in (4, 16)
    )
    with (
        memory_limited(900 << 20) as group,
        running_daemon(tmp_path / "home", group.enter, num_threads=1, num_parallel=4) as d,
    ):
        client = d.client()
        list(client.create("tiny:kv4", from_=str(one_slot)))
        list(client.create("tiny:kv16", from_=str(shorter)))
        # 4 slots × 64k × 4 KiB is 1 GiB; one slot, 256 MiB
        chosen = choose_context(client, "tiny:kv4")
        assert (chosen.context, chosen.parameters) == (
            WANTED,
            {"num_ctx": WANTED, "num_parallel": 1},
        )
        assert "only with one slot" in chosen.notes[0]
        # one slot × 64k × 16 KiB is 1 GiB: a shorter context, as the plan suggests
        chosen = choose_context(client, "tiny:kv16")
        assert 4096 <= chosen.context < WANTED and chosen.parameters == {"num_ctx": chosen.context}
        assert "largest context that does" in chosen.notes[0]
        assert chosen.model == context_tag("tiny:kv16", chosen.context)
        client.load(chosen.model)  # and it loads
        assert group.oom_kills() == 0
