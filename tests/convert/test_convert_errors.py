"""Bad input to the converter: each a specific error naming the problem, nothing half-written.

Pickled checkpoints are refused without being opened: the pickle written here would create a
marker file if anything unpickled it.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from hf_checkpoint import store_as_int32, write_checkpoint

from localllm._exceptions import (
    ConvertError,
    LocalLLMError,
    MissingConfigError,
    MissingShardError,
    MissingTokenizerError,
    NotAFolderError,
    PickleCheckpointError,
    TensorMismatchError,
    TruncatedShardError,
    UnsupportedArchitectureError,
)
from localllm.convert import (
    SUPPORTED_ARCHITECTURES,
    convert_folder,
    family_name,
    inspect_folder,
)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return write_checkpoint(tmp_path / "model", "llama").folder


def _convert_fails(folder: Path, exc: type[ConvertError], match: str) -> ConvertError:
    out = folder.parent / "out" / "model.gguf"
    with pytest.raises(exc, match=match) as info:
        convert_folder(folder, out)
    assert isinstance(info.value, LocalLLMError)
    # Nothing half-written: no output, no temporary file beside it.
    assert not out.exists()
    assert not out.parent.exists() or not list(out.parent.iterdir())
    return info.value


def _edit_config(folder: Path, **changes: object) -> None:
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    cfg.update(changes)
    path.write_text(json.dumps(cfg))


def test_not_a_folder(tmp_path: Path) -> None:
    file = tmp_path / "model.safetensors"
    file.write_bytes(b"x")
    with pytest.raises(NotAFolderError, match="is not a folder"):
        inspect_folder(file)
    with pytest.raises(NotAFolderError, match="does not exist"):
        convert_folder(tmp_path / "nowhere", tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()


def test_no_config(folder: Path) -> None:
    (folder / "config.json").unlink()
    _convert_fails(folder, MissingConfigError, "no config.json")


def test_config_not_json(folder: Path) -> None:
    (folder / "config.json").write_text("{not json")
    _convert_fails(folder, MissingConfigError, "not valid JSON")


def test_unsupported_architecture_names_itself_and_the_list(folder: Path) -> None:
    _edit_config(folder, architectures=["MambaForCausalLM"])
    err = _convert_fails(folder, UnsupportedArchitectureError, "MambaForCausalLM")
    assert isinstance(err, UnsupportedArchitectureError)
    assert err.architecture == "MambaForCausalLM"
    assert err.supported == SUPPORTED_ARCHITECTURES
    for arch in ("LlamaForCausalLM", "Qwen2ForCausalLM", "Gemma2ForCausalLM", "Phi3ForCausalLM"):
        assert arch in str(err)
    # The same answer from config.json alone, as before a download.
    config = json.loads((folder / "config.json").read_text())
    with pytest.raises(UnsupportedArchitectureError):
        family_name(config)
    assert family_name({**config, "architectures": ["Qwen3ForCausalLM"]}) == "qwen3"


def test_missing_tokenizer(folder: Path) -> None:
    (folder / "tokenizer.json").unlink()
    _convert_fails(folder, MissingTokenizerError, "no tokenizer")
    with pytest.raises(MissingTokenizerError):
        inspect_folder(folder)


def test_missing_shard(folder: Path) -> None:
    (folder / "model-00002-of-00002.safetensors").unlink()
    _convert_fails(folder, MissingShardError, "model-00002-of-00002.safetensors")


def test_index_naming_a_tensor_its_shard_lacks(folder: Path) -> None:
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.layers.9.mlp.up_proj.weight"] = "model-00001-of-00002.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    _convert_fails(folder, MissingShardError, "model.layers.9.mlp.up_proj.weight")


def test_shard_shorter_than_its_header(folder: Path) -> None:
    shard = folder / "model-00002-of-00002.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 100])
    _convert_fails(folder, TruncatedShardError, "shorter than its header says")
    with pytest.raises(TruncatedShardError):
        inspect_folder(folder)


def test_shard_with_a_broken_header(folder: Path) -> None:
    (folder / "model-00001-of-00002.safetensors").write_bytes(b"\xff" * 64)
    _convert_fails(folder, TruncatedShardError, "model-00001-of-00002.safetensors")


def _inspect_fails(folder: Path, match: str) -> None:
    """The folder inspection (headers only, what a create runs before it answers) refuses
    with the converter's own error."""
    with pytest.raises(TensorMismatchError, match=match):
        inspect_folder(folder)


