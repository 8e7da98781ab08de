"""Hugging Face Hub source: ``hf.co/<user>/<repo>[:<quant>|:<file>.gguf]``.

What the Hub *says* comes through ``huggingface_hub`` (``HfApi.model_info`` for the file list
with LFS sha256 and the commit, ``get_hf_file_metadata`` for each file's download location,
``build_hf_headers`` for the token of ``HF_TOKEN`` or ``hf auth login``); the *bytes* come through
localllm's own download engine (:mod:`.transfer`), not ``hf_hub_download``. Why:

* ``hf_hub_download`` writes into the Hugging Face cache (or a ``local_dir`` with its own
  ``.cache`` metadata); making that file a blob would need a second full read to hash it, and a
  copy or a cache left behind would double the disk used by multi-gigabyte files. The engine
  hashes while it downloads into ``partial/`` and renames the verified file into ``blobs/``.
* the engine gives what a daemon needs and ``hf_hub_download`` does not: progress events with
  rate, cancellation, a stall timeout with bounded retries, one download shared by concurrent
  pulls, the same resume/verify code for the Ollama registry.
* the price: no Xet chunk-level download acceleration (the Hub's ``resolve`` URLs serve Xet
  files over plain HTTP too, so every file still downloads).

The endpoint comes from :attr:`Settings.hf_endpoint` and is passed explicitly, because
``huggingface_hub`` reads ``HF_ENDPOINT`` only once, when it is imported.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urljoin

import httpx

from .._exceptions import (
    AuthRequiredError,
    LocalLLMError,
    NetworkError,
    PullError,
    RemoteNotFoundError,
)
from ..gguf_info import inspect_gguf
from ..settings import Settings
from ..store.manifest import MEDIA_MODEL, MEDIA_PROJECTOR, Layer, Manifest, normalize_digest
from ..store.names import ModelName
from ..store.store import Store
from .assemble import assemble_manifest
from .checkout import checkout_files, checkout_quant
from .checkout_plan import plan_checkout
from .gguf_files import HubFile, _candidates, choose_gguf, choose_projector
from .http import TransientError, is_transport_error, same_origin, transient_status
from .hub_errors import hub_error, hub_files
from .plan import PlannedBlob, PullPlan
from .progress import STATUS_MANIFEST, PullProgress

__all__ = ["HubFileSource", "plan_huggingface"]


def _hub_error(exc: BaseException, repo: str, endpoint: str) -> BaseException:
    """The localllm error for a huggingface_hub failure (TransientError if worth retrying)."""
    from huggingface_hub import errors

    if isinstance(exc, errors.HfHubHTTPError) and not isinstance(
        exc, errors.RepositoryNotFoundError | errors.GatedRepoError
    ):
        status = getattr(getattr(exc, "response", None), "status_code", 0)
        if transient_status(status):
            return TransientError(f"Hugging Face answered HTTP {status}")
    if is_transport_error(exc):
        return TransientError(f"{type(exc).__name__}: {exc}")
    return hub_error(exc, f"hf.co/{repo}", endpoint)


@dataclass(frozen=True)
class HubFileSource:
    """One file of a repository at a fixed commit, downloadable with Range requests."""

    repo_id: str
    """``user/repo``."""
    path: str
    """Path of the file in the repository."""
    revision: str
    """Commit hash the file list came from (so a resumed download gets the same bytes)."""
    endpoint: str
    """Hub base URL."""
    timeout: float
    """Seconds for the metadata request."""

    @property
    def description(self) -> str:
        """``hf.co/user/repo/file.gguf``."""
        return f"hf.co/{self.repo_id}/{self.path}"

    def open(self, client: httpx.Client, offset: int, end: int | None = None) -> httpx.Response:
        """Ask the Hub where the file lives, then GET it from there from byte ``offset`` (up to
        byte ``end``, excluded, when given: a header read)."""
        from huggingface_hub import get_hf_file_metadata, hf_hub_url
        from huggingface_hub.utils import build_hf_headers

        url = hf_hub_url(self.repo_id, self.path, revision=self.revision, endpoint=self.endpoint)
        try:
            # Follows the Hub's own redirects with the token; stops at the first redirect off
            # the Hub (the CDN) and reports it as the location.
            metadata = get_hf_file_metadata(url, timeout=self.timeout)
        except Exception as exc:
            raise _hub_error(exc, self.repo_id, self.endpoint) from None
        location = urljoin(url, metadata.location)
        on_hub = same_origin(location, self.endpoint)
        headers: dict[str, str] = {}
        if on_hub:
            # The token goes to the Hub only, never to a CDN.
            headers.update(build_hf_headers())
        if offset or end is not None:
            headers["Range"] = f"bytes={offset}-{'' if end is None else end - 1}"
        request = client.build_request("GET", location, headers=headers)
        response = client.send(request, stream=True, follow_redirects=True)
        status = response.status_code
        if status in (200, 206, 416):
            return response
        response.close()
        if status in (401, 403):
            if on_hub:
                raise AuthRequiredError(
                    f"hf.co/{self.repo_id} needs authentication (HTTP {status}): set HF_TOKEN "
                    "to an access token that can read it"
                )
            raise TransientError(f"the download link was refused (HTTP {status}); renewing it")
        if status == 404:
            raise RemoteNotFoundError(f"{self.description} was not found (HTTP 404)")
        if transient_status(status):
            raise TransientError(f"HTTP {status} from {httpx.URL(location).host}")
        raise PullError(f"{self.description}: unexpected HTTP {status}")


def _list_files(name: ModelName, settings: Settings) -> tuple[str, list[HubFile]]:
    from huggingface_hub import HfApi

    api = HfApi(endpoint=settings.hf_endpoint)
    try:
        info = api.model_info(
            name.repo_id, files_metadata=True, timeout=settings.pull_stall_timeout
        )
    except Exception as exc:
        error = _hub_error(exc, name.repo_id, settings.hf_endpoint)
        if isinstance(error, TransientError):
            raise NetworkError(
                f"cannot reach Hugging Face at {settings.hf_endpoint} ({error}); check the "
                "network connection"
            ) from None
        raise error from None
    return info.sha or "main", hub_files(info)


def plan_huggingface(
    store: Store,
    name: ModelName,
    settings: Settings,
    emit: Callable[[PullProgress], None],
    *,
    file_tag: str | None = None,
) -> PullPlan:
    """Resolve ``name`` on the Hub: which file(s), their digests, how to write the model;
    ``file_tag`` chooses the file in place of the name's tag."""
    emit(PullProgress(STATUS_MANIFEST))
    revision, files = _list_files(name, settings)
    if not _candidates(files) and (checkout := checkout_files(files, name.repo_id)) is not None:
        source = functools.partial(
            HubFileSource,
            name.repo_id,
            revision=revision,
            endpoint=settings.hf_endpoint,
            timeout=settings.pull_stall_timeout,
        )
        quant = checkout_quant(file_tag or name.tag, name.repo_id)
        return plan_checkout(
            store, name.repo_id, checkout, source, quant, emit, settings.pull_stall_timeout
        )
    choice = choose_gguf(files, file_tag or name.tag, name.repo_id)
    emit(PullProgress(choice.note))
    wanted = list(choice.files)
    projector = choose_projector(files, choice)
    if projector is not None:
        # A repository that ships mmproj files next to the model is a vision model: its
        # projector is a layer of its own, as the Ollama registry lays it out.
        emit(PullProgress(projector[1]))
        wanted.append(projector[0])
    blobs = []
    for hub_file in wanted:
        if not hub_file.sha256:
            raise PullError(
                f"hf.co/{name.repo_id}/{hub_file.path} is not stored with Git LFS, so the Hub "
                "publishes no sha256 to verify it against"
            )
        source = HubFileSource(
            repo_id=name.repo_id,
            path=hub_file.path,
            revision=revision,
            endpoint=settings.hf_endpoint,
            timeout=settings.pull_stall_timeout,
        )
        # normalize_digest validates what the Hub sent before it names a file.
        digest = normalize_digest(f"sha256:{hub_file.sha256}")
        blobs.append(PlannedBlob(digest, hub_file.size, source))
    parts = blobs[: len(choice.files)]
    layers = [Layer(MEDIA_MODEL, blob.digest, blob.size) for blob in parts]
    extra = [Layer(MEDIA_PROJECTOR, blob.digest, blob.size) for blob in blobs[len(parts) :]]

    def build() -> Manifest:
        for layer in extra:
            try:
                inspect_gguf(store.blob_path(layer.digest)).require_projector()
            except LocalLLMError as exc:
                raise PullError(
                    f"hf.co/{name.repo_id}: its mmproj file is unusable: {exc}"
                ) from None
        return assemble_manifest(store, layers, extra)

    return PullPlan(blobs=tuple(blobs), build=build, file_type=choice.quant)
