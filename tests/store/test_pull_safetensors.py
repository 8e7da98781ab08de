"""Pulling a Hugging Face repository of safetensors (no GGUF): ``show`` before anything is
downloaded (each quantization's size from the config, its fit and predicted speed), ``pull``
with a tag, without one (the best fit), or through the library; the files downloaded as any
pull's (verified, resumable), converted, quantized, the checkout's blobs gone after. Real
``huggingface_hub`` against the loopback Hub; a real daemon for the CLI."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fakes.helpers import EventLog
from fakes.hf_hub import FakeHub
from hf_checkpoint import FAMILIES, store_as_int32, write_checkpoint
from speed_support import seed_calibration
from test_cli_support import CliHome, cli_home

from localllm import DigestMismatchError, PullError, RemoteNotFoundError
from localllm._exceptions import TensorMismatchError
from localllm.convert import convert_folder
from localllm.gguf_info import inspect_gguf
from localllm.settings import Settings
from localllm.sources import pull
from localllm.sources.checkout import checkout_files
from localllm.sources.checkout_header import checkout_header
from localllm.sources.gguf_files import HubFile
from localllm.store.manifest import MEDIA_MODEL
from localllm.store.models import load_model
from localllm.store.quantize import quantize_file
from localllm.store.store import Store

pytest_plugins = ["fakes.fixtures"]

REPO = "hf.co/tester/tiny-llama"


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("pull-st") / "tiny-llama", "llama").folder


@pytest.fixture(scope="module")
def module_hub(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeHub]:
    with FakeHub() as server:
        server.add_repo("tester/tiny-llama", {**_files(checkpoint), "README.md": b"# tiny\n"})
        pickles = tmp_path_factory.mktemp("pickles")
        shutil.copy(checkpoint / "config.json", pickles / "config.json")
        (pickles / "pytorch_model.bin").write_bytes(b"PK\x03\x04" + b"\0" * 64)
        server.add_repo("tester/pickles", _files(pickles))
        unsupported = dict(_files(checkpoint))
        unsupported["config.json"] = unsupported["config.json"].replace(
            b"LlamaForCausalLM", b"FancyNewForCausalLM"
        )
        server.add_repo("tester/fancy", unsupported)
        misshapen = dict(_files(checkpoint))
        config = json.loads(misshapen["config.json"])
        misshapen["config.json"] = json.dumps({**config, "intermediate_size": 96}).encode()
        server.add_repo("tester/misshapen", misshapen)
        yield server


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory, module_hub: FakeHub) -> Iterator[CliHome]:
    root = tmp_path_factory.mktemp("pull-st-cli")
    cache = root / "cache"
    seed_calibration(cache, threads=1)
    with cli_home(root / "home", HF_ENDPOINT=module_hub.url, XDG_CACHE_HOME=str(cache)) as c:
        c.ok("list")  # the CLI starts the daemon
        yield c


def _shard_requests(hub: FakeHub) -> int:
    return sum(1 for r in hub.cdn.requests if "/repos/" in r.path)


def test_show_before_download_lists_converted_quantizations(
    cli: CliHome, module_hub: FakeHub
) -> None:
    before = _shard_requests(module_hub)
    data = cli.json("show", REPO)
    labels = [q["label"] for q in data["quants"]]
    assert {"Q4_K_M", "Q8_0", "F16"} <= set(labels)
    sizes = {q["label"]: q["size"] for q in data["quants"]}
    assert sizes["Q4_K_M"] <= sizes["Q8_0"] < sizes["F16"]
    for quant in data["quants"]:
        assert quant["converted_from"] == "safetensors"
        assert quant["download_size"] == sum(
            len(v) for k, v in _files_of(module_hub).items() if k in quant["files"]
        )
        assert quant["fit"] == "cpu" and quant["context_length"] == 1024
        assert quant["split"] is False  # one GGUF once converted, whatever the shards
    (q8,) = [q for q in data["quants"] if q["label"] == "Q8_0"]
    assert q8["predicted"]["decode"] > 0 and q8["predicted"]["prefill"] > 0
    assert data["info"]["architecture"] == "LlamaForCausalLM"
    assert data["info"]["parameters"] > 0
    out = cli.ok("show", REPO)
    assert "safetensors, no GGUF" in out and "Q8_0" in out and "CPU only" in out
    one = cli.json("show", f"{REPO}:Q8_0")  # one quantization: planned on its own header
    assert [(q["label"], q["shapes"]) for q in one["quants"]] == [("Q8_0", "header")]
    assert one["quants"][0]["size"] == q8["size"]
    assert _shard_requests(module_hub) == before  # nothing but the config was downloaded


def _files_of(hub: FakeHub) -> dict[str, bytes]:
    return hub.repos["tester/tiny-llama"].files


def test_pull_with_a_tag_converts_and_quantizes(cli: CliHome, module_hub: FakeHub) -> None:
    before = _shard_requests(module_hub)
    result = cli.run("pull", f"{REPO}:Q8_0")
    assert result.returncode == 0, result.stderr
    assert _shard_requests(module_hub) > before  # (what the other tests count is recorded)
    err = result.stderr
    assert "holds safetensors (LlamaForCausalLM) and no GGUF" in err
    # converted to the checkpoint's own BF16 (copied by the kernel), then quantized from it
    assert "converting" in err and "quantizing BF16 model to Q8_0" in err
    assert err.strip().splitlines()[-1] == "success"
    shown = cli.json("show", f"{REPO}:Q8_0")
    assert shown["details"]["quantization_level"] == "Q8_0"
    # the size show gave before the download is the file's, within 10%
    (estimate,) = cli.json("show", f"{REPO}:Q8_0", "--hub")["quants"]
    (listed,) = [m for m in cli.json("list") if m["name"] == f"{REPO}:Q8_0"]
    layers = {
        layer["mediaType"]: layer["size"]
        for layer in json.loads(
            (cli.settings.data_dir / "manifests/hf.co/tester/tiny-llama/Q8_0").read_text()
        )["layers"]
    }
    real = layers["application/vnd.ollama.image.model"]
    assert abs(estimate["size"] - real) <= real * 0.10, (estimate["size"], real, listed)
    with cli.client() as client:
        reply = client.generate(f"{REPO}:Q8_0", "Hello", options={"num_predict": 3})
    assert reply["done"] and 1 <= reply["eval_count"] <= 3


def test_pull_without_a_tag_picks_the_best_fit(cli: CliHome) -> None:
    result = cli.run("pull", REPO)
    assert result.returncode == 0, result.stderr
    first = result.stderr.splitlines()[0]
    assert first.startswith("picked ") and "F16/BF16/F32 left out" in first
    picked = first.split()[1]
    assert cli.json("show", REPO)["details"]["quantization_level"] == picked


def test_pull_quantize_names_the_quantization(cli: CliHome) -> None:
    result = cli.run("pull", f"{REPO}:F16", "--quantize", "q6_K")
    assert result.returncode == 0, result.stderr
    assert "quantizing BF16 model to Q6_K" in result.stderr
    assert cli.json("show", f"{REPO}:F16")["details"]["quantization_level"] == "Q6_K"


def test_library_pull_keeps_f16_and_drops_the_checkout(
    store: Store, hf_settings: Settings, checkpoint: Path, hub: FakeHub
) -> None:
    hub.add_repo("tester/tiny-llama", _files(checkpoint))
    log = EventLog()
    entry = pull(store, f"{REPO}:F16", hf_settings, on_progress=log)
    model = load_model(store, entry.name)
    assert model.info.file_type == "F16"
    # every file of the checkout was a verified blob once; only the model's remain
    assert set(store.iter_blobs()) == set(entry.manifest.digests)
    assert [layer.media_type for layer in entry.manifest.layers].count(MEDIA_MODEL) == 1
    converting = [e for e in log.events if e.status.startswith("converting")]
    assert converting and converting[-1].completed == converting[-1].total
    assert not any(e.status.startswith("quantizing") for e in log.events)
    assert log.statuses[-2:] == ["writing manifest", "success"]
    assert not list(store.partial_dir.iterdir())


def test_pickles_and_unknown_architectures_are_refused_before_downloading(
    cli: CliHome, module_hub: FakeHub
) -> None:
    before = _shard_requests(module_hub)
    with httpx.Client(base_url=cli.settings.base_url, timeout=60) as http:
        for repo in ("pickles", "fancy"):
            answer = http.post("/api/pull", json={"model": f"hf.co/tester/{repo}"})
            assert answer.status_code == 400, answer.text
    error = cli.fails("pull", "hf.co/tester/pickles")
    assert "pytorch_model.bin" in error and "never unpickles" in error
    error = cli.fails("pull", "hf.co/tester/fancy")
    assert "FancyNewForCausalLM" in error and "LlamaForCausalLM" in error
    error = cli.fails("show", "hf.co/tester/fancy")
    assert "FancyNewForCausalLM" in error
    assert _shard_requests(module_hub) == before
    assert "fancy" not in cli.ok("list") and "pickles" not in cli.ok("list")


def test_the_daemon_refuses_a_misshapen_checkout_before_downloading(
    cli: CliHome, module_hub: FakeHub
) -> None:
    """Through the daemon (the CLI's pull): the converter's error, naming the repository and
    the tensor, and none of the shards' weights fetched (only their headers' ranges)."""
    before = len(module_hub.cdn.requests)
    error = cli.fails("pull", "hf.co/tester/misshapen")
    assert "hf.co/tester/misshapen: tensor 'model.layers.0.mlp." in error
    assert "shape" in error and "96" in error
    ranges = [r.headers.get("range") for r in module_hub.cdn.requests[before:]]
    assert ranges and all(r is not None and not r.endswith("-") for r in ranges), ranges
    assert "misshapen" not in cli.ok("list")
    with httpx.Client(base_url=cli.settings.base_url, timeout=30) as http:
        assert http.get("/api/tags").status_code == 200  # the daemon is up


def test_a_quantization_a_checkout_cannot_become_is_named(
    store: Store, hf_settings: Settings, checkpoint: Path, hub: FakeHub
) -> None:
    hub.add_repo("tester/tiny-llama", _files(checkpoint))
    with pytest.raises(RemoteNotFoundError, match="Q4_K_M, Q5_K_M, Q6_K, Q8_0, F16"):
        pull(store, f"{REPO}:IQ2_XS", hf_settings)
    assert not list(store.iter_blobs())


@pytest.mark.parametrize("family", FAMILIES)
def test_the_header_show_makes_from_a_config_is_the_conversions(
    family: str, tmp_path: Path
) -> None:
    """What ``show`` plans a checkout with before downloading it (a GGUF header made from
    config.json) has the tensors, sizes and shapes the converter then writes."""
    checkout = write_checkpoint(tmp_path / family, family)
    converted = tmp_path / "converted.gguf"
    convert_folder(checkout.folder, converted)
    real = inspect_gguf(converted)
    config = json.loads((checkout.folder / "config.json").read_text())
    made = checkout_header(config, config["architectures"][0], "F16")
    assert made.architecture == real.architecture
    assert {t.name: (t.shape, t.n_bytes) for t in made.tensors} == {
        t.name: (t.shape, t.n_bytes) for t in real.tensors
    }
    arch = real.architecture
    for key in (
        "block_count",
        "embedding_length",
        "attention.head_count",
        "attention.head_count_kv",
        "context_length",
    ):
        assert made.metadata[f"{arch}.{key}"] == real.metadata[f"{arch}.{key}"], key
    # Quantized by llama.cpp: each tensor's type (its output-head and _M-mix rules, its
    # fallback for rows its blocks do not divide), hence the size show gives, are the same.
    for quant in ("Q4_K_M", "Q8_0"):
        quantized = tmp_path / f"{quant}.gguf"
        quantize_file(converted, quantized, quant)
        real_types = {t.name: (t.type, t.n_bytes) for t in inspect_gguf(quantized).tensors}
        made = checkout_header(config, config["architectures"][0], quant)
        assert {t.name: (t.type, t.n_bytes) for t in made.tensors} == real_types, quant


def _shard(checkpoint: Path) -> bytes:
    return sorted(checkpoint.glob("*.safetensors"))[0].read_bytes()


def _header_ranges(shard: bytes) -> list[str]:
    """The two Range requests reading a shard's header before its download."""
    length = int.from_bytes(shard[:8], "little")
    return ["bytes=0-7", f"bytes=8-{8 + length - 1}"]