def test_tensor_shape_disagreeing_with_config(folder: Path) -> None:
    _edit_config(folder, intermediate_size=96)
    _inspect_fails(folder, r"mlp\.\w+_proj\.weight.*shape.*96")
    _convert_fails(folder, TensorMismatchError, r"mlp\.\w+_proj\.weight.*shape.*96")


def test_layers_missing_for_the_config(folder: Path) -> None:
    _edit_config(folder, num_hidden_layers=3)
    _inspect_fails(folder, "model.layers.2")
    _convert_fails(folder, TensorMismatchError, "model.layers.2")


def test_tensor_dtype_disagreeing_with_config(folder: Path) -> None:
    store_as_int32(folder, "model.norm.weight")
    _inspect_fails(folder, r"model\.norm\.weight.*I32")
    err = _convert_fails(folder, TensorMismatchError, "model.norm.weight")
    assert "I32" in str(err) and "bfloat16" in str(err)


def test_pickles_are_refused_and_never_unpickled(tmp_path: Path) -> None:
    folder = tmp_path / "old"
    folder.mkdir()
    marker = tmp_path / "unpickled"

    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str, str]]:
            return (open, (str(marker), "w"))

    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(Payload()))
    (folder / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "intermediate_size": 128,
                "vocab_size": 300,
            }
        )
    )
    with pytest.raises(PickleCheckpointError, match=r"pytorch_model\.bin.*never opens"):
        convert_folder(folder, tmp_path / "out.gguf")
    with pytest.raises(PickleCheckpointError):
        inspect_folder(folder)
    assert not marker.exists()
    assert not (tmp_path / "out.gguf").exists()


def test_no_weights_at_all(folder: Path) -> None:
    for p in folder.glob("*.safetensors"):
        p.unlink()
    (folder / "model.safetensors.index.json").unlink()
    _convert_fails(folder, MissingShardError, "no weights")


def test_unknown_bpe_pre_tokenizer_is_refused(folder: Path) -> None:
    spec = json.loads((folder / "tokenizer.json").read_text())
    spec["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\p{L}+|\s+|."
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    _convert_fails(folder, ConvertError, "pre-tokenizer")


def test_bad_outtype(folder: Path) -> None:
    with pytest.raises(ConvertError, match="outtype 'q4_k'"):
        convert_folder(folder, folder.parent / "x.gguf", outtype="q4_k")


def test_interrupted_conversion_leaves_nothing_and_keeps_the_old_file(folder: Path) -> None:
    out = folder.parent / "out" / "model.gguf"
    out.parent.mkdir()
    out.write_bytes(b"the previous model")
    calls = []

    def progress(done: int, total: int) -> None:
        calls.append(done)
        if len(calls) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        convert_folder(folder, out, progress=progress)
    assert out.read_bytes() == b"the previous model"
    assert [p.name for p in out.parent.iterdir()] == ["model.gguf"]


def test_damaged_tokenizer_files(folder: Path) -> None:
    (folder / "tokenizer_config.json").write_text("{broken")
    _convert_fails(folder, MissingTokenizerError, "tokenizer_config.json")
    (folder / "tokenizer_config.json").write_text("{}")
    (folder / "tokenizer.json").write_text("not json either")
    _convert_fails(folder, MissingTokenizerError, "tokenizer.json")


@pytest.mark.parametrize(
    "changes",
    [
        {"hidden_size": "wide"},
        {"num_attention_heads": 0},
        {"rope_theta": "fast"},
        {"num_key_value_heads": 3},
        {"head_dim": [16]},
        {"rope_scaling": {"rope_type": "dynamic"}},
    ],
)
def test_config_values_that_cannot_be_used(folder: Path, changes: dict[str, object]) -> None:
    _edit_config(folder, **changes)
    _convert_fails(folder, ConvertError, "config.json|rope scaling")


def test_cancel_stops_and_leaves_nothing(folder: Path) -> None:
    import threading

    from localllm._exceptions import OperationCancelledError

    cancel = threading.Event()
    out = folder.parent / "out" / "model.gguf"

    def progress(done: int, total: int) -> None:
        if done < total:
            cancel.set()

    with pytest.raises(OperationCancelledError, match="cancelled"):
        convert_folder(folder, out, progress=progress, cancel=cancel)
    assert not out.parent.exists() or not list(out.parent.iterdir())
