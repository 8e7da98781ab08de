"""A safetensors folder at a glance: its config, its family, its files, sizes and tensors.

:func:`inspect_folder` reads only config.json, the index and the shards' headers (no weights),
and raises the same errors a conversion would for a folder that cannot be converted (every
tensor's name, shape and dtype checked against the config, as the conversion plans them), so a
caller can refuse early (before a download, before a store transaction, before a streamed
create answers). :func:`check_tensors` is that check on headers read elsewhere (a pull reads a
shard's header with a Range request before downloading it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localllm._exceptions import MissingConfigError, MissingTokenizerError, NotAFolderError
from localllm.convert.base import Family
from localllm.convert.families import family_for
from localllm.convert.shards import INDEX_NAME, TensorEntry, index_folder
from localllm.convert.vocab import has_tokenizer

__all__ = ["TOKENIZER_FILES", "FolderInfo", "check_tensors", "inspect_folder", "read_config"]

# The files besides the shards a conversion reads when present.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
)

_DTYPES = {
    "bfloat16": "bf16",
    "float16": "f16",
    "float32": "f32",
    "float64": "f64",
    "BF16": "bf16",
    "F16": "f16",
    "F32": "f32",
    "F64": "f64",
}


@dataclass(frozen=True)
class FolderInfo:
    """What a safetensors folder holds, read from its config and headers only."""

    path: Path
    architecture: str
    """The HF architecture name of config.json (``LlamaForCausalLM``...)."""
    family: str
    """The converter family that handles it (``llama``, ``qwen2``...)."""
    files: list[str]
    """The folder's files a conversion reads (config, tokenizer files, index, shards)."""
    tensor_bytes: int
    """The weights' bytes as stored (bf16 is 2 bytes a parameter)."""
    parameter_count: int
    context_length: int | None
    dtype: str
    """The stored weights' type, ``bf16``, ``f16`` or ``f32`` (the most common one)."""
    config: dict[str, Any]


def read_config(folder: Path) -> dict[str, Any]:
    """config.json as a dict; refuses a path that is not a folder or has no usable config."""
    folder = Path(folder)
    if not folder.is_dir():
        what = "does not exist" if not folder.exists() else "is not a folder"
        raise NotAFolderError(
            f"{folder} {what}: give the folder holding config.json and the *.safetensors files"
        )
    path = folder / "config.json"
    if not path.is_file():
        raise MissingConfigError(
            f"{folder} has no config.json: it is not a Hugging Face model "
            "folder (or the download is incomplete)"
        )
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise MissingConfigError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise MissingConfigError(f"{path}: not a JSON object")
    return config


def check_tensors(config: Mapping[str, Any], tensors: Mapping[str, TensorEntry]) -> Family:
    """Check every tensor's name, shape and dtype (from the headers alone) against what
    ``config`` implies, as a conversion plans them; returns the family. Raises the
    conversion's own :class:`~localllm._exceptions.TensorMismatchError` (a tensor missing,
    foreign, of another shape or not a float), or the family's config errors."""
    family = family_for(config)
    dtype = config.get("torch_dtype") or config.get("dtype")
    family.plan(tensors, str(dtype) if dtype else None)
    return family


def _scan(folder: Path) -> tuple[dict[str, Any], Family, dict[str, TensorEntry]]:
    config = read_config(folder)
    family_for(config)  # an architecture it cannot convert is said before the shards are read
    tensors = index_folder(folder)
    if not has_tokenizer(folder):
        raise MissingTokenizerError(
            f"{folder} has no tokenizer: neither tokenizer.json nor tokenizer.model (copy the "
            "tokenizer files of the repository next to the weights)"
        )
    # Headers only, no weights: a tensor that disagrees with the config is refused here,
    # before a create answers, not midway through a conversion.
    family = check_tensors(config, tensors)
    return config, family, tensors


def inspect_folder(folder: Path) -> FolderInfo:
    """Describe a safetensors folder without reading its weights; raises a ``ConvertError``
    subclass for a folder that cannot be converted."""
    folder = Path(folder)
    config, family, tensors = _scan(folder)
    shards = sorted({t.file.name for t in tensors.values()})
    extra = [n for n in ("config.json", *TOKENIZER_FILES, INDEX_NAME) if (folder / n).is_file()]
    by_dtype: dict[str, int] = {}
    for t in tensors.values():
        by_dtype[t.dtype] = by_dtype.get(t.dtype, 0) + t.nbytes
    stored = max(by_dtype, key=by_dtype.__getitem__) if by_dtype else "F32"
    return FolderInfo(
        path=folder,
        architecture=str(config["architectures"][0]),
        family=family.name,
        files=extra + shards,
        tensor_bytes=sum(t.nbytes for t in tensors.values()),
        parameter_count=sum(math.prod(t.shape) for t in tensors.values()),
        context_length=family.context_length,
        dtype=_DTYPES.get(stored, stored.lower()),
        config=config,
    )
