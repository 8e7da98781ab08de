"""A full disk at every write step of every store operation: the store stays as it was.

Each operation runs first on a counting :class:`~store_support.FaultyOps` to learn how many
file operations it makes; then once per step on a fresh copy of the same store, failing that
step with ``ENOSPC`` (and, for the big copies, after N bytes). After each failure: the error is
the store's clear :class:`DiskFullError`, the store holds exactly what it held before (names and
blobs: what the operation wrote was removed), no temporary file is left, and every model's
blobs hash to their digests. Then the same operation, without the fault, completes.

A pull is the one operation that keeps something: the blobs it completed and the partial
download of the one it was writing, so that pulling again resumes; its message says so.
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fakes.helpers import TinyModels
from fakes.ollama_registry import FakeRegistry
from store_support import FaultyOps, StoreState, assert_consistent, store_state, temporaries

from localllm import DiskFullError, ModelNotFoundError
from localllm.settings import Settings
from localllm.sources import pull
from localllm.store.models import create_model, load_model, quantize_model
from localllm.store.ollama_import import OllamaImporter
from localllm.store.store import Store

pytest_plugins = ["fakes.fixtures"]

Operation = Callable[[Store], object]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, tiny_models: TinyModels) -> dict[str, Path]:
    """The GGUFs the operations read: the tiny model, another one (a draft), a projector."""
    from tiny_mmproj import write_tiny_mmproj

    folder = tmp_path_factory.mktemp("fault-files")
    other = folder / "other.gguf"
    other.write_bytes(tiny_models.other)
    return {
        "tiny": tiny_models.f32_path,
        "other": other,
        "projector": write_tiny_mmproj(folder / "mmproj.gguf"),
    }


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory, files: dict[str, Path]) -> Path:
    """A store holding ``base:1`` (the tiny F32 model with text layers): every case starts
    from a copy of it."""
    root = tmp_path_factory.mktemp("baseline") / "store"
    create_model(
        Store(root),
        "base:1",
        gguf_file=files["tiny"],
        system="You are tiny.",
        parameters={"temperature": 0.5},
    )
    return root


@pytest.fixture(scope="module")
def ollama_root(tmp_path_factory: pytest.TempPathFactory, files: dict[str, Path]) -> Path:
    """An Ollama models folder holding ``imported:1`` (the layout is the store's own)."""
    root = tmp_path_factory.mktemp("ollama") / "models"
    create_model(Store(root), "imported:1", gguf_file=files["other"], license="MIT")
    return root


def _operations(files: dict[str, Path], ollama_root: Path) -> dict[str, Operation]:
    def import_ollama(store: Store) -> object:
        report = OllamaImporter(ollama_root, store).run()
        assert [o.status for o in report.outcomes] == ["imported"], report.outcomes
        return report

    return {
        "create from a file": lambda s: create_model(
            s, "made:1", gguf_file=files["tiny"], template="{{ .Prompt }}", messages=[]
        ),
        "create with a projector and a draft": lambda s: create_model(
            s,
            "vision:1",
            gguf_file=files["tiny"],
            projector_file=files["projector"],
            draft_file=files["other"],
        ),
        "create replacing a model": lambda s: create_model(
            s, "base:1", base="base:1", system="You are new."
        ),
        "quantize": lambda s: quantize_model(s, "base:1", "base:q8", "q8_0"),
        "quantize replacing a model": lambda s: quantize_model(s, "base:1", "base:1", "q8_0"),
        "copy": lambda s: s.copy("base:1", "copy:1"),
        "remove": lambda s: s.delete("base:1"),
        "import": import_ollama,
    }


OPERATIONS = [
    "create from a file",
    "create with a projector and a draft",
    "create replacing a model",
    "quantize",
    "quantize replacing a model",
    "copy",
    "remove",
    "import",
]


@pytest.fixture
def fresh(baseline: Path, tmp_path: Path) -> Iterator[Callable[[], Path]]:
    """Fresh copies of the baseline store."""
    count = 0

    def copy() -> Path:
        nonlocal count
        count += 1
        return Path(shutil.copytree(baseline, tmp_path / f"store{count}"))

    yield copy


@pytest.fixture
def run(operation: str, files: dict[str, Path], ollama_root: Path) -> Operation:
    """The test's ``operation`` (it is parametrised over them), ready to run on a store."""
    return _operations(files, ollama_root)[operation]


@pytest.mark.parametrize("operation", OPERATIONS)
def test_a_full_disk_at_any_step_leaves_the_store_as_it_was(
    operation: str, run: Operation, fresh: Callable[[], Path]
) -> None:
    counting = FaultyOps()
    run(Store(fresh(), ops=counting))
    assert counting.calls > 0
    before = store_state(fresh())
    for step in range(1, counting.calls + 1):
        # llama.cpp takes a second: a quantize is completed again only after the last step.
        again = "quantize" not in operation or step == counting.calls
        _fails_cleanly(run, fresh(), FaultyOps(at_call=step), before, complete=again)


def _fails_cleanly(
    run: Operation, root: Path, ops: FaultyOps, before: StoreState, complete: bool = True
) -> None:
    """``run`` on ``root`` with ``ops`` fails with the clear message and changes nothing;
    then (``complete``) it completes without the fault."""
    with pytest.raises(DiskFullError) as info:
        run(Store(root, ops=ops))
    message = str(info.value)
    assert message.startswith("disk full while "), message
    assert "the store is as it was; free some space" in message, message
    assert store_state(root) == before, f"the failed {ops.failed} changed the store"
    assert assert_consistent(root) == sorted(before.names)
    if complete:
        run(Store(root))  # the same operation, on the disk with room again, completes
        assert_consistent(root)


@pytest.mark.parametrize("operation", ["create from a file", "import"])
def test_a_disk_filling_up_midway_through_a_copy_leaves_nothing(
    operation: str, run: Operation, fresh: Callable[[], Path], files: dict[str, Path]
) -> None:
    before = store_state(fresh())
    size = files["tiny"].stat().st_size
    # Hard links would write nothing: the import must copy (another file system).
    for budget in (0, 1, 4096, size // 2, size - 1):
        ops = FaultyOps(after_bytes=budget)
        if operation == "import":
            ops.link = _cross_device  # type: ignore[method-assign]
        _fails_cleanly(run, fresh(), ops, before, complete=False)
        assert ops.written == budget


def _cross_device(source: Path, target: Path) -> None:
    raise OSError(errno.EXDEV, "Invalid cross-device link")


def test_a_read_only_store_refuses_changes_in_one_line(
    fresh: Callable[[], Path], files: dict[str, Path]
) -> None:
    root = fresh()
    before = store_state(root)
    for error in (errno.EROFS, errno.EACCES):
        for step in (1, 2):
            with pytest.raises(Exception, match=f"cannot write to the model store at {root}"):
                create_model(
                    Store(root, ops=FaultyOps(at_call=step, error=error)),
                    "made:1",
                    gguf_file=files["tiny"],
                )
            assert store_state(root) == before
    assert load_model(Store(root), "base:1").info.file_type == "F32"  # still served


def test_an_upload_that_fills_the_disk_leaves_no_blob(fresh: Callable[[], Path]) -> None:
    root = fresh()
    before = store_state(root)
    store = Store(root, ops=FaultyOps(after_bytes=10))
    with store.blob_writer() as writer, pytest.raises(DiskFullError, match="disk full"):
        writer.write(b"x" * 100)
    assert store_state(root) == before
    assert temporaries(root) == []


def test_a_pull_that_fills_the_disk_keeps_only_what_resumes(
    home: Path,
    registry_settings: Settings,
    registry: FakeRegistry,
    tiny_models: TinyModels,
) -> None:
    counting = FaultyOps()
    root = home / "counting"
    pull(Store(root, ops=counting), "tiny", registry_settings.replace(home=root))
    manifest = registry.models[("library/tiny", "latest")]
    steps = counting.calls
    assert steps > len(manifest.blobs) * 3  # each blob: writes, an fsync, a rename
    faulted = 0
    for step in range(1, steps + 1):
        root = home / f"store{step}"
        settings = registry_settings.replace(home=root)
        ops = FaultyOps(at_call=step)
        try:
            pull(Store(root, ops=ops), "tiny", settings)
        except DiskFullError as error:
            faulted += 1
            said = str(error)
            assert "pull again to resume" in said or "pulling again resumes" in said, said
        else:
            # Loopback delivers a blob in pieces of varying sizes, so a run may need fewer
            # batched writes than the counting run: only then may a step find no call to fail.
            assert ops.failed is None and ops.calls < step, (step, ops.calls, ops.failed)
            continue
        with pytest.raises(ModelNotFoundError):
            Store(root).get("tiny")
        assert set(store_state(root).blobs) <= set(manifest.blobs)
        assert_consistent(root)
        pull(Store(root), "tiny", settings)  # resumes, and completes the model
        assert assert_consistent(root) == ["tiny:latest"]
        assert not list((root / "partial").glob("*.partial"))
    assert faulted >= len(manifest.blobs) * 3
