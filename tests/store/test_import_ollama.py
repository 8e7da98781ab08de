"""``localllm import ollama``: an Ollama store written by the test (manifests in Ollama's exact
format, blobs named ``sha256-<hex>``, a real tiny GGUF as the model layer) is imported without
downloading: verified, hard-linked when on the same file system, idempotent, and a corrupted
blob or a missing one skips that model only. Then the CLI lists, shows and runs the imported
model through a daemon, and the TUI's models screen offers the import."""

from __future__ import annotations

import errno
import hashlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lora_support import write_lora_gguf
from test_cli_support import CliHome, cli_home
from test_tui_support import notices, wait_for

from localllm._exceptions import OperationCancelledError
from localllm.settings import Settings
from localllm.sources.progress import PullProgress
from localllm.store import ollama_import
from localllm.store.manifest import (
    MEDIA_ADAPTER,
    MEDIA_CONFIG,
    MEDIA_LICENSE,
    MEDIA_MANIFEST,
    MEDIA_MESSAGES,
    MEDIA_MODEL,
    MEDIA_PARAMS,
    MEDIA_SYSTEM,
    MEDIA_TEMPLATE,
)
from localllm.store.models import load_model
from localllm.store.ollama_import import (
    LinkMethod,
    OllamaImporter,
    find_ollama_store,
    missing_models,
)
from localllm.store.store import Store

# What Ollama ships for llama3.2 (a Go template, which localllm keeps for show but never renders).
GO_TEMPLATE = (
    "<|start_header_id|>system<|end_header_id|>\n\n{{ if .System }}{{ .System }}{{ end }}"
    "<|eot_id|>{{ range .Messages }}<|start_header_id|>{{ .Role }}<|end_header_id|>\n\n"
    "{{ .Content }}<|eot_id|>{{ end }}<|start_header_id|>assistant<|end_header_id|>\n\n"
)
SYSTEM = "You are a tiny test model."
PARAMS = {"stop": ["<|im_end|>"], "temperature": 0.0, "num_predict": 6}
MESSAGES = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi"}]
GOOD = "tiny:1b"
HF = "hf.co/someone/tiny-GGUF:Q8_0"
CORRUPT = "broken:latest"
PARTIAL = "partial:latest"


# -- writing an Ollama store ------------------------------------------------------------------


class OllamaStore:
    """An Ollama models folder: ``blobs/sha256-<hex>`` and ``manifests/<host>/<ns>/<m>/<tag>``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "blobs").mkdir(parents=True, exist_ok=True)
        (root / "manifests").mkdir(exist_ok=True)

    def blob(self, data: bytes, media_type: str, *, write: bool = True) -> dict[str, Any]:
        """Store ``data`` as Ollama does; its layer as a manifest names it."""
        digest = hashlib.sha256(data).hexdigest()
        if write:
            (self.root / "blobs" / f"sha256-{digest}").write_bytes(data)
        return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}

    def blob_path(self, layer: dict[str, Any]) -> Path:
        """Where Ollama keeps ``layer``'s blob."""
        return self.root / "blobs" / layer["digest"].replace(":", "-")

    def model(self, name: str, layers: list[dict[str, Any]]) -> Path:
        """Write a manifest (config blob included) for ``name`` (``[host/][ns/]model:tag``)."""
        body, _, tag = name.rpartition(":")
        parts = body.split("/")
        parts = ["registry.ollama.ai", "library"][: 3 - len(parts)] + parts
        config = {
            "model_format": "gguf",
            "model_family": "llama",
            "model_families": ["llama"],
            "model_type": "1.2M",
            "file_type": "F32",
            "architecture": "amd64",
            "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": [layer["digest"] for layer in layers]},
        }
        manifest = {
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": self.blob(json.dumps(config).encode(), MEDIA_CONFIG),
            "layers": layers,
        }
        path = self.root.joinpath("manifests", *parts, tag)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Ollama writes its manifests as compact JSON in this key order.
        path.write_text(json.dumps(manifest, separators=(",", ":")))
        return path