def test_a_dropped_shard_download_resumes_where_it_stopped(
    store: Store, hf_settings: Settings, checkpoint: Path, hub: FakeHub
) -> None:
    hub.add_repo("tester/tiny-llama", _files(checkpoint))
    shard = _shard(checkpoint)
    path = hub.cdn.object_path(shard)
    hub.cdn.add_fault("drop", len(shard) // 2, path)
    pull(store, f"{REPO}:F16", hf_settings)
    ranges = [r.headers.get("range") for r in hub.cdn.requests_for(path)]
    assert ranges == [*_header_ranges(shard), None, f"bytes={len(shard) // 2}-"]
    assert load_model(store, f"{REPO}:F16").info.file_type == "F16"


def test_corrupt_files_are_refused_and_nothing_is_named(
    store: Store, hf_settings: Settings, checkpoint: Path, hub: FakeHub
) -> None:
    repo = hub.add_repo("tester/tiny-llama", _files(checkpoint))
    # a file in git (no LFS): checked against the git object id the Hub lists
    repo.tampered["config.json"] = repo.files["config.json"].replace(b"64", b"65")
    with pytest.raises(PullError, match=r"config\.json: the bytes downloaded are not"):
        pull(store, f"{REPO}:F16", hf_settings)
    repo.tampered.clear()
    # a shard (LFS): checked against its sha256 (corrupted past its header, which the pull
    # reads first to check it against the config)
    shard = _shard(checkpoint)
    hub.cdn.add_fault("corrupt", len(shard) // 2, hub.cdn.object_path(shard))
    with pytest.raises(DigestMismatchError):
        pull(store, f"{REPO}:F16", hf_settings)
    assert not store.exists(f"{REPO}:F16")
    assert not any(p.is_file() for p in store.manifests_dir.rglob("*"))


BAD_TENSORS = [
    ("shape", {"config.json": {"hidden_size": 48}}, r"has shape \[\d+, 64\] but config"),
    ("missing-layer", {"config.json": {"num_hidden_layers": 3}}, "lacks model.layers.2"),
    ("dtype", {"int32": "model.norm.weight"}, "model.norm.weight' is stored as I32"),
]


@pytest.mark.parametrize(("case", "change", "said"), BAD_TENSORS, ids=[c[0] for c in BAD_TENSORS])
def test_a_tensor_disagreeing_with_the_config_is_refused_before_downloading(
    store: Store,
    hf_settings: Settings,
    checkpoint: Path,
    hub: FakeHub,
    tmp_path: Path,
    case: str,
    change: dict[str, Any],
    said: str,
) -> None:
    """Each shard's header is read with two Range requests and checked against config.json
    as the conversion checks it: the pull fails with the converter's error, naming the
    repository, and no shard's weights are downloaded or stored."""
    folder = shutil.copytree(checkpoint, tmp_path / "bad")
    if "config.json" in change:
        config = json.loads((folder / "config.json").read_text())
        config.update(change["config.json"])
        (folder / "config.json").write_text(json.dumps(config))
    else:
        store_as_int32(folder, change["int32"])
    files = _files(folder)
    hub.add_repo(f"tester/bad-{case}", files)
    with pytest.raises(TensorMismatchError, match=said) as refused:
        pull(store, f"hf.co/tester/bad-{case}:F16", hf_settings)
    assert str(refused.value).startswith(f"hf.co/tester/bad-{case}: ")
    shards = [data for name, data in files.items() if name.endswith(".safetensors")]
    assert len(shards) == 2
    for shard in shards:
        ranges = [r.headers.get("range") for r in hub.cdn.requests_for(hub.cdn.object_path(shard))]
        assert ranges == _header_ranges(shard), ranges  # the header only, never the weights
    assert not store.exists(f"hf.co/tester/bad-{case}:F16")
    assert not list(store.partial_dir.iterdir())
    stored = set(store.iter_blobs())
    assert not stored & {"sha256:" + hashlib.sha256(s).hexdigest() for s in shards}


def test_only_the_files_a_conversion_reads_are_downloaded() -> None:
    """As Mistral ships: its own consolidated.safetensors beside the transformers shards, an
    original/ folder of pickles, a README: only config, tokenizer and shards are fetched."""
    names = [
        "README.md",
        "config.json",
        "consolidated.safetensors",
        "generation_config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "original/consolidated.00.pth",
        "params.json",
        "tokenizer.json",
        "tokenizer.model",
        "tokenizer_config.json",
    ]
    files = [HubFile(name, 10, None) for name in names]
    chosen = checkout_files(files, "mistralai/x")
    assert chosen is not None
    assert {f.path for f in chosen} == {
        "config.json",
        "generation_config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
        "tokenizer.model",
        "tokenizer_config.json",
    }
    assert checkout_files([HubFile("model.safetensors", 10, None)], "u/r") is None  # no config
