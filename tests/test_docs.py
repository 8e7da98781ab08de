"""The README and the pages under ``docs/`` stay true: every relative link leads to a file (and
an anchor to a heading), no page is left unlinked, and the lists of record (the configuration
table, the commands, the Modelfile's parameters, the benchmark scripts, the map's module names)
match the code they describe."""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from pathlib import Path

import pytest

from localllm.cli.commands import COMMANDS
from localllm.settings import Settings
from localllm.store.models import FIXED_OPTIONS, OPTION_TYPES

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]

_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
_LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)


def _prose(text: str) -> str:
    """The text outside fenced code blocks (a ``#`` comment there is no heading, a link no
    link)."""
    return _FENCE.sub("", text)


def _code_blocks(text: str) -> list[str]:
    return [m.group(0) for m in _FENCE.finditer(text)]


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: inline code and link targets reduced to their
    text, lower case, punctuation dropped, spaces made hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").strip().lower()
    kept = []
    for char in text:
        if char in " -_" or unicodedata.category(char)[0] in "LN":
            kept.append(char)
    return "".join(kept).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor of a Markdown page, with GitHub's ``-1``, ``-2`` for repeated headings."""
    seen: dict[str, int] = {}
    out = set()
    for match in _HEADING.finditer(_prose(path.read_text(encoding="utf-8"))):
        slug = _slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def links(path: Path) -> list[str]:
    """The targets of the links in a page's prose."""
    return [m.group(1) for m in _LINK.finditer(_prose(path.read_text(encoding="utf-8")))]


def _relative(target: str) -> bool:
    return not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I)


def test_the_slug_follows_github() -> None:
    assert _slug("Tools (MCP)") == "tools-mcp"
    assert _slug("Many daemons behind one endpoint (`localllm gateway`)") == (
        "many-daemons-behind-one-endpoint-localllm-gateway"
    )
    assert _slug("A request's way") == "a-requests-way"
    assert _slug("The ±20 % target") == "the-20--target"
    assert _slug("OpenMP or ggml's own threadpool") == "openmp-or-ggmls-own-threadpool"


def test_the_checker_sees_a_broken_link_and_a_broken_anchor(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\n## Part one\n\n[ok](#part-one) [bad](#part-two) [gone](missing.md)\n"
        "```sh\n# not a heading\n[not a link](nowhere.md)\n```\n"
    )
    assert anchors(page) == {"title", "part-one"}
    assert links(page) == ["#part-one", "#part-two", "missing.md"]
    assert _broken(page) == ["#part-two: no such heading", "missing.md: no such file"]


def _broken(page: Path) -> list[str]:
    problems = []
    for target in links(page):
        if not _relative(target):
            continue
        file_part, _, anchor = target.partition("#")
        destination = (page.parent / file_part).resolve() if file_part else page
        if not destination.exists():
            problems.append(f"{target}: no such file")
            continue
        if anchor:
            if destination.suffix != ".md" or destination.is_dir():
                problems.append(f"{target}: an anchor into a file that is not a page")
            elif anchor not in anchors(destination):
                problems.append(f"{target}: no such heading")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_leads_somewhere(page: Path) -> None:
    assert _broken(page) == []


def test_no_page_is_orphaned() -> None:
    linked: set[Path] = set()
    for index in (README, DOCS / "README.md"):
        for target in links(index):
            if _relative(target) and target.partition("#")[0]:
                linked.add((index.parent / target.partition("#")[0]).resolve())
    assert (DOCS / "README.md").resolve() in linked  # the index is reached from the README
    orphans = [p.name for p in DOCS.glob("*.md") if p.name != "README.md" and p not in linked]
    assert orphans == []


def test_the_readme_is_what_a_newcomer_reads_first() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 350
    first_block = _code_blocks(text)[0]
    assert 'pip install ".[starter]" && localllm run smollm2:135m' in first_block
    assert 'pip install -e ".[test]" && pytest' in first_block
    # the before-stop hook and CI read command 2 so: pip install ... pytest, in one code span
    command = re.search(r"pip install[^`]*pytest", text)
    assert command is not None and command.group(0) in first_block
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install -e ".[test]"' in ci and re.search(r"^pytest\b", ci, re.M)
    for page in ("docs/configuration.md", "docs/api.md", "docs/cli.md", "docs/README.md"):
        assert page in links(README), f"the README does not link {page}"


