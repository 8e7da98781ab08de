"""The pull plan of a Hugging Face repository of safetensors (no GGUF): every file of the
checkout as a blob (the shards resumable and verified by their LFS sha256, as GGUF files are;
the small files in git checked against their git object id), then converted and quantized by
:func:`~localllm.sources.pull.pull` before the name is written.

Before any shard is downloaded its safetensors header is read with two Range requests (its
8 length bytes, then exactly the header) and every tensor's name, shape and dtype is checked
against config.json as the conversion will check it: a checkout whose weights disagree with its
config is refused before its gigabytes are fetched."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._exceptions import ConvertError, PullError
from .._format import human_size
from ..store.manifest import Manifest, normalize_digest
from .checkout import check_convertible, fetch_small_file
from .gguf_files import HubFile
from .http import TransientError
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


def _read_range(source: BlobSource, client: Any, start: int, end: int) -> bytes:
    """Bytes ``start``..``end`` of a file (a server that ignores ranges: cut from its 200)."""
    response = source.open(client, start, end)  # type: ignore[call-arg]  # HubFileSource's
    try:
        if response.status_code not in (200, 206):
            raise PullError(f"{source.description}: HTTP {response.status_code} for a range")
        skip = start if response.status_code == 200 else 0
        data = bytearray()
        for piece in response.iter_bytes():
            data += piece
            if len(data) >= skip + end - start:
                break
    finally:
        response.close()
    return bytes(data[skip : skip + end - start])


def _shard_header(source: BlobSource, client: Any, hub_file: HubFile) -> dict[str, Any]:
    from ..convert import header_length, parse_header

    name = hub_file.path
    length = header_length(
        _read_range(source, client, 0, min(8, hub_file.size)), name, hub_file.size
    )
    return parse_header(_read_range(source, client, 8, 8 + length), Path(name), hub_file.size)


def check_shard_headers(
    config: dict[str, Any],
    shards: Sequence[HubFile],
    source: Callable[[str], BlobSource],
    repo: str,
    timeout: float = 30.0,
) -> None:
    """Read each shard's safetensors header (Range requests, no weights) and check every
    tensor against ``config`` as the conversion will; raises the converter's
    :class:`ConvertError` (a shape, a dtype, a missing tensor...) naming the repository."""
    import httpx

    from ..convert import check_tensors

    tensors: dict[str, Any] = {}
    try:
        with httpx.Client(timeout=timeout) as client:
            for hub_file in shards:
                tensors.update(_shard_header(source(hub_file.path), client, hub_file))
        check_tensors(config, tensors)
    except ConvertError as exc:
        exc.args = (f"hf.co/{repo}: {exc}",)
        raise
    except (httpx.HTTPError, TransientError) as exc:
        raise PullError(
            f"hf.co/{repo}: cannot read the shards' headers ({exc}); try the pull again"
        ) from None


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
    config: dict[str, Any] | None = None
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
    if config is not None:
        shards = [f for f in files if f.path.endswith(".safetensors")]
        check_shard_headers(config, shards, source, repo, timeout)
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
