"""The store's check at start-up and in ``localllm doctor``; ``localllm prune``; a data root
that is damaged, read-only, full or missing.

A model whose blob is missing, of the wrong size or (found by ``doctor``) corrupted is reported
by name with the fix, left out of the list and never served: asking for it is an error naming
the fix, and ``rm`` removes it. Temporary files of killed writes go at start; blobs no model
uses are reported, and ``prune`` removes them and says how much it freed. A read-only or full
data root is one line naming its path, and the daemon serves what it holds.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from store_support import assert_consistent, fill_disk, temporaries
from test_cli_support import cli_home
from test_daemon_support import Daemon, running_daemon

from localllm.client import Client
from localllm.settings import Settings
from localllm.starter import ensure_starter
from localllm.store.manifest import MEDIA_MODEL, MEDIA_SYSTEM
from localllm.store.models import create_model
from localllm.store.names import parse_name
from localllm.store.store import Store

pytest_plugins = ["fakes.fixtures"]
pytestmark = pytest.mark.slow

MiB = 1 << 20
SMOL = "smollm2:135m"


@pytest.fixture(scope="module")
def starter_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data root with the starter imported."""
    root = tmp_path_factory.mktemp("starter") / "home"
    ensure_starter(Store(root))
    return root


def _seed(starter_store: Path, home: Path) -> Store:
    """``home`` holding the starter (blobs hard-linked: they are never written in place)."""
    shutil.copytree(starter_store, home, copy_function=os.link, dirs_exist_ok=True)
    return Store(home)


def _names(http: httpx.Client) -> list[str]:
    return sorted(m["name"] for m in http.get("/api/tags").json()["models"])


def _stderr(daemon: Daemon) -> str:
    """What the (stopped) daemon printed after its announcement."""
    assert daemon.process.stderr is not None
    return daemon.process.stderr.read()


def _layer(store: Store, name: str, media_type: str) -> Path:
    manifest = store.get(name).manifest
    return store.blob_path(next(x for x in manifest.layers if x.media_type == media_type).digest)


def test_damaged_models_are_reported_never_served_and_removable(
    home: Path, starter_store: Path, tiny_gguf: Path
) -> None:
    store = _seed(starter_store, home)
    create_model(store, "whole", gguf_file=tiny_gguf, system="Whole.")
    create_model(store, "lost", gguf_file=tiny_gguf, system="Lost.")
    create_model(store, "short", gguf_file=tiny_gguf, system="Short.")
    _layer(store, "lost", MEDIA_SYSTEM).unlink()
    _layer(store, "short", MEDIA_SYSTEM).write_bytes(b"Sh")
    bad = store.manifest_path(parse_name("garbled"))
    bad.parent.mkdir(parents=True)
    bad.write_text("{not json")
    orphan = store.write_blob_bytes(b"nobody uses me", MEDIA_SYSTEM)
    leftover = store.partial_dir / "tmp-999999-0123456789abcdef"  # a killed write's
    leftover.write_bytes(b"half")

    with running_daemon(home, num_threads=1) as daemon, daemon.http() as http:
        assert _names(http) == [SMOL, "whole:latest"]  # answered once the check was done
        assert not leftover.exists()
        generate = {"prompt": "a", "raw": True, "stream": False, "options": {"num_predict": 2}}
        for name, problem in (
            ("lost:latest", "its system blob .{12} is missing"),
            ("short:latest", "its system blob .{12} is 2 B, the manifest says 6 B"),
        ):
            for path, body in (("/api/generate", generate), ("/api/show", {})):
                answer = http.post(path, json=body | {"model": name})
                assert answer.status_code == 500, answer.text
                message = answer.json()["error"]
                assert message.startswith(f"model {name} is damaged: "), message
                assert message.endswith(
                    f"remove it with `localllm rm {name}` and pull or create it again"
                )
                assert re.search(problem, message), message
        answer = http.post("/api/copy", json={"source": "lost", "destination": "again"})
        assert answer.status_code == 500
        assert http.post("/api/generate", json=generate | {"model": "whole"}).status_code == 200
        for name in ("lost", "short", "garbled"):
            removed = http.request("DELETE", "/api/delete", json={"model": name})
            assert removed.status_code == 200, removed.text
        pruned = http.post("/api/prune").json()
        assert pruned["blobs"] == [{"digest": orphan.digest, "size": 14}]
        assert pruned["summary"] == "removed 1 unused blob(s) and 0 other file(s), freed 14 B"
    printed = _stderr(daemon)
    for name in ("lost:latest", "short:latest", "garbled:latest"):
        assert f"localllm: model {name} is not served: " in printed, printed
    log = daemon.log()
    assert "removed 1 temporary file(s) of interrupted writes (4 B)" in log
    assert "1 blob(s) no model uses (14 B); `localllm prune` removes them" in log
    assert assert_consistent(home) == [SMOL, "whole:latest"]