def _table_variables(text: str) -> set[str]:
    """Variables named in the first cell of a table row."""
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([A-Z][A-Z0-9_]+)`", line.split("|")[1]))
    return names


def test_the_configuration_table_lists_every_setting() -> None:
    table = _table_variables((DOCS / "configuration.md").read_text(encoding="utf-8"))
    settings = {f.metadata["env"] for f in dataclasses.fields(Settings) if f.metadata.get("env")}
    assert settings - table == set(), "settings missing from docs/configuration.md"
    scripts = {
        name
        for path in [*(ROOT / "scripts").rglob("*.sh"), ROOT / ".ci" / "run"]
        for name in re.findall(r"\bLOCALLLM_[A-Z0-9_]*[A-Z0-9]\b", path.read_text())
    }
    assert scripts - table == set(), "the scripts' variables missing from docs/configuration.md"
    # and nothing listed that no longer exists
    listed = {name for name in table if name.startswith("LOCALLLM_")}
    assert listed - settings - scripts == set()


def test_every_command_is_documented_and_every_documented_command_exists() -> None:
    cli = (DOCS / "cli.md").read_text(encoding="utf-8")
    names = {name for command in COMMANDS for name in command.names}
    for command in COMMANDS:
        assert f"localllm {command.name}" in cli, f"docs/cli.md does not show {command.name}"
    for page in PAGES:
        for block in _code_blocks(page.read_text(encoding="utf-8")):
            for word in re.findall(r"^\s*(?:\S+ \| )?localllm ([a-z][\w-]*)", block, re.M):
                assert word in names, f"{page.name}: `localllm {word}` is no command"


def test_the_modelfile_page_names_every_parameter() -> None:
    page = (DOCS / "modelfile.md").read_text(encoding="utf-8")
    for name in [*OPTION_TYPES, *FIXED_OPTIONS]:
        assert f"`{name}`" in page, f"docs/modelfile.md does not name {name}"


def test_the_benchmarks_page_names_every_script() -> None:
    page = (DOCS / "benchmarks.md").read_text(encoding="utf-8")
    for script in sorted((ROOT / "benchmarks").glob("[!_]*.py")):
        assert f"benchmarks/{script.name}" in page


def test_the_map_names_only_what_is_in_the_tree() -> None:
    text = (DOCS / "ARCHITECTURE.md").read_text(encoding="utf-8")
    # every path the map names exists (a module of daemon/ may be named from there: api/core.py)
    for token in set(re.findall(r"`([\w.]+(?:/[\w.]+)+/?)`", text)):
        candidates = [ROOT / token, ROOT / "daemon" / token]
        assert any(c.exists() for c in candidates), f"docs/ARCHITECTURE.md names {token}"
    # every module a room's row names is in that room
    for row in re.findall(r"^\| `((?:daemon|localllm)/(?:\w+/)?)`[^|]*\|(.*)\|$", text, re.M):
        folder, modules = ROOT / row[0], row[1]
        for module in re.findall(r"`(\w+\.py)`", modules):
            assert (folder / module).exists(), f"{row[0]}{module} is not in the tree"
    # and every package folder has its row
    for top in ("daemon", "localllm"):
        for folder in sorted((ROOT / top).iterdir()):
            if (folder / "__init__.py").exists():
                assert f"| `{top}/{folder.name}/` |" in text, f"the map has no {top}/{folder.name}/"


def test_the_api_page_lists_every_route(tmp_path: Path) -> None:
    from localllm.daemon.app import create_app

    page = (DOCS / "api.md").read_text(encoding="utf-8")
    rows = "\n".join(line for line in page.splitlines() if line.startswith("| `"))
    paths = create_app(Settings(home=tmp_path)).openapi()["paths"]
    assert len(paths) > 30  # the app's routes were read
    for path, operations in paths.items():
        for method in operations:
            assert f"`{method.upper()} {path}`" in rows or (
                # a route served for HEAD too is listed under its GET or POST
                method == "head" and f" {path}`" in rows
            ), f"docs/api.md has no row for {method.upper()} {path}"
