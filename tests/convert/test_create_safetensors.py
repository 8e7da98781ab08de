"""Creating a model from a safetensors checkout (a model as the Hub ships it) through every
entry point, on a real daemon: ``localllm create NAME --from ./folder [--quantize]``, a
Modelfile's ``FROM ./folder``, Ollama's ``/api/create`` with the folder's files uploaded as
blobs (the real ``ollama`` client), and a remote daemon's upload path of the CLI. Each model
answers a generate request afterwards (its properties asserted, never its text).

Bad input through each: a specific error (400 for the API), nothing half-written in the store,
the daemon still up.
"""

from __future__ import annotations

import concurrent.futures
import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest
from hf_checkpoint import FAMILIES, store_as_int32, write_checkpoint
from store_support import assert_consistent, temporaries
from test_cli_support import CliHome, cli_home
from test_daemon_support import running_daemon, start_daemon

from localllm import DiskFullError, OperationCancelledError
from localllm._exceptions import TensorMismatchError
from localllm.cli.common import folder_source
from localllm.settings import Settings
from localllm.store.models import create_model
from localllm.store.safetensors import Checkout
from localllm.store.store import Store

pytest_plugins = ["fakes.fixtures"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight Llama checkout, sharded bf16, as the Hub ships it."""
    return write_checkpoint(tmp_path_factory.mktemp("checkout") / "tiny-llama", "llama").folder


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliHome]:
    with cli_home(tmp_path_factory.mktemp("create-st") / "home") as home:
        home.ok("list")  # the CLI starts the daemon the HTTP requests go to
        yield home


def _run_in(cli: CliHome, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``localllm ARGS`` run from ``cwd`` (so ``./folder`` means what it means to a user)."""
    return subprocess.run(
        [sys.executable, "-m", "localllm", *args],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=cli.env,
        timeout=300,
        check=False,
    )


def _answers(cli: CliHome, name: str) -> None:
    """The model loads and generates: tokens counted, a done reason, a string answer."""
    with cli.client() as client:
        reply = client.generate(name, "Hello", options={"num_predict": 4, "temperature": 0})
    assert reply["done"] is True
    assert isinstance(reply["response"], str)
    assert 1 <= reply["eval_count"] <= 4
    assert reply["prompt_eval_count"] >= 1


def _store_files(cli: CliHome) -> dict[str, set[str]]:
    """What the store holds: blobs, manifests, and anything left in partial/."""
    root = cli.settings.data_dir
    assert (root / "blobs").is_dir()  # the store the daemon writes (the starter is in it)
    found: dict[str, set[str]] = {}
    for part in ("blobs", "manifests", "partial"):
        folder = root / part
        found[part] = (
            {str(p.relative_to(folder)) for p in folder.rglob("*")} if folder.is_dir() else set()
        )
    return found


def test_create_from_a_folder_converts_it(cli: CliHome, checkpoint: Path) -> None:
    result = _run_in(cli, checkpoint.parent, "create", "tiny-st", "--from", f"./{checkpoint.name}")
    assert result.returncode == 0, result.stderr
    assert "created 'tiny-st'" in result.stdout
    assert "converting" in result.stderr  # the progress lines say what happens
    shown = cli.json("show", "tiny-st")
    assert shown["details"]["quantization_level"] == "F16"
    assert shown["details"]["family"] == "llama"
    # the F16 file is the blob, named by the digest the converter computed as it wrote it
    assert "tiny-st:latest" in assert_consistent(cli.settings.data_dir)
    _answers(cli, "tiny-st")


def test_modelfile_from_folder_with_quantize(
    cli: CliHome, checkpoint: Path, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    shutil.copytree(checkpoint, project / "weights")
    (project / "Modelfile").write_text("FROM ./weights\nPARAMETER temperature 0.5\n")
    out = cli.ok("create", "tiny-st:q8", "-f", str(project / "Modelfile"), "--quantize", "q8_0")
    assert "created 'tiny-st:q8'" in out
    shown = cli.json("show", "tiny-st:q8")
    assert shown["details"]["quantization_level"] == "Q8_0"
    assert "temperature" in shown["parameters"]
    _answers(cli, "tiny-st:q8")


def test_api_progress_says_converting_then_quantizing(cli: CliHome, checkpoint: Path) -> None:
    with cli.client() as client:
        lines = list(client.create("tiny-st:q4", from_=str(checkpoint), quantize="q4_K_M"))
    statuses = [line.get("status", "") for line in lines]
    converting = [line for line in lines if str(line.get("status", "")).startswith("converting")]
    assert converting, statuses
    assert all(line["total"] > 0 for line in converting)
    assert converting[-1]["completed"] == converting[-1]["total"]
    # converted to the checkpoint's own BF16 (copied), then quantized from it
    quantizing = [s for s in statuses if s.startswith("quantizing BF16 model to Q4_K_M")]
    assert quantizing and statuses.index(quantizing[0]) > statuses.index(converting[0]["status"])
    assert statuses[-1] == "success"
    assert not _store_files(cli)["partial"]  # the F16 file and the links are gone


def test_ollama_client_creates_from_uploaded_files(cli: CliHome, checkpoint: Path) -> None:
    client = ollama.Client(host=cli.settings.base_url)
    files = {}
    for path in sorted(checkpoint.iterdir()):
        files[path.name] = client.create_blob(path)
    statuses = [
        part.status for part in client.create(model="uploaded-st", files=files, stream=True)
    ]
    assert any(str(s).startswith("converting") for s in statuses)
    assert statuses[-1] == "success"
    reply = client.generate(model="uploaded-st", prompt="Hi", options={"num_predict": 3})
    assert reply.done and isinstance(reply.response, str) and reply.eval_count >= 1


def test_cli_uploads_a_folder_to_a_remote_daemon(cli: CliHome, checkpoint: Path) -> None:
    """The CLI's path for a daemon on another machine: the folder checked here, then its
    files uploaded (the same ones Ollama's CLI sends); the daemon converts the blobs."""
    remote = Settings.from_env({**cli.env, "LOCALLLM_HOST": "192.0.2.1:11435"})
    with cli.client() as client:
        fields = folder_source(client, remote, checkpoint)
        assert "from_" not in fields
        assert set(fields["files"]) == {p.name for p in checkpoint.iterdir()}
        lines = list(client.create("remote-st", **fields))
    assert lines[-1]["status"] == "success"
    assert cli.json("show", "remote-st")["details"]["quantization_level"] == "F16"


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_is_created_and_answers(cli: CliHome, family: str, tmp_path: Path) -> None:
    folder = write_checkpoint(tmp_path / family, family).folder
    with cli.client() as client:
        lines = list(client.create(f"family-{family}", from_=str(folder), quantize="q8_0"))
    assert lines[-1]["status"] == "success"
    shown = cli.json("show", f"family-{family}")
    assert shown["details"]["quantization_level"] == "Q8_0"
    _answers(cli, f"family-{family}")
    cli.ok("rm", f"family-{family}")


# -- bad input ------------------------------------------------------------------------------


def _edit_config(folder: Path, **changes: Any) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def _shards(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


def _truncate(folder: Path) -> None:
    shard = _shards(folder)[-1]
    shard.write_bytes(shard.read_bytes()[:-100])


def _pickles(folder: Path) -> None:
    for shard in _shards(folder):
        shard.unlink()
    (folder / "model.safetensors.index.json").unlink(missing_ok=True)
    (folder / "pytorch_model.bin").write_bytes(b"PK\x03\x04 not unpickled")


# Each known from the shards' headers and config.json alone (no weights read): a 400 before
# any reply, on every entry point.
TENSOR_CASES: list[tuple[str, Callable[[Path], None], str]] = [
    ("shape", lambda f: _edit_config(f, hidden_size=48), "has shape"),
    ("dtype", lambda f: store_as_int32(f, "model.norm.weight"), "stored as I32"),
    ("missing-layer", lambda f: _edit_config(f, num_hidden_layers=3), "lacks model.layers.2"),
]

BAD_FOLDERS: list[tuple[str, Callable[[Path], None], str]] = [
    ("no-config", lambda f: (f / "config.json").unlink(), "config.json"),
    (
        "unsupported",
        lambda f: _edit_config(f, architectures=["FancyNewForCausalLM"]),
        "FancyNewForCausalLM",
    ),
    (
        "no-tokenizer",
        lambda f: [p.unlink() for p in f.glob("tokenizer*")],
        "tokenizer",
    ),
    ("missing-shard", lambda f: _shards(f)[-1].unlink(), "shard"),
    ("truncated", _truncate, "shorter"),
    *TENSOR_CASES,
    ("pickles", _pickles, "pytorch_model.bin"),
]


def _nothing_started(error: str) -> None:
    """The CLI's output holds its one error and no progress of a create that began."""
    assert "gathering model components" not in error, error
    assert "converting" not in error, error


@pytest.mark.parametrize(("case", "damage", "said"), BAD_FOLDERS, ids=[c[0] for c in BAD_FOLDERS])
def test_bad_folders_are_refused_through_the_api_and_the_cli(
    cli: CliHome,
    checkpoint: Path,
    tmp_path: Path,
    case: str,
    damage: Callable[[Path], None],
    said: str,
) -> None:
    folder = tmp_path / case
    shutil.copytree(checkpoint, folder)
    damage(folder)
    before = _store_files(cli)
    with httpx.Client(base_url=cli.settings.base_url, timeout=120) as http:
        body = {"model": f"bad-{case}", "from": str(folder)}
        response = http.post("/api/create", json={**body, "stream": False})
        assert response.status_code == 400, response.text
        assert said.lower() in response.json()["error"].lower()
        # Streamed (the default): the same 400, before the stream starts.
        streamed = http.post("/api/create", json=body)
        assert streamed.status_code == 400, streamed.text
        assert said.lower() in streamed.json()["error"].lower()
        assert http.get("/api/tags").status_code == 200  # the daemon is up
    error = cli.fails("create", f"bad-{case}", "--from", str(folder))
    assert said.lower() in error.lower()
    _nothing_started(error)
    errors = [line for line in error.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and error.strip().splitlines()[-1] == errors[0]
    assert _store_files(cli) == before  # nothing half-written


@pytest.mark.parametrize(("case", "damage", "said"), TENSOR_CASES, ids=[c[0] for c in TENSOR_CASES])
def test_a_tensor_disagreeing_with_the_config_is_refused_before_any_reply(
    cli: CliHome,
    checkpoint: Path,
    tmp_path: Path,
    case: str,
    damage: Callable[[Path], None],
    said: str,
) -> None:
    """A Modelfile's ``FROM ./folder``, the folder's files uploaded to ``/api/create`` (the
    real ollama client, streamed and not), and the CLI's upload path for a remote daemon:
    each refuses the checkout from its headers, before a create starts or a byte is sent."""
    project = tmp_path / "project"
    damage(shutil.copytree(checkpoint, project / "weights"))
    folder = project / "weights"
    (project / "Modelfile").write_text("FROM ./weights\n")
    before = _store_files(cli)
    error = cli.fails("create", f"bad-{case}", "-f", str(project / "Modelfile"))
    assert said in error
    _nothing_started(error)

    client = ollama.Client(host=cli.settings.base_url)
    files = {path.name: client.create_blob(path) for path in sorted(folder.iterdir())}
    uploaded = _store_files(cli)["blobs"]
    for stream in (True, False):
        with pytest.raises(ollama.ResponseError) as refused:
            if stream:
                list(client.create(model=f"bad-{case}", files=files, stream=True))
            else:
                client.create(model=f"bad-{case}", files=files, stream=False)
        assert refused.value.status_code == 400, (stream, refused.value)
        assert said in refused.value.error

    remote = Settings.from_env({**cli.env, "LOCALLLM_HOST": "192.0.2.1:11435"})
    with cli.client() as local, pytest.raises(TensorMismatchError, match=said):
        folder_source(local, remote, folder)  # refused here: nothing uploaded
    after = _store_files(cli)
    assert after["blobs"] == uploaded and not after["partial"]
    assert after["manifests"] == before["manifests"]
    with httpx.Client(base_url=cli.settings.base_url, timeout=30) as http:
        assert http.get("/api/tags").status_code == 200  # the daemon is up


def test_bad_uploads_are_refused(cli: CliHome, checkpoint: Path, tmp_path: Path) -> None:
    pickle = tmp_path / "pytorch_model.bin"
    pickle.write_bytes(b"PK\x03\x04 never unpickled")
    before = _store_files(cli)
    with cli.client() as client:
        config = client.upload_blob(checkpoint / "config.json")
        pickled = client.upload_blob(pickle)
    with httpx.Client(base_url=cli.settings.base_url, timeout=60) as http:
        cases = [
            ({"../config.json": config}, "not a plain relative path"),
            ({"/etc/config.json": config}, "not a plain relative path"),
            ({"config.json": "sha256:" + "0" * 64}, "not found; upload it first"),
            ({"config.json": config}, "safetensors"),  # a config and no weights
            ({"config.json": config, "pytorch_model.bin": pickled}, "pytorch_model.bin"),
        ]
        for files, said in cases:
            response = http.post("/api/create", json={"model": "bad-upload", "files": files})
            assert response.status_code == 400, (files, response.text)
            assert said in response.json()["error"], (files, response.text)
    after = _store_files(cli)
    assert after["manifests"] == before["manifests"] and not after["partial"]
    assert after["blobs"] - before["blobs"] <= {  # only the two uploads
        config.replace(":", "-"),
        pickled.replace(":", "-"),
    }


def test_a_path_that_is_neither_file_nor_folder(cli: CliHome, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    error = cli.fails("create", "x", "--from", str(missing))
    assert f"{missing}: no such file or folder" in error
    with httpx.Client(base_url=cli.settings.base_url, timeout=60) as http:
        response = http.post("/api/create", json={"model": "x", "from": str(missing)})
    assert response.status_code == 400
    assert "no such file or folder" in response.json()["error"]


# -- a kill in the middle -------------------------------------------------------------------


@pytest.mark.parametrize("step", ["convert-written", "quantize-started"])
def test_a_kill_mid_conversion_leaves_the_old_state(
    checkpoint: Path, tmp_path: Path, step: str
) -> None:
    """SIGKILLed with the F16 file complete in partial/ (or llama.cpp quantizing it): after a
    restart the name is absent, the work folder is gone, the store is consistent."""
    home = tmp_path / "home"
    body = {"model": "killed:q8", "from": str(checkpoint), "quantize": "q8_0"}
    daemon = start_daemon(home, num_threads=1, test_pause=step)
    marker = home / "test-pause"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        try:
            request = pool.submit(_post_lines, daemon.url, body)
            deadline = time.monotonic() + 120
            while not marker.exists():  # polled: the daemon writes it when it gets there
                assert not request.done(), request.result()
                assert time.monotonic() < deadline, "the daemon never reached the step"
                time.sleep(0.02)
            assert any(p.is_dir() for p in temporaries(home))  # the work folder exists now
        finally:
            daemon.kill()
        concurrent.futures.wait([request], timeout=60)
    marker.unlink()
    with running_daemon(home, num_threads=1) as again, again.http() as http:
        assert http.get("/api/version").status_code == 200
        assert temporaries(home) == []  # the start-up check removed the work folder
        names = {m["name"] for m in http.get("/api/tags").json()["models"]}
        assert "killed:q8" not in names
        assert_consistent(home)


def _post_lines(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with (
        httpx.Client(base_url=url, timeout=120) as http,
        http.stream("POST", "/api/create", json=body) as response,
    ):
        return [json.loads(line) for line in response.iter_lines() if line.strip()]


def test_a_disk_too_small_for_the_conversion_is_said_before_it_starts(
    checkpoint: Path, small_disk: Callable[[int], Path]
) -> None:
    store = Store(small_disk(128 * 1024) / "models")
    with pytest.raises(DiskFullError, match="not enough disk space to convert"):
        create_model(store, "big", checkout=Checkout(folder=checkpoint))
    assert not store.exists("big")
    assert not store.partial_dir.is_dir() or not list(store.partial_dir.iterdir())


def test_a_cancelled_conversion_stops_and_leaves_nothing(checkpoint: Path, tmp_path: Path) -> None:
    """A client that goes away sets the create's cancel event: the converter child is killed
    at its next progress line, the work folder goes, no blob and no name are written."""
    store = Store(tmp_path / "models")
    cancel = threading.Event()
    seen: list[str] = []

    def on_progress(event: Any) -> None:
        seen.append(event.status)
        cancel.set()  # as the daemon does when the client disconnects

    checkout = Checkout(folder=checkpoint, on_progress=on_progress, cancel=cancel)
    with pytest.raises(OperationCancelledError):
        create_model(store, "cancelled", checkout=checkout)
    assert seen and seen[0].startswith("converting")
    assert not store.exists("cancelled")
    assert not list(store.iter_blobs())
    assert not list(store.partial_dir.iterdir())