def test_doctor_rehashes_sets_corrupted_bytes_aside_and_prune_frees_them(
    tmp_path: Path, starter_store: Path, tiny_gguf: Path
) -> None:
    home = tmp_path / "home"
    store = _seed(starter_store, home)
    create_model(store, "rotten", gguf_file=tiny_gguf)
    weights = _layer(store, "rotten", MEDIA_MODEL)
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # the same size: only a re-hash can tell
    weights.write_bytes(bytes(data))
    with cli_home(home, XDG_CACHE_HOME=str(tmp_path / "cache")) as cli:
        assert "rotten:latest" in cli.ok("list")  # sizes agree: served until checked
        report = cli.json("doctor", "--cached-speed")["store"]
        assert report["verified"] == len(list(store.iter_blobs())) + 1
        [damaged] = report["damaged"]
        assert damaged["name"] == "rotten:latest"
        assert damaged["problem"].endswith(
            "does not match its sha256 digest (set aside by `localllm doctor`)"
        )
        assert [c["file"] for c in report["corrupt"]] == [f"corrupt-{weights.name}"]
        text = cli.ok("doctor", "--no-verify", "--cached-speed")
        assert f"model store {home}: 1 model(s), needs attention" in text
        assert "model rotten:latest is not served: its model blob" in text
        error = cli.fails("run", "rotten", "hi")
        assert "model rotten:latest is damaged: its model blob" in error
        cli.ok("rm", "rotten")
        freed = cli.ok("prune")
        size = len(data)
        assert freed.strip() == (
            f"removed 0 unused blob(s) and 1 other file(s), freed {_human(size)}"
        )
        assert cli.ok("prune").strip() == "nothing to prune: every blob belongs to a model"
    assert assert_consistent(home) == [SMOL]


def _human(size: int) -> str:
    from localllm._format import human_size

    return human_size(size)


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True)


@pytest.fixture
def read_only_root(small_disk: Callable[[int], Path], starter_store: Path) -> Path:
    """A data root holding the starter on a read-only file system."""
    home = small_disk(200 * MiB)
    shutil.copytree(starter_store, home, dirs_exist_ok=True)  # another file system: copies
    _mount("-o", "remount,ro", str(home))
    return home


def test_a_read_only_data_root_is_one_line_and_its_models_are_served(
    read_only_root: Path, tiny_gguf: Path
) -> None:
    home = read_only_root
    with running_daemon(home, num_threads=1) as daemon, daemon.http() as http:
        # The socket and the logs, which cannot live in the root, went to a private folder
        # that clients find the same way.
        assert not daemon.settings.socket_path.is_relative_to(home)
        assert not daemon.settings.log_dir.is_relative_to(home)
        assert (daemon.settings.log_dir / "daemon.log").is_file()
        assert _names(http) == [SMOL]
        found = Settings.from_env({"LOCALLLM_HOME": str(home)})
        with Client(found, use_tcp=False) as client:
            assert [m["name"] for m in client.list_models()] == [SMOL]
        answer = http.post(
            "/api/generate",
            json={"model": SMOL, "prompt": "Hi", "stream": False, "options": {"num_predict": 2}},
        )
        assert answer.status_code == 200, answer.text
        created = http.post(
            "/api/create", json={"model": "new", "from": str(tiny_gguf), "stream": False}
        )
        assert created.status_code == 507, created.text
        assert created.json()["error"] == (
            f"cannot write to the model store at {home}: Read-only file system"
        )
        removed = http.request("DELETE", "/api/delete", json={"model": SMOL})
        assert removed.status_code == 507
    assert _stderr(daemon).splitlines() == [
        f"localllm: the model store {home} is read-only: its models are served, but "
        "creating, pulling, copying and removing models fail"
    ]


def test_a_full_disk_at_start_is_one_line_and_the_daemon_serves(
    small_disk: Callable[[int], Path], starter_store: Path
) -> None:
    home = small_disk(100 * MiB)
    shutil.copytree(starter_store, home, dirs_exist_ok=True)
    fill_disk(home)
    with running_daemon(home, num_threads=1) as daemon, daemon.http() as http:
        answer = http.post(
            "/api/generate",
            json={"model": SMOL, "prompt": "Hi", "stream": False, "options": {"num_predict": 2}},
        )
        assert answer.status_code == 200, answer.text
    [line] = [x for x in _stderr(daemon).splitlines() if "full" in x]
    assert line == (
        f"localllm: the disk holding the model store {home} is full (0 B free): creating and "
        "pulling models will fail until space is freed"
    )
    assert temporaries(home) == []


def test_a_data_root_that_cannot_be_created_is_one_line_and_the_daemon_serves(
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    home = blocker / "home"
    with running_daemon(home, num_threads=1) as daemon, daemon.http() as http:
        assert _names(http) == []
        missing = http.post("/api/generate", json={"model": SMOL, "prompt": "Hi"})
        assert missing.status_code == 404
    assert _stderr(daemon).splitlines() == [
        f"localllm: the model store {home} cannot be created (Not a directory): no model can "
        "be served"
    ]
