"""Model management routes of the Ollama API: tags, show, copy, delete, blobs, create, pull.

Store work (hashing, copying gigabytes, downloads) runs in worker threads so the event loop
keeps serving generations meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from localllm._exceptions import AdapterError, LocalLLMError, ModelNotFoundError, StoreError
from localllm.gguf_info import ArrayInfo, GGUFInfo, draft_incompatibility, inspect_gguf
from localllm.store.adapters import AdapterSource, check_adapter, parse_scale
from localllm.store.manifest import normalize_digest
from localllm.store.models import (
    LocalModel,
    create_model,
    load_model,
    parse_parameters,
    render_modelfile,
)
from localllm.store.names import ModelName, parse_name
from localllm.store.safetensors import (
    Checkout,
    check_file_names,
    inspect_checkout,
    is_checkout_files,
)

from ..errors import HTTPProblem, problem_from
from ..generation import resolve_model
from ..prompt.thinking import model_thinking
from ..prompt.tools import supports_tools
from ..state import DaemonState, StateDep
from .schemas_ollama import CopyRequest, CreateRequest, DeleteRequest, PullRequest, ShowRequest
from .streaming import NDJSON, ClosingStreamingResponse, ndjson_line

__all__ = ["capabilities", "router", "safe_details"]

log = logging.getLogger("localllm.daemon")

router = APIRouter()


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat().replace("+00:00", "Z")


def safe_details(model: LocalModel) -> dict[str, Any]:
    """Ollama's ``details``; a model whose GGUF cannot be read gets placeholders, not a 500."""
    try:
        return model.details()
    except Exception:
        return {
            "parent_model": "",
            "format": "gguf",
            "family": "unknown",
            "families": None,
            "parameter_size": "",
            "quantization_level": "",
        }


@router.get("/api/tags", summary="List local models")
async def tags(state: StateDep) -> dict[str, Any]:
    """Every model in the store, newest first."""
    entries = await run_in_threadpool(state.store.list)
    models = []
    for entry in entries:
        model = LocalModel(entry=entry, store=state.store)
        models.append(
            {
                "name": entry.name.short,
                "model": entry.name.short,
                "modified_at": _iso(entry.modified),
                "size": entry.size,
                "digest": entry.digest.removeprefix("sha256:"),
                "details": await run_in_threadpool(safe_details, model),
            }
        )
    return {"models": models}


def capabilities(model: LocalModel) -> list[str]:
    """Ollama's ``capabilities``: the store's (``completion`` or ``embedding`` from the GGUF,
    ``insert`` when its vocabulary has fill-in-the-middle tokens) plus ``tools`` when the
    chat template the runner renders takes tools and ``thinking`` when it shows reasoning
    (think tags, a reasoning switch, harmony channels), as Ollama judges them."""
    found = list(model.capabilities())
    if "completion" in found:
        if supports_tools(model) and "tools" not in found:
            found.insert(found.index("completion") + 1, "tools")
        if model_thinking(model) is not None and "thinking" not in found:
            found.append("thinking")
    return found


def _json_value(value: Any, verbose: bool) -> Any:
    if isinstance(value, ArrayInfo):
        return None
    if isinstance(value, list):
        return value if verbose or len(value) <= 64 else None
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    return value


def _parameters_text(parameters: dict[str, Any]) -> str:
    lines = []
    for key, value in parameters.items():
        for item in value if isinstance(value, list) else [value]:
            shown = f'"{item}"' if isinstance(item, str) else str(item)
            lines.append(f"{key:<30} {shown}")
    return "\n".join(lines)