def write_ollama_store(root: Path, gguf: Path) -> OllamaStore:
    """The test's Ollama store: two good models sharing a GGUF (one on hf.co, one with every
    text layer), one whose GGUF blob is corrupted and one whose GGUF blob is missing."""
    store = OllamaStore(root)
    data = gguf.read_bytes()
    model = store.blob(data, MEDIA_MODEL)
    text_layers = [
        store.blob(GO_TEMPLATE.encode(), MEDIA_TEMPLATE),
        store.blob(SYSTEM.encode(), MEDIA_SYSTEM),
        store.blob(json.dumps(PARAMS).encode(), MEDIA_PARAMS),
        store.blob(b"MIT License\n\nPermission is hereby granted...", MEDIA_LICENSE),
        store.blob(json.dumps(MESSAGES).encode(), MEDIA_MESSAGES),
    ]
    store.model(GOOD, [model, *text_layers])
    store.model(HF, [model, store.blob(b'{"num_predict":4}', MEDIA_PARAMS)])

    other = data[:-16] + bytes(16)  # another "model" whose blob then rots
    corrupt = store.blob(other, MEDIA_MODEL)
    rotten = bytearray(other)
    rotten[len(rotten) // 2] ^= 0xFF
    store.blob_path(corrupt).write_bytes(bytes(rotten))
    store.model(CORRUPT, [corrupt, text_layers[1]])

    absent = store.blob(data + b"\0", MEDIA_MODEL, write=False)
    store.model(PARTIAL, [absent, text_layers[2]])
    return store


@pytest.fixture
def ollama(tmp_path: Path, tiny_gguf: Path) -> OllamaStore:
    """A fresh Ollama store on the same file system as the test's localllm store."""
    return write_ollama_store(tmp_path / "ollama" / "models", tiny_gguf)


@pytest.fixture
def local(tmp_path: Path) -> Store:
    """An empty localllm store."""
    return Store(tmp_path / "localllm")


# -- the import itself, in-process --------------------------------------------------------------


def test_imports_good_models_links_them_and_skips_broken_ones(
    ollama: OllamaStore, local: Store
) -> None:
    events: list[PullProgress] = []
    report = OllamaImporter(ollama.root, local, progress=events.append).run()

    outcomes = {o.label: o for o in report.outcomes}
    assert set(outcomes) == {GOOD, HF, CORRUPT, PARTIAL}
    assert outcomes[GOOD].status == "imported"
    assert outcomes[GOOD].methods == (LinkMethod.LINKED,)
    assert outcomes[GOOD].describe().startswith("imported (linked, ")
    # The second model shares the GGUF: only its params and config blobs were new.
    assert outcomes[HF].status == "imported"
    assert outcomes[CORRUPT].status == "skipped"
    assert "corrupted" in outcomes[CORRUPT].reason
    assert outcomes[PARTIAL].status == "skipped"
    assert "missing from the Ollama store" in outcomes[PARTIAL].reason
    assert report.new_bytes == 0  # everything hard-linked
    assert "imported 2, 2 skipped" in report.summary()
    assert "0 B of new disk used" in report.summary()

    assert sorted(str(e.name) for e in local.list()) == sorted([GOOD, HF])
    model = load_model(local, GOOD)
    assert model.parameters == PARAMS
    assert model.system == SYSTEM
    assert model.messages == MESSAGES
    assert model.license is not None and model.license.startswith("MIT License")
    assert model.template == GO_TEMPLATE  # kept for show; the daemon renders the GGUF's own
    assert model.info.architecture == "llama"
    # A hard link: the very inode Ollama has, so no new disk.
    ours = local.blob_path(model.model_layer.digest)
    theirs = ollama.root / "blobs" / model.model_layer.digest.replace(":", "-")
    assert ours.stat().st_ino == theirs.stat().st_ino
    assert load_model(local, HF).parameters == {"num_predict": 4}

    # Every blob was verified with progress, ending complete; nothing is left in partial/.
    verified = {e.digest for e in events if e.status.startswith("verifying")}
    assert model.model_layer.digest in verified
    last = [e for e in events if e.digest == model.model_layer.digest][-1]
    assert last.completed == last.total == model.model_layer.size
    assert not list(local.partial_dir.glob("tmp-*"))
    assert all(r.ok for r in local.verify())
    # A skipped model publishes none of its blobs (all are verified before any is published).
    assert set(local.iter_blobs()) == local.referenced_digests()


# Openings of templates Ollama ships (Go templates), each as a whole template layer.
OLLAMA_TEMPLATES = [
    GO_TEMPLATE,
    "{{- if .Messages }}{{- if or .System .Tools }}<|im_start|>system\n{{- if .System }}"
    "\n{{ .System }}{{- end }}{{- end }}{{- range $i, $_ := .Messages }}"
    "<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}{{ end }}",
    "{{- range $i, $_ := .Messages }}{{- $last := eq (len (slice $.Messages $i)) 1 }}"
    "<start_of_turn>user\n{{ .Content }}<end_of_turn>\n{{ end }}",
    "{{ if .System }}<|system|>\n{{ .System }}<|end|>\n{{ end }}<|user|>\n{{ .Prompt }}",
]


@pytest.mark.parametrize("template", OLLAMA_TEMPLATES)
def test_go_template_layers_are_shown_but_the_gguf_template_renders(
    ollama: OllamaStore, local: Store, tiny_gguf: Path, template: str
) -> None:
    from localllm.daemon.prompt.chat import chat_template
    from localllm.daemon.prompt.template import model_template

    layers = [
        ollama.blob(tiny_gguf.read_bytes(), MEDIA_MODEL),
        ollama.blob(template.encode(), MEDIA_TEMPLATE),
    ]
    ollama.model("gotmpl:latest", layers)
    OllamaImporter(ollama.root, local).run(["gotmpl"])
    model = load_model(local, "gotmpl")
    assert model.template == template  # what show prints
    assert model_template(model) is None  # never sent to the runner, which renders Jinja only
    assert chat_template(model).effective == model.info.chat_template


def test_rerun_is_idempotent_and_reads_nothing_again(ollama: OllamaStore, local: Store) -> None:
    OllamaImporter(ollama.root, local).run()
    blobs = sorted(local.iter_blobs())
    stamps = {e.name.short: e.modified for e in local.list()}

    events: list[PullProgress] = []
    again = OllamaImporter(ollama.root, local, progress=events.append).run()
    outcomes = {o.label: o for o in again.outcomes}
    assert outcomes[GOOD].status == outcomes[HF].status == "present"
    assert outcomes[GOOD].describe() == "already imported"
    assert {outcomes[CORRUPT].status, outcomes[PARTIAL].status} == {"skipped"}
    assert "imported 0, 2 already present, 2 skipped" in again.summary()
    assert sorted(local.iter_blobs()) == blobs
    assert {e.name.short: e.modified for e in local.list()} == stamps
    # Nothing of an already-imported model is hashed again.
    assert not [e for e in events if e.status.startswith("importing tiny")]


def test_a_lost_blob_is_brought_back(ollama: OllamaStore, local: Store) -> None:
    OllamaImporter(ollama.root, local).run([GOOD])
    lost = load_model(local, GOOD).model_layer.digest
    local.blob_path(lost).unlink()
    [outcome] = OllamaImporter(ollama.root, local).run([GOOD]).outcomes
    assert outcome.status == "imported" and outcome.methods == (LinkMethod.LINKED,)
    assert local.has_blob(lost)


def test_only_named_models_and_unknown_names(ollama: OllamaStore, local: Store) -> None:
    report = OllamaImporter(ollama.root, local).run([GOOD])
    assert [(o.label, o.status) for o in report.outcomes] == [(GOOD, "imported")]
    assert not report.skipped
    with pytest.raises(ollama_import.LocalLLMError, match="has no nothere:latest"):
        OllamaImporter(ollama.root, local).run(["nothere"])


def test_copies_when_a_hard_link_is_impossible(
    ollama: OllamaStore, local: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    def cross_device(source: Any, target: Any) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(ollama_import.os, "link", cross_device)
    report = OllamaImporter(ollama.root, local).run([GOOD])
    [outcome] = report.outcomes
    # ext4 and tmpfs cannot clone either: a copy. On btrfs/XFS the clone would be used.
    assert outcome.status == "imported"
    assert outcome.methods in ((LinkMethod.COPIED,), (LinkMethod.REFLINKED,))
    model = load_model(local, GOOD)
    ours = local.blob_path(model.model_layer.digest)
    theirs = ollama.root / "blobs" / model.model_layer.digest.replace(":", "-")
    assert ours.stat().st_ino != theirs.stat().st_ino
    assert ours.read_bytes() == theirs.read_bytes()
    assert ours.stat().st_mode & 0o777 == 0o644
    if outcome.methods == (LinkMethod.COPIED,):
        assert report.new_bytes == model.entry.manifest.size
        assert f"({'copied'}, " in outcome.describe()


def test_a_different_model_under_the_same_name_is_left_alone(
    ollama: OllamaStore, local: Store, tiny_gguf: Path
) -> None:
    from localllm.store.models import create_model

    mine = create_model(local, GOOD, gguf_file=tiny_gguf, system="mine")
    report = OllamaImporter(ollama.root, local).run([GOOD])
    [outcome] = report.outcomes
    assert outcome.status == "skipped" and "already has a different tiny:1b" in outcome.reason
    assert local.get(GOOD).digest == mine.digest


def test_cancel_leaves_no_partial_blob(ollama: OllamaStore, local: Store) -> None:
    cancel = threading.Event()

    def progress(event: PullProgress) -> None:
        if event.digest:
            cancel.set()  # as soon as the first blob starts

    with pytest.raises(OperationCancelledError):
        OllamaImporter(ollama.root, local, progress=progress, cancel=cancel).run([GOOD])
    assert not local.exists(GOOD)
    assert not list(local.partial_dir.glob("tmp-*"))


def test_unreadable_manifests_and_other_models_are_skipped_with_a_reason(
    ollama: OllamaStore, local: Store, tiny_gguf: Path, tmp_path: Path
) -> None:
    bad = ollama.root / "manifests" / "registry.ollama.ai" / "library" / "garbage" / "latest"
    bad.parent.mkdir(parents=True)
    bad.write_text("{not json")
    adapter = ollama.blob(b"lora", "application/vnd.ollama.image.adapter")
    ollama.model("adapter:only", [adapter])
    gguf = ollama.blob(tiny_gguf.read_bytes(), MEDIA_MODEL)
    ollama.model("lora:latest", [gguf, adapter])
    # An Ollama model with a LoRA adapter that fits its weights comes over with it.
    lora = write_lora_gguf(tmp_path / "fits.gguf", tiny_gguf)
    ollama.model("lora:fits", [gguf, ollama.blob(lora.read_bytes(), MEDIA_ADAPTER)])
    report = OllamaImporter(ollama.root, local).run()
    reasons = {o.label: o.reason for o in report.skipped}
    assert "unreadable manifest" in reasons["garbage:latest"]
    assert reasons["adapter:only"] == "it has no GGUF model layer"
    assert "not a GGUF file" in reasons["lora:latest"]  # checked as a create checks it
    imported = {o.label for o in report.outcomes if o.status == "imported"}
    assert imported == {GOOD, HF, "lora:fits"}
    assert [a.size for a in load_model(local, "lora:fits").adapters] == [lora.stat().st_size]


def test_finding_the_ollama_store(tmp_path: Path, ollama: OllamaStore, local: Store) -> None:
    settings = Settings.from_env({"OLLAMA_MODELS": str(ollama.root)})
    assert settings.ollama_models == ollama.root
    assert settings.ollama_model_dirs == (ollama.root,)
    assert find_ollama_store(settings) == ollama.root
    assert find_ollama_store(Settings.from_env({"OLLAMA_MODELS": str(tmp_path / "no")})) is None
    defaults = Settings.from_env({}).ollama_model_dirs
    assert defaults[0] == Path.home() / ".ollama" / "models"
    assert defaults[1] == Path("/usr/share/ollama/.ollama/models")
    # What the TUI offers: importable models localllm does not have yet.
    assert {m.label for m in missing_models(ollama.root, local)} == {GOOD, HF, CORRUPT, PARTIAL}
    OllamaImporter(ollama.root, local).run([GOOD])
    assert {m.label for m in missing_models(ollama.root, local)} == {HF, CORRUPT, PARTIAL}


# -- the CLI and the daemon --------------------------------------------------------------------


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliHome]:
    with cli_home(tmp_path_factory.mktemp("import") / "home") as home:
        yield home


@pytest.fixture(scope="module")
def cli_ollama(cli: CliHome, tiny_gguf: Path) -> OllamaStore:
    """An Ollama store beside the CLI's home (the same file system)."""
    return write_ollama_store(cli.home.parent / "ollama-models", tiny_gguf)


def test_cli_import_list_show_rerun_and_run(cli: CliHome, cli_ollama: OllamaStore) -> None:
    root = str(cli_ollama.root)
    result = cli.run("import", "ollama", "--models", root)
    assert result.returncode == 1, result.stderr  # something was skipped
    assert "Traceback" not in result.stderr
    lines = {line.split()[0]: line for line in result.stdout.splitlines() if line.strip()}
    assert "imported (linked, " in lines[GOOD]
    assert "imported (linked, " in lines[HF]
    assert "skipped: blob" in lines[CORRUPT] and "corrupted" in lines[CORRUPT]
    assert "skipped: blob" in lines[PARTIAL] and "missing" in lines[PARTIAL]
    summary = result.stdout.strip().splitlines()[-1]
    assert summary.startswith("imported 2, 2 skipped in ") and "0 B of new disk used" in summary

    listed = {m["name"] for m in cli.json("list")}
    assert {GOOD, HF} <= listed and not {CORRUPT, PARTIAL} & listed
    assert cli.ok("show", GOOD, "--system").strip() == SYSTEM
    parameters = cli.ok("show", GOOD, "--parameters")
    assert "temperature" in parameters and "num_predict" in parameters
    assert '"<|im_end|>"' in parameters
    assert "{{ .System }}" in cli.ok("show", GOOD, "--template")
    assert cli.json("show", GOOD)["messages"] == MESSAGES

    again = cli.run("import", "ollama", "--models", root)
    assert again.returncode == 1
    assert "already imported" in again.stdout and "2 already present" in again.stdout
    only_good = cli.run("import", "ollama", GOOD, "--models", root)
    assert only_good.returncode == 0, only_good.stderr
    assert f"{GOOD}  already imported" in only_good.stdout

    # The daemon renders the GGUF's Jinja template (the Go one is only shown): chat works,
    # bounded by the imported num_predict.
    answer = cli.run("run", GOOD, "hi")
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.strip()


def test_cli_import_without_a_store(cli: CliHome, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    error = cli.fails("import", "ollama", "--models", str(missing))
    assert "is not an Ollama models folder" in error
    env_error = CliHome(cli.home, OLLAMA_MODELS=str(missing)).fails("import", "ollama")
    assert "no Ollama store found" in env_error and str(missing) in env_error


# -- the TUI -----------------------------------------------------------------------------------


@pytest.fixture
def anyio_backend() -> str:
    """Textual runs on asyncio."""
    return "asyncio"


@pytest.mark.anyio
async def test_tui_models_screen_offers_the_import(
    cli: CliHome, tiny_gguf: Path, tmp_path: Path
) -> None:
    from textual.widgets import DataTable

    from localllm.tui.app import LocalLLMApp
    from localllm.tui.screens.dialogs import ConfirmDialog
    from localllm.tui.screens.models import ModelsScreen

    other = OllamaStore(tmp_path / "tui-ollama")
    other.model("tuitiny:latest", [other.blob(tiny_gguf.read_bytes(), MEDIA_MODEL)])
    cli.ok("list")  # the daemon runs
    app = LocalLLMApp(cli.settings.replace(ollama_models=other.root), autostart=False)
    told = notices(app)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.connection == "connected", "connection")
        await pilot.press("f3")
        screen = await wait_for(
            pilot, lambda: isinstance(app.screen, ModelsScreen) and app.screen, "models"
        )
        await wait_for(pilot, lambda: screen.ollama_offer is not None, "the Ollama offer")
        assert [m.label for m in screen.ollama_offer[1]] == ["tuitiny:latest"]
        assert any("press i to import" in message for message in told)
        assert screen.check_action("import_ollama", ()) is True

        await pilot.press("i")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDialog), "confirmation")
        await pilot.press("enter")
        await wait_for(
            pilot,
            lambda: "tuitiny:latest" in [m["name"] for m in screen.models],
            "the imported model in the list",
        )
        panel = await wait_for(
            pilot, lambda: next((p for p in screen.transfers if p.state != "running"), None), "end"
        )
        assert panel.state == "done" and panel.status.startswith("imported 1")
        await wait_for(pilot, lambda: screen.ollama_offer is None, "the offer to go")
        assert screen.check_action("import_ollama", ()) is False
        assert screen.query_one(DataTable).row_count >= 2
