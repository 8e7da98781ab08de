"""The pull plan of a Hugging Face repository of safetensors (no GGUF): every file of the
checkout as a blob (the shards resumable and verified by their LFS sha256, as GGUF files are;
the small files in git checked against their git object id), then converted and quantized by
:func:`~localllm.sources.pull.pull` before the name is written."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .._exceptions import PullError
from .._format import human_size
from ..store.manifest import Manifest, normalize_digest
from .checkout import check_convertible, fetch_small_file
from .gguf_files import HubFile
from .plan import PlannedBlob, PullPlan
from .progress import PullProgress

if TYPE_CHECKING:
    from ..store.store import Store
    from .transfer import BlobSource

__all__ = ["plan_checkout"]


def _config(store: Store, digest: str, repo: str) -> dict[str, Any]:
    try:
        config = json.loads(store.read_blob(digest))
    except ValueError:
        config = None
    if not isinstance(config, dict):
        raise PullError(f"hf.co/{repo}/config.json is not a model's config (a JSON object)")
    return config


def plan_checkout(
    store: Store,
    repo: str,
    files: Sequence[HubFile],
    source: Callable[[str], BlobSource],
    quant: str,
    emit: Callable[[PullProgress], None],
    timeout: float = 30.0,
) -> PullPlan:
    """Fetch the checkout's small files now (config first: an architecture the converter
    cannot convert is refused before the shards are downloaded) and plan its LFS files."""
    names: dict[str, str] = {}
    blobs = []
    architecture = "an architecture its config names"  # a config in LFS is read once fetched
    for hub_file in sorted(files, key=lambda f: f.path != "config.json"):
        if hub_file.sha256:
            digest = normalize_digest(f"sha256:{hub_file.sha256}")
            blobs.append(PlannedBlob(digest, hub_file.size, source(hub_file.path)))
        else:
            digest = fetch_small_file(store, source(hub_file.path), hub_file, timeout)
        names[hub_file.path] = digest
        if hub_file.path == "config.json" and not hub_file.sha256:
            config = _config(store, digest, repo)
            check_convertible(config, repo)
            architecture = str((config.get("architectures") or ["?"])[0])
    size = sum(f.size for f in files)
    then = "quantizing to " + quant if quant != "F16" else "keeping F16"
    emit(
        PullProgress(
            f"hf.co/{repo} holds safetensors ({architecture}) and no GGUF: downloading "
            f"{len(files)} files ({human_size(size)}), converting, then {then}"
        )
    )

    def build() -> Manifest:
        raise PullError("a safetensors checkout is converted, not assembled")  # pull converts

    return PullPlan(
        blobs=tuple(blobs), build=build, file_type="F16", checkout=names, convert_to=quant
    )