def _show(model: LocalModel, verbose: bool) -> dict[str, Any]:
    info = model.info
    model_info = {k: _json_value(v, verbose) for k, v in info.metadata.items()}
    model_info["general.parameter_count"] = info.parameter_count
    body: dict[str, Any] = {
        "license": model.license or "",
        "modelfile": render_modelfile(model),
        "parameters": _parameters_text(model.parameters),
        "template": model.template or "",
        "details": model.details(),
        "model_info": model_info,
        "capabilities": capabilities(model),
        "modified_at": _iso(model.entry.modified),
    }
    projector = model.projector_info
    if projector is not None:
        # Ollama reports the projector's own GGUF metadata beside the model's.
        projector_info = {k: _json_value(v, verbose) for k, v in projector.metadata.items()}
        projector_info["general.parameter_count"] = projector.parameter_count
        body["projector_info"] = projector_info
    if adapters := _adapters_shown(model):
        body["adapters"] = adapters
    if model.system:
        body["system"] = model.system
    if model.messages:
        body["messages"] = model.messages
    return body


def _adapters_shown(model: LocalModel) -> list[dict[str, Any]]:
    """localllm's ``adapters`` of ``/api/show``: each LoRA adapter's digest, size, scale and
    what its header says (alpha, rank, weights changed)."""
    shown = []
    for adapter in model.adapters:
        entry: dict[str, Any] = {
            "digest": adapter.digest,
            "size": adapter.size,
            "scale": adapter.scale,
        }
        try:
            facts = check_adapter(adapter.path, [inspect_gguf(p) for p in model.gguf_paths])
        except LocalLLMError as exc:
            entry["problem"] = str(exc)
        else:
            entry.update(name=facts.name, alpha=facts.alpha, rank=facts.rank, tensors=facts.tensors)
        shown.append(entry)
    return shown


@router.post("/api/show", summary="Show a model's details")
async def show(body: ShowRequest, state: StateDep) -> JSONResponse:
    """Modelfile, parameters, template, details, GGUF metadata and capabilities."""
    model = resolve_model(state, body.model_name())
    return JSONResponse(await run_in_threadpool(_show, model, bool(body.verbose)))


@router.post("/api/copy", summary="Copy a model")
async def copy(body: CopyRequest, state: StateDep) -> Response:
    """Give a model a second name; 404 if the source does not exist."""
    source = resolve_model(state, body.source, "source").name
    destination = _new_name(body.destination, "destination")
    await run_in_threadpool(state.store.copy, source, destination)
    return Response(status_code=200)


@router.delete("/api/delete", summary="Delete a model")
async def delete(body: DeleteRequest, state: StateDep) -> Response:
    """Remove a model (unloading it first, or once its answers end); 404 if it does not exist.
    A damaged model, or one whose manifest cannot be read, is removed too: that is its fix."""
    name = _new_name(body.model_name(), "model")
    if not await run_in_threadpool(state.store.exists, name):
        raise ModelNotFoundError(name.short)
    await state.scheduler.unload(name.full)
    await run_in_threadpool(state.store.delete, name)
    return Response(status_code=200)


def _new_name(value: str | None, field: str) -> ModelName:
    """A valid model name that need not exist yet (400 naming ``field`` otherwise)."""
    if not value:
        raise HTTPProblem(400, f"{field} is required", param=field)
    try:
        return parse_name(value)
    except LocalLLMError as exc:
        raise HTTPProblem(400, str(exc), param=field) from None


def _digest(value: str) -> str:
    try:
        return normalize_digest(value)
    except LocalLLMError as exc:
        raise HTTPProblem(400, str(exc), param="digest") from None


@router.head("/api/blobs/{digest}", summary="Check a blob")
async def blob_exists(digest: str, state: StateDep) -> Response:
    """200 when the store has the blob, 404 otherwise."""
    exists = state.store.has_blob(_digest(digest))
    return Response(status_code=200 if exists else 404)


@router.post("/api/blobs/{digest}", summary="Upload a blob", status_code=201)
async def blob_upload(digest: str, request: Request, state: StateDep) -> Response:
    """Store the request body as a blob; 400 if its sha256 is not ``digest``."""
    expected = _digest(digest)
    if state.store.has_blob(expected):
        return Response(status_code=201)
    writer = await run_in_threadpool(state.store.blob_writer, expected)
    try:
        async for chunk in request.stream():
            if chunk:
                await run_in_threadpool(writer.write, chunk)
        await run_in_threadpool(writer.commit)
    except BaseException:
        writer.abort()
        raise
    return Response(status_code=201)


