"""The CLI's model commands through an auto-started daemon: list, show, cp, rm, create, stop,
with tables for people, ``--json`` for scripts, and one-line errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest
from test_cli_support import CliHome, cli_home


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliHome]:
    with cli_home(tmp_path_factory.mktemp("cli-store") / "home") as home:
        yield home


def test_starter_model_is_listed_and_shown_without_network(cli: CliHome) -> None:
    header, row = cli.ok("list").splitlines()[:2]
    assert header.split() == ["NAME", "ID", "SIZE", "MODIFIED"]
    assert row.startswith("smollm2:135m") and "98 MB" in row

    shown = cli.ok("show", "smollm2:135m")
    for fragment in ["architecture", "llama", "134.52M", "Q4_1", "8192", "576", "completion"]:
        assert fragment in shown
    assert "apache-2.0" in shown and '"<|im_end|>"' in shown

    data = cli.json("show", "smollm2:135m")
    assert data["details"]["quantization_level"] == "Q4_1"
    assert data["model_info"]["llama.context_length"] == 8192
    assert "{{" in cli.ok("show", "smollm2:135m", "--template")
    assert cli.ok("show", "smollm2:135m", "--license").strip() == "apache-2.0"
    assert cli.ok("show", "smollm2:135m", "--modelfile").startswith("# Modelfile generated")

    [listed] = [m for m in cli.json("list") if m["name"] == "smollm2:135m"]
    assert listed["size"] == 98362830 and listed["details"]["family"] == "llama"


def test_create_from_file_cp_rm_round_trip(cli: CliHome, tiny_gguf: Path) -> None:
    assert "created 'tiny:f32'" in cli.ok("create", "tiny:f32", "--from", str(tiny_gguf))
    assert "copied 'tiny:f32' to 'me/tiny:copy'" in cli.ok("cp", "tiny:f32", "me/tiny:copy")
    names = {m["name"] for m in cli.json("list")}
    assert {"tiny:f32", "me/tiny:copy", "smollm2:135m"} <= names

    removed = cli.ok("rm", "tiny:f32")
    assert "deleted 'tiny:f32'" in removed
    assert cli.json("show", "me/tiny:copy")["details"]["quantization_level"] == "F32"
    cli.ok("rm", "me/tiny:copy")
    assert "tiny" not in cli.ok("list")


def test_create_with_a_modelfile(cli: CliHome, tiny_gguf: Path, tmp_path: Path) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "tiny.gguf").write_bytes(tiny_gguf.read_bytes())
    (folder / "Modelfile").write_text(
        "# a relative FROM is read next to the Modelfile\n"
        "FROM ./tiny.gguf\n"
        "PARAMETER temperature 0.25\n"
        "PARAMETER stop <|im_end|>\n"
        "PARAMETER stop END\n"
        'SYSTEM """You are terse.\nAnswer in one word."""\n'
        "MESSAGE user Hello\n"
        "MESSAGE assistant Hi\n"
        "LICENSE MIT\n"
    )
    assert "created 'mf:test'" in cli.ok("create", "mf:test", "-f", str(folder / "Modelfile"))
    data = cli.json("show", "mf:test")
    assert data["system"] == "You are terse.\nAnswer in one word."
    assert data["license"] == "MIT"
    assert data["messages"] == [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi"},
    ]
    parameters = cli.ok("show", "mf:test", "--parameters")
    assert "temperature" in parameters and "0.25" in parameters and '"END"' in parameters
    assert cli.ok("show", "mf:test", "--system").strip() == "You are terse.\nAnswer in one word."

    # A model built on a model inherits its layers and adds its own.
    (folder / "Modelfile.2").write_text("FROM mf:test\nPARAMETER num_predict 4\n")
    cli.ok("create", "mf:child", "--file", str(folder / "Modelfile.2"))
    child = cli.json("show", "mf:child")
    assert child["system"] == data["system"]
    assert "num_predict" in child["parameters"] and "temperature" in child["parameters"]
    cli.ok("rm", "mf:test", "mf:child")


def test_create_quantizes_a_float_model(cli: CliHome, tiny_gguf: Path) -> None:
    cli.ok("create", "tiny:q8", "--from", str(tiny_gguf), "--quantize", "q8_0")
    assert cli.json("show", "tiny:q8")["details"]["quantization_level"] == "Q8_0"
    error = cli.fails("quantize", "tiny:q8", "tiny:q4", "-q", "q4_K_M")
    assert "quantization is only supported for F16, BF16 and F32 models" in error
    cli.ok("rm", "tiny:q8")


def test_allow_requantize_is_passed_to_the_daemon(cli: CliHome, tiny_gguf: Path) -> None:
    cli.ok("create", "tiny:q8", "--from", str(tiny_gguf), "--quantize", "q8_0")
    try:
        cli.ok("quantize", "tiny:q8", "tiny:q4", "-q", "q4_K_M", "--allow-requantize")
        assert cli.json("show", "tiny:q4")["details"]["quantization_level"] == "Q4_K_M"
    finally:
        cli.run("rm", "tiny:q8", "tiny:q4")


def test_ps_and_stop(cli: CliHome) -> None:
    assert cli.json("ps") == []
    assert cli.ok("ps").split() == [
        "NAME",
        "ID",
        "SIZE",
        "PROCESSOR",
        "CONTEXT",
        "SLOTS",
        "THREADS",
        "TOKENS/S",
        "PREDICTED",
        "UNTIL",
    ]
    with cli.client() as client:
        client.generate("smollm2:135m", "Hi", options={"num_predict": 2}, keep_alive="10m")
    [loaded] = cli.json("ps")
    assert loaded["name"] == "smollm2:135m" and loaded["slots"] == 2
    assert loaded["busy_slots"] == 0 and loaded["context_length"] == 1024
    row = cli.ok("ps").splitlines()[1]
    assert row.startswith("smollm2:135m") and "CPU" in row and "1024" in row and "0/2" in row
    assert "minutes from now" in row

    watch = cli.spawn("ps", "--watch")
    try:
        watch.expect("TOKENS/S")
        watch.expect("smollm2:135m")  # refreshed from the live stats stream until Ctrl-C
        watch.sendintr()
        watch.expect(pexpect.EOF)
        watch.close()
        assert watch.exitstatus == 0
    finally:
        watch.close(force=True)

    assert cli.run("stop", "smollm2:135m").returncode == 0
    assert cli.json("ps") == []
    assert 'model "smollm2:135m" is not running' in cli.fails("stop", "smollm2:135m")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["show", "nosuchmodel"], 'model "nosuchmodel:latest" not found, try `localllm pull'),
        (["show", "../../etc/passwd"], "invalid model name"),
        (["run", "../../etc/passwd", "hi"], "invalid model name"),
        (["rm", "nosuch:tag"], "not found"),
        (["cp", "nosuch", "other"], "not found"),
        (["cp", "smollm2:135m", "bad name"], "invalid model name"),
        (["stop", "nosuch"], "not found"),
        (["create", "x", "--from", "/nonexistent/file.gguf"], "no such file"),
        (["create", "x"], "create needs --from FILE|FOLDER|MODEL or -f Modelfile"),
        (["create", "x", "-f", "/nonexistent/Modelfile"], "no such Modelfile"),
        (["create", "x", "--from", "smollm2:135m", "-q", "q3_xx"], "unsupported quant"),
    ],
)
def test_user_errors_are_one_line_without_traceback(
    cli: CliHome, args: list[str], fragment: str
) -> None:
    error = cli.fails(*args)
    assert fragment in error
    assert len(error.strip().splitlines()) == 1


def test_create_refuses_what_is_not_a_model(cli: CliHome, tmp_path: Path) -> None:
    fake = tmp_path / "fake.gguf"
    fake.write_text("not a model")
    assert "not a GGUF file" in cli.fails("create", "fake", "--from", str(fake))
    modelfile = tmp_path / "Modelfile"
    modelfile.write_text("FROM smollm2:135m\nADAPTER ./lora.gguf\n")
    assert "lora.gguf: no such file (an ADAPTER line)" in cli.fails(
        "create", "x", "-f", str(modelfile)
    )
    modelfile.write_text("FROM smollm2:135m\nPARAMETER temperature hot\n")
    assert "line 2: parameter 'temperature' must be a number" in cli.fails(
        "create", "x", "-f", str(modelfile)
    )
    assert "fake" not in cli.ok("list")


def test_list_json_is_parseable_by_scripts(cli: CliHome) -> None:
    models = json.loads(cli.ok("ls", "--json"))
    assert all({"name", "digest", "size", "modified_at"} <= set(m) for m in models)
