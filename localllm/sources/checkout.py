"""A Hugging Face repository that holds a model as the Hub ships it (safetensors shards, config,
tokenizer) and no GGUF: which files a conversion needs, its config, and those files in the store.

* :func:`checkout_files` — the files to download (root-level shards, the index, config,
  generation config, tokenizer files, chat template), or ``None`` for a repository that is
  no checkout; a repository of pickles only (``pytorch_model.bin``) is refused, saying why;
* :func:`fetch_small_file` — a file stored in git itself (no LFS, so the Hub publishes no
  sha256): downloaded into memory, checked against the git object id the Hub lists
  (``sha1("blob <size>\\0" + bytes)``), then written as a blob;
* :func:`read_config` — ``config.json`` (and the parameter count the Hub or the index says),
  for ``show``'s estimates before anything is downloaded;
* :data:`CONVERTED_QUANTS` — what a checkout can be quantized to, smallest first.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._exceptions import ConvertError, PickleCheckpointError, PullError, RemoteNotFoundError
from .gguf_files import HubFile

if TYPE_CHECKING:
    from ..store.store import Store
    from .transfer import BlobSource

__all__ = [
    "CONVERTED_QUANTS",
    "DEFAULT_CONVERTED_QUANT",
    "CheckoutFacts",
    "check_convertible",
    "checkout_files",
    "checkout_quant",
    "fetch_small_file",
    "read_config",
]

CONVERTED_QUANTS = ("Q4_0", "Q4_K_S", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "F16")
"""What a converted checkout can become (llama.cpp's quantizer on the F16 conversion)."""
DEFAULT_CONVERTED_QUANT = "Q4_K_M"
"""A pull without a tag and without the daemon's pick (as for GGUF repositories)."""
_WANTED_NAMES = {
    "config.json",
    "generation_config.json",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
}
_PICKLES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def checkout_files(files: Sequence[HubFile], repo: str) -> list[HubFile] | None:
    """The files of ``repo`` a conversion reads, or ``None`` when it holds no safetensors
    checkout (no ``config.json`` at its root). Raises :class:`PickleCheckpointError` (a 400)
    for a checkout of pickles only, which localllm never unpickles."""
    root = [f for f in files if "/" not in f.path]
    names = {f.path for f in root}
    if "config.json" not in names:
        return None
    shards = [f for f in root if f.path.lower().endswith(".safetensors")]
    if not shards:
        pickles = sorted(f.path for f in root if f.path.lower().endswith(_PICKLES))
        if pickles:
            raise PickleCheckpointError(
                f"hf.co/{repo} holds only pickled PyTorch checkpoints ({', '.join(pickles[:3])}): "
                "localllm never unpickles them (a pickle can run any code when loaded); look "
                "for a safetensors or GGUF repository of the model"
            )
        return None
    transformers = [f for f in shards if f.path.startswith("model")]
    if transformers:
        # Mistral's repositories ship its own format (consolidated.safetensors) beside the
        # transformers shards: the same weights again, which the converter does not read.
        shards = transformers
    wanted = [f for f in root if f.path in _WANTED_NAMES or f in shards]
    return sorted(wanted, key=lambda f: (f.path.endswith(".safetensors"), f.path))


def checkout_quant(tag: str, repo: str) -> str:
    """The quantization a tag asks of a checkout (``latest``: Q4_K_M); raises
    :class:`RemoteNotFoundError` naming those it can become."""
    if tag == "latest":
        return DEFAULT_CONVERTED_QUANT
    wanted = tag.upper()
    wanted = {"Q4_K": "Q4_K_M", "FP16": "F16"}.get(wanted, wanted)
    if wanted not in CONVERTED_QUANTS:
        raise RemoteNotFoundError(
            f"hf.co/{repo} holds safetensors, converted and quantized here to one of: "
            f"{', '.join(CONVERTED_QUANTS)}; {tag} is not one of them"
        )
    return wanted


def check_convertible(config: dict[str, Any], repo: str) -> str:
    """The converter family of a checkout's ``config.json``; refuses, before any download, a
    checkout the converter cannot convert (:func:`localllm.convert.family_name`'s own
    :class:`ConvertError`: an architecture it lacks, named with those it has, a 400),
    naming the repository."""
    from ..convert import family_name

    try:
        return family_name(config)
    except ConvertError as exc:
        exc.args = (f"hf.co/{repo}: {exc}",)
        raise


def _git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def fetch_small_file(
    store: Store, source: BlobSource, hub_file: HubFile, timeout: float = 30.0
) -> str:
    """Download a small non-LFS file, check it against the Hub's git object id, store it as
    a blob and return its digest. Raises :class:`PullError` for other bytes (nothing is
    stored)."""
    import httpx

    with httpx.Client(timeout=timeout) as client:
        response = source.open(client, 0)
        try:
            data = response.read()
        finally:
            response.close()
    if hub_file.blob_id and _git_oid(data) != hub_file.blob_id:
        raise PullError(
            f"{source.description}: the bytes downloaded are not the file the Hub lists "
            f"(git object {hub_file.blob_id[:12]})"
        )
    if len(data) != hub_file.size:
        raise PullError(
            f"{source.description}: {len(data)} bytes downloaded, the Hub lists {hub_file.size}"
        )
    return store.write_blob([data]).digest


@dataclass(frozen=True)
class CheckoutFacts:
    """What a checkout's config and index say, before any shard is downloaded."""

    config: dict[str, Any]
    """``config.json`` (for a multimodal model, its ``text_config`` merged over it)."""
    raw: dict[str, Any]
    """``config.json`` as it is."""
    parameters: int
    """Weights: the Hub's safetensors count, else the index's ``total_size`` over the bytes
    of the dtype the config names."""
    architecture: str
    """The config's first ``architectures`` entry (``LlamaForCausalLM``)."""


def read_config(
    get_json: Callable[[str], Any], repo: str, files: Sequence[HubFile], hub_parameters: Any
) -> CheckoutFacts:
    """``config.json`` and the parameter count of a checkout; ``get_json(path)`` reads one
    of its files (two small requests at most)."""
    config = get_json("config.json")
    if not isinstance(config, dict):
        raise PullError(f"hf.co/{repo}/config.json is not a JSON object")
    text = config.get("text_config")
    merged = {**config, **text} if isinstance(text, dict) else dict(config)
    architectures = config.get("architectures") or [config.get("model_type") or "unknown"]
    parameters = int(hub_parameters) if isinstance(hub_parameters, int) else 0
    if not parameters and any(f.path == "model.safetensors.index.json" for f in files):
        index = get_json("model.safetensors.index.json")
        total = (index.get("metadata") or {}).get("total_size") if isinstance(index, dict) else 0
        dtype = str(merged.get("torch_dtype") or merged.get("dtype") or "bfloat16")
        width = {"float32": 4, "float16": 2, "bfloat16": 2}.get(dtype, 2)
        parameters = int(total or 0) // width
    if not parameters:
        # One shard, no index: its size over two bytes a weight (bf16, as the Hub ships).
        shards = [f for f in files if f.path.endswith(".safetensors")]
        parameters = sum(f.size for f in shards) // 2
    return CheckoutFacts(merged, config, parameters, str(architectures[0]))