def _looks_like_path(value: str) -> bool:
    return value.startswith(("/", "./", "../", "~")) or value.lower().endswith(".gguf")


def _is_projector_blob(state: DaemonState, digest: str) -> bool:
    """True when the blob is a GGUF whose ``general.architecture`` is ``clip`` (an mmproj)."""
    try:
        return inspect_gguf(state.store.blob_path(digest)).is_projector
    except LocalLLMError:
        return False  # not a GGUF at all: the model checks say so, naming the blob


def _create_sources(body: CreateRequest, state: DaemonState) -> dict[str, Any]:
    sources: dict[str, Any] = {}
    model_digests: list[str] = []
    if body.files:
        digests = {name: _digest(d) for name, d in body.files.items()}
        for digest in digests.values():
            if not state.store.has_blob(digest):
                raise HTTPProblem(
                    400,
                    f"blob {digest} not found; upload it first (POST /api/blobs)",
                    param="files",
                )
        # Ollama's create takes a vision projector as one more GGUF in files, told apart from
        # the model by its header (general.architecture clip).
        projectors = [d for d in digests.values() if _is_projector_blob(state, d)]
        if len(projectors) > 1:
            raise HTTPProblem(
                400, "files may hold at most one vision projector (clip GGUF)", param="files"
            )
        if projectors:
            sources["projector_digest"] = projectors[0]
        rest = {n: d for n, d in digests.items() if d not in projectors}
        if is_checkout_files(list(rest)):
            # A Hugging Face checkout uploaded file by file (as Ollama's CLI sends a folder):
            # converted by the daemon.
            if body.from_:
                raise HTTPProblem(
                    400,
                    "give the model either in 'from' or in 'files', not both",
                    param="files",
                )
            try:
                check_file_names(list(rest))
            except LocalLLMError as exc:
                raise HTTPProblem(400, str(exc), param="files") from None
            sources["checkout"] = Checkout(files=rest)
            return sources
        ggufs = [d for name, d in rest.items() if name.lower().endswith(".gguf")]
        if len(rest) > 1 and len(ggufs) != 1:
            raise HTTPProblem(400, "files must name exactly one .gguf model file", param="files")
        model_digests = ggufs or list(rest.values())
    if body.from_:
        if _looks_like_path(body.from_):
            path = Path(body.from_).expanduser()
            if path.is_dir():
                sources["checkout"] = Checkout(folder=path)  # safetensors, converted here
            elif not path.is_file():
                raise HTTPProblem(400, f"{body.from_}: no such file or folder", param="from")
            else:
                sources["gguf_file"] = path
        else:
            sources["base"] = resolve_model(state, body.from_, "from").name
        if model_digests:
            raise HTTPProblem(
                400,
                "give the model either in 'from' or in 'files', not both (files may then "
                "hold only a vision projector)",
                param="files",
            )
        return sources
    if model_digests:
        sources["gguf_digest"] = model_digests[0]
        return sources
    if "projector_digest" in sources:
        raise HTTPProblem(
            400,
            "files hold only a vision projector (general.architecture clip), not a model: "
            "add the model's GGUF, or name it in 'from'",
            param="files",
        )
    raise HTTPProblem(400, "neither 'from' nor 'files' was specified", param="from")


def _draft_sources(body: CreateRequest, state: DaemonState) -> dict[str, Any]:
    """``create_model``'s draft arguments for ``draft``: a blob digest, a file, or a model."""
    value = body.draft
    if not value:
        return {}
    if value.lower().startswith("sha256"):
        digest = _digest(value)
        if not state.store.has_blob(digest):
            raise HTTPProblem(
                400,
                f"draft blob {digest} not found; upload it first (POST /api/blobs)",
                param="draft",
            )
        return {"draft_digest": digest}
    if _looks_like_path(value):
        path = Path(value).expanduser()
        if not path.is_file():
            raise HTTPProblem(400, f"{value}: no such file", param="draft")
        return {"draft_file": path}
    draft = resolve_model(state, value, "draft")
    return {"draft_digest": draft.model_layer.digest}


