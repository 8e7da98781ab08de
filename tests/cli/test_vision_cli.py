"""Images from the command line: ``localllm create`` with a projector as a second FROM, ``run``
attaching image files named in the prompt (as Ollama's CLI does), the REPL's ``/image`` and
pasted paths. The evidence that an image reached the model is the prompt's token count
(``--verbose``) against the same text without it, in the same run; nothing asserts the
model's words."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pexpect
import pytest
from test_cli_run import _plain, _prompt_tokens
from test_cli_support import CliHome, cli_home
from tiny_mmproj import png_bytes, write_tiny_mmproj

from localllm.images import extract_image_paths

VISION = "tiny:vision"
TEXT = "tiny:text"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vision-cli")


@pytest.fixture(scope="module")
def cli(folder: Path, tiny_gguf: Path) -> Iterator[CliHome]:
    write_tiny_mmproj(folder / "mmproj.gguf")
    (folder / "Modelfile").write_text(
        f"FROM {tiny_gguf}\nFROM ./mmproj.gguf\nPARAMETER num_predict 2\nPARAMETER temperature 0\n"
    )
    (folder / "user").mkdir()
    with cli_home(folder / "home", HOME=str(folder / "user")) as home:
        home.ok("create", VISION, "-f", str(folder / "Modelfile"))
        home.ok("create", TEXT, "--from", str(tiny_gguf))
        yield home


@pytest.fixture(scope="module")
def photos(folder: Path) -> dict[str, Path]:
    plain = folder / "photo.png"
    plain.write_bytes(png_bytes((200, 10, 10)))
    spaced = folder / "my photo.jpg"
    spaced.write_bytes(png_bytes((10, 200, 10), fmt="JPEG"))
    home_photo = folder / "user" / "cat.png"
    home_photo.write_bytes(png_bytes((10, 10, 200)))
    return {"plain": plain, "spaced": spaced, "home": home_photo}


def test_create_from_a_modelfile_with_a_projector(cli: CliHome) -> None:
    shown = cli.ok("show", VISION, "--modelfile")
    froms = [line for line in shown.splitlines() if line.startswith("FROM ")]
    assert len(froms) == 2
    shown = cli.ok("show", VISION)
    assert "Projector" in shown and "clip" in shown and "vision" in shown
    projector = shown[shown.index("Projector") :].splitlines()
    assert not any("unknown" in line for line in projector[1:5])
    assert "Projector" not in cli.ok("show", TEXT)
    with cli.client() as client:
        assert "vision" in client.show(VISION)["capabilities"]
        assert "vision" not in client.show(TEXT)["capabilities"]


def test_run_attaches_the_images_a_prompt_names(cli: CliHome, photos: dict[str, Path]) -> None:
    without = cli.run("run", VISION, "--verbose", "Describe this")
    assert without.returncode == 0, without.stderr
    one = cli.run("run", VISION, "--verbose", f"Describe this {photos['plain']}")
    assert one.returncode == 0, one.stderr
    assert f"Added image '{photos['plain']}'" in one.stderr
    assert _prompt_tokens(one.stderr) > _prompt_tokens(without.stderr)
    # quoted with a space, and under ~: two more images, the same text left
    three = cli.run(
        "run",
        VISION,
        "--verbose",
        f"Describe this {photos['plain']} '{photos['spaced']}' ~/cat.png",
    )
    assert three.returncode == 0, three.stderr
    assert f"Added image '{photos['spaced']}'" in three.stderr
    assert "Added image '~/cat.png'" in three.stderr
    per_image = _prompt_tokens(one.stderr) - _prompt_tokens(without.stderr)
    assert _prompt_tokens(three.stderr) >= _prompt_tokens(without.stderr) + 2 * per_image


def test_a_text_model_says_it_cannot_read_images_in_one_line(
    cli: CliHome, photos: dict[str, Path]
) -> None:
    stderr = cli.fails("run", TEXT, f"Describe {photos['plain']}")
    errors = [line for line in stderr.splitlines() if line.startswith("Error")]
    assert errors == [f"Error: {TEXT} cannot read images: the model has no vision support"]
    # piped text is data: a path in it attaches nothing
    piped = cli.run("run", TEXT, "Summarize", input=f"see {photos['plain']}\n")
    assert piped.returncode == 0, piped.stderr
    assert "Added image" not in piped.stderr


def _expect_prompt(child: Any) -> str:
    child.expect(">>> ")
    return _plain(child.before)


def test_repl_image_command_and_a_pasted_path(cli: CliHome, photos: dict[str, Path]) -> None:
    child = cli.spawn("run", VISION, "--verbose")
    try:
        _expect_prompt(child)
        child.sendline("Describe")
        without = _prompt_tokens(_expect_prompt(child))
        child.sendline("/clear")
        _expect_prompt(child)
        child.sendline(f"/image {photos['plain']}")
        assert f"Added image '{photos['plain']}'" in _expect_prompt(child)
        child.sendline("Describe")
        with_image = _prompt_tokens(_expect_prompt(child))
        assert with_image > without
        child.sendline("/clear")
        _expect_prompt(child)
        # drag-and-drop: the terminal pastes the path escaped; the question follows
        child.sendline(str(photos["spaced"]).replace(" ", "\\ "))
        assert f"Added image '{photos['spaced']}'" in _expect_prompt(child)
        child.sendline("Describe")
        assert _prompt_tokens(_expect_prompt(child)) == with_image
        child.sendline("/image /no/such/file.png")
        assert "Error: cannot read /no/such/file.png" in _expect_prompt(child)
        child.sendline("/bye")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0


def test_paths_are_found_as_ollama_finds_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("photo.png", "my photo.JPG", "cat.gif"):
        (tmp_path / name).write_bytes(b"bytes")
    text, found = extract_image_paths("what is in ./photo.png and './my photo.JPG'? ~/cat.gif")
    assert text == "what is in and ?"
    assert [typed for typed, _ in found] == ["./photo.png", "./my photo.JPG", "~/cat.gif"]
    assert found[2][1] == tmp_path / "cat.gif"
    text, found = extract_image_paths(r"see ./my\ photo.JPG now")
    assert (text, [p for _, p in found]) == ("see now", [Path("my photo.JPG")])
    # a missing file, a bare word and another extension stay text
    for prompt in ("nope ./missing.png", "photo.png alone", "./photo.webp", "./photo.pngs"):
        assert extract_image_paths(prompt) == (prompt, [])