def _adapter_sources(body: CreateRequest, state: DaemonState) -> list[AdapterSource]:
    """``create_model``'s adapters for ``adapters`` (file name → digest, path or
    ``{"from", "scale"}``), each checked to exist."""
    found = []
    for name, value in (body.adapters or {}).items():
        where = f"adapters.{name}"
        origin, scale = (value, 1.0) if isinstance(value, str) else (value.from_, value.scale)
        try:
            scale = parse_scale(scale, f"{where}.scale")
        except AdapterError as exc:
            raise HTTPProblem(400, str(exc), param=where) from None
        if origin.strip().lower().startswith("sha256"):
            digest = _digest(origin)
            if not state.store.has_blob(digest):
                raise HTTPProblem(
                    400, f"blob {digest} not found; upload it first (POST /api/blobs)", param=where
                )
            found.append(AdapterSource(digest=digest, scale=scale, label=name))
            continue
        path = Path(origin).expanduser()
        if not path.exists():
            raise HTTPProblem(400, f"{origin}: no such file", param=where)
        found.append(AdapterSource(file=path, scale=scale, label=name))
    return found


def _check_adapters(
    sources: dict[str, Any], adapters: list[AdapterSource], state: DaemonState
) -> None:
    """A 400 naming the adapter and its first tensor that does not fit the model's weights
    (checked again, the same way, when the model is written)."""
    if not adapters:
        return
    if "base" in sources:
        paths = load_model(state.store, sources["base"]).gguf_paths
    else:
        paths = [sources.get("gguf_file") or state.store.blob_path(sources["gguf_digest"])]
    base = [inspect_gguf(path) for path in paths]
    for adapter in adapters:
        file = adapter.file or state.store.blob_path(adapter.digest or "")
        try:
            check_adapter(file, base, adapter.label)
        except AdapterError as exc:
            raise HTTPProblem(400, str(exc), param=f"adapters.{adapter.label}") from None


def _check_draft(sources: dict[str, Any], drafts: dict[str, Any], state: DaemonState) -> None:
    """A 400 naming both when the draft cannot draft for the model (vocabulary mismatch)."""
    if not drafts:
        return

    def info(kind: str, found: dict[str, Any]) -> tuple[GGUFInfo, str]:
        if f"{kind}file" in found:
            return inspect_gguf(found[f"{kind}file"]), str(found[f"{kind}file"])
        if "base" in found:
            model = load_model(state.store, found["base"])
            return model.info, model.name.short
        digest = found[f"{kind}digest"]
        return inspect_gguf(state.store.blob_path(digest)), digest

    target, target_name = info("gguf_", sources)
    try:
        draft, draft_name = info("draft_", drafts)
        draft.require_model()
    except LocalLLMError as exc:
        raise HTTPProblem(400, f"draft is not a usable GGUF model: {exc}", param="draft") from None
    reason = draft_incompatibility(target, draft)
    if reason is not None:
        raise HTTPProblem(
            400,
            f"draft model {draft_name} cannot draft for {target_name}: its vocabulary is "
            f"incompatible ({reason})",
            param="draft",
        )


def _progress_json(event: Any) -> dict[str, Any]:
    to_json = getattr(event, "to_json", None)
    return dict(to_json()) if to_json is not None else dict(event)


async def _background_job(
    work: Callable[[Callable[[Any], None], threading.Event], None], stream: bool
) -> Response:
    """Run ``work(emit, cancel)`` in a thread; stream what it emits as NDJSON, or wait.

    A client that goes away cancels the job (``cancel`` is set); an error after streaming
    began is a last ``{"error": ...}`` line.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[dict[str, Any] | BaseException | None] = asyncio.Queue()
    cancel = threading.Event()

    def emit(event: Any) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, _progress_json(event))

    def run() -> None:
        try:
            work(emit, cancel)
        except BaseException as exc:
            loop.call_soon_threadsafe(queue.put_nowait, exc)
        else:
            loop.call_soon_threadsafe(queue.put_nowait, None)

    task = loop.run_in_executor(None, run)

    async def finish() -> None:
        cancel.set()
        with contextlib.suppress(BaseException):
            await asyncio.shield(task)

    if not stream:
        last: dict[str, Any] = {"status": "success"}
        try:
            while (item := await queue.get()) is not None:
                if isinstance(item, BaseException):
                    raise problem_from(item) from None
                last = item
        finally:
            await finish()
        return JSONResponse({"status": last.get("status", "success")})

    async def lines() -> AsyncIterator[bytes]:
        try:
            while (item := await queue.get()) is not None:
                if isinstance(item, BaseException):
                    problem = problem_from(item)
                    if problem.status >= 500:
                        log.error("background job failed", exc_info=item)
                    yield ndjson_line({"error": problem.message})
                    return
                yield ndjson_line(item)
        finally:
            await finish()

    return ClosingStreamingResponse(lines(), media_type=NDJSON)


def _source_file_type(sources: dict[str, Any], state: DaemonState) -> tuple[str | None, str]:
    if "checkout" in sources:
        checkout: Checkout = sources["checkout"]
        inspect_checkout(state.store, checkout)  # what cannot be converted is refused now
        # A 16-bit GGUF whatever the shards hold (F16 kept, BF16/F16 when quantized next):
        # any quantization starts from it.
        return "F16", checkout.what
    if "base" in sources:
        model = load_model(state.store, sources["base"])
        return model.info.file_type, model.name.short
    path = sources.get("gguf_file") or state.store.blob_path(sources["gguf_digest"])
    info = inspect_gguf(path)
    info.require_model()
    return info.file_type, str(sources.get("gguf_file") or sources["gguf_digest"])


async def _require_llama_cpp(state: DaemonState) -> None:
    """Quantizing runs llama.cpp: refuse at once, in one line, where its CPU code cannot run."""
    paths = await state.scheduler.cpu_paths(state.settings.num_threads)
    if paths.error:
        raise HTTPProblem(500, paths.error, param="quantize")


@router.post("/api/create", summary="Create a model")
async def create(body: CreateRequest, request: Request, state: StateDep) -> Response:
    """Create a model from a blob digest (``files``), a GGUF path or a model (``from``), or
    a safetensors checkout (a folder in ``from``, or its files uploaded as blobs in
    ``files``: converted to F16 first, ``converting ...`` progress), optionally quantizing
    it (``quantize``: q8_0, q4_K_M, ...)."""
    from localllm.store.quantize import Quantize, check_quantizable, normalize_quant

    target = _new_name(body.model_name(), "model")
    # In a thread: telling a projector from a model reads GGUF headers.
    sources = await run_in_threadpool(_create_sources, body, state)
    try:
        parameters = parse_parameters(body.parameters)
    except LocalLLMError as exc:
        raise HTTPProblem(400, str(exc), param="parameters") from None
    # Read the source's GGUF header now, so a file that is not a model is a 400 before any
    # progress line is streamed.
    try:
        file_type, what = await run_in_threadpool(_source_file_type, sources, state)
    except (ModelNotFoundError, StoreError) as exc:
        if "checkout" in sources:  # a bad file name or a blob not uploaded
            raise HTTPProblem(400, str(exc), param="files") from None
        raise  # the source model went away meanwhile (404), or is damaged: its own error
    except LocalLLMError as exc:
        if "checkout" in sources:  # the converter's own words: what it cannot convert, why
            field = "from" if sources["checkout"].folder is not None else "files"
            raise HTTPProblem(400, str(exc), param=field) from None
        raise HTTPProblem(400, f"not a usable GGUF model: {exc}", param="from") from None
    if "checkout" in sources and (body.draft or body.adapters):
        raise HTTPProblem(
            400,
            "a safetensors source is converted first: create the model from it, then another "
            "model FROM it with the draft or adapters",
            param="draft" if body.draft else "adapters",
        )
    drafts = _draft_sources(body, state)
    await run_in_threadpool(_check_draft, sources, drafts, state)
    adapters = _adapter_sources(body, state)
    await run_in_threadpool(_check_adapters, sources, adapters, state)
    quant: str | None = None
    allow_requantize = bool(body.allow_requantize)
    if body.quantize:
        try:
            quant = normalize_quant(body.quantize)
            check_quantizable(file_type, what, allow_requantize=allow_requantize)
        except LocalLLMError as exc:
            raise HTTPProblem(400, str(exc), param="quantize") from None
        await _require_llama_cpp(state)
    license_text = "\n".join(body.license) if isinstance(body.license, list) else body.license
    messages = (
        [{"role": m.role, "content": m.content or ""} for m in body.messages]
        if body.messages is not None
        else None
    )

    def work(emit: Callable[[Any], None], cancel: threading.Event) -> None:
        emit({"status": "gathering model components"})
        quantize = None
        if quant is not None:
            threads = state.settings.num_threads
            quantize = Quantize(quant, allow_requantize, threads, on_progress=emit, cancel=cancel)
        found = dict(sources)
        if "checkout" in found:
            found["checkout"] = dataclasses.replace(
                found["checkout"], on_progress=emit, cancel=cancel
            )
        # One transaction: the name is written last, once every blob (the quantized weights
        # included) is complete; a failure or a kill leaves the name as it was.
        entry = create_model(
            state.store,
            target,
            template=body.template,
            system=body.system,
            parameters=parameters or None,
            license=license_text,
            messages=messages,
            adapters=adapters or None,
            quantize=quantize,
            **found,
            **drafts,
        )
        for layer in entry.manifest.layers:
            emit({"status": f"using layer {layer.digest}"})
        emit({"status": "writing manifest"})
        emit({"status": "success"})

    return await _background_job(work, body.stream is not False)


@router.post("/api/prune", summary="Remove what no model uses (localllm)")
async def prune_store(state: StateDep) -> JSONResponse:
    """Remove blobs no model references, partial downloads, corrupted blobs set aside and
    leftovers of killed writes; the answer says what went and how many bytes it freed. 409
    while a create, pull, copy or import is writing."""
    from localllm.store.check import prune

    report = await run_in_threadpool(prune, state.store)
    return JSONResponse(report.to_json())


@router.post("/api/pull", summary="Pull a model")
async def pull(body: PullRequest, request: Request, state: StateDep) -> Response:
    """Download a model; NDJSON progress lines as Ollama sends them (``stream: false`` waits)."""
    from localllm.sources import pull as pull_model
    from localllm.store.quantize import normalize_quant

    name = _new_name(body.model_name(), "model")
    quant = None
    if body.quantize:
        try:
            quant = normalize_quant(body.quantize)
        except LocalLLMError as exc:
            raise HTTPProblem(400, str(exc), param="quantize") from None
        await _require_llama_cpp(state)

    # hf.co/<user>/<repo> without a tag: the quantization that fits this machine best
    # (asked before the stream starts, so that Hub errors keep their status).
    from .discover import choose_pull

    choice = await run_in_threadpool(choose_pull, state, name)

    def work(emit: Callable[[Any], None], cancel: threading.Event) -> None:
        if choice is not None:
            emit({"status": choice[1]})
        pull_model(
            state.store,
            name,
            state.settings,
            on_progress=emit,
            cancel=cancel,
            quantize=quant,
            insecure=bool(body.insecure),
            file_tag=choice[0] if choice is not None else None,
        )

    return await _background_job(work, body.stream is not False)
