"""Models as people see them: a name in the store plus its GGUF, template, system prompt, params.

This module joins the store (bytes and manifests) with GGUF inspection (what the bytes mean).
It creates models from local GGUF files or existing blobs and describes them for ``show``.
"""

from __future__ import annotations

import json
import os
import platform
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypedDict, Unpack

from .._exceptions import GGUFError, InvalidNameError, LocalLLMError, QuantizeError, StoreError
from ..gguf_info import GGUFInfo, inspect_gguf
from ..settings import parse_rpc_workers
from .adapters import AdapterSource, ModelAdapter, check_adapter, model_adapters, with_scale
from .manifest import (
    MEDIA_ADAPTER,
    MEDIA_CONFIG,
    MEDIA_DRAFT,
    MEDIA_LICENSE,
    MEDIA_MESSAGES,
    MEDIA_MODEL,
    MEDIA_PARAMS,
    MEDIA_PROJECTOR,
    MEDIA_SYSTEM,
    MEDIA_TEMPLATE,
    Layer,
    Manifest,
    normalize_digest,
)
from .names import ModelName, parse_name
from .quantize import Quantize, quantize_into_store
from .safetensors import Checkout, convert_into_store
from .store import ModelEntry, Store

if TYPE_CHECKING:
    import threading

    from ..sources.progress import ProgressCallback

__all__ = [
    "FIXED_OPTIONS",
    "LOAD_OPTIONS",
    "OPTION_TYPES",
    "LocalModel",
    "ModelCache",
    "ModelOptions",
    "ModelParts",
    "build_manifest",
    "create_model",
    "fixed_option_problem",
    "load_model",
    "parse_parameters",
    "quantize_model",
    "render_modelfile",
]

# Options a params layer may carry, with the type each must have (Ollama's option names).
OPTION_TYPES: dict[str, type | tuple[type, ...]] = {
    "num_ctx": int,
    "num_parallel": int,
    "keep_alive": (str, int, float),
    "num_predict": int,
    "num_keep": int,
    "num_draft": int,
    "draft_model": str,
    "rpc_workers": str,
    "num_batch": int,
    "num_gpu": int,
    "main_gpu": int,
    "num_thread": int,
    "seed": int,
    "top_k": int,
    "repeat_last_n": int,
    "temperature": (int, float),
    "top_p": (int, float),
    "min_p": (int, float),
    "typical_p": (int, float),
    "repeat_penalty": (int, float),
    "presence_penalty": (int, float),
    "frequency_penalty": (int, float),
    "use_mmap": bool,
    "use_mlock": bool,
    "mirostat": int,
    "mirostat_tau": (int, float),
    "mirostat_eta": (int, float),
    "stop": list,
    # The most tokens a reasoning model may think before its reasoning block is closed.
    "thinking_budget": int,
}
# Options Ollama clients may send (its documented example has some) that llama.cpp fixes to one
# behaviour: that value is honoured, since it is what happens anyway; any other is refused
# with the reason, never quietly ignored.
FIXED_OPTIONS: dict[str, tuple[object, str]] = {
    "tfs_z": (1.0, "llama.cpp removed tail-free sampling (1.0 is off); use min_p or top_p"),
    "penalize_newline": (True, "the penalties treat the newline like any other token"),
    "numa": (False, "NUMA placement cannot be chosen per request"),
    "low_vram": (False, "llama.cpp removed the low-VRAM mode; lower num_gpu instead"),
    "logits_all": (False, "ask for logprobs instead"),
    "vocab_only": (False, "a vocabulary-only model cannot answer"),
    "embedding_only": (False, "use /api/embed, which needs no option"),
}


def fixed_option_problem(key: str, value: object) -> str | None:
    """Why ``key: value`` cannot be honoured, or None (an ordinary option, or the fixed value)."""
    fixed = FIXED_OPTIONS.get(key)
    if fixed is None:
        return None
    honoured, reason = fixed
    if isinstance(honoured, bool):
        same = value is honoured
    else:
        same = isinstance(value, int | float) and not isinstance(value, bool) and value == honoured
    return None if same else f"only {honoured!r} is supported: {reason}"


ModelOptions = dict[str, Any]
# Options that change how the model is loaded rather than how a request samples: a request
# whose load options differ from the loaded runner's reloads it.
LOAD_OPTIONS = frozenset(
    {
        "num_ctx",
        "num_parallel",
        "num_batch",
        "num_gpu",
        "main_gpu",
        "use_mmap",
        "use_mlock",
        "num_thread",
        "draft_model",
        "rpc_workers",
    }
)


def _keep_alive_parameter(value: Any) -> str | int | float:
    """A model's ``keep_alive`` (a duration; negative keeps it loaded forever), checked."""
    from ..settings import parse_duration

    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise LocalLLMError(f"parameter 'keep_alive' must be a duration, got {value!r}")
    try:
        seconds = parse_duration(value)
    except LocalLLMError as exc:
        raise LocalLLMError(f"parameter 'keep_alive': {exc}") from None
    if seconds != seconds or abs(seconds) == float("inf"):
        raise LocalLLMError("parameter 'keep_alive' must be a finite duration")
    return value


def parse_parameters(parameters: dict[str, Any] | None) -> ModelOptions:
    """Validate model parameters (Ollama's ``options``); raise naming the bad key."""
    if not parameters:
        return {}
    if not isinstance(parameters, dict):
        raise LocalLLMError("parameters must be an object of option names to values")
    clean: ModelOptions = {}
    for key, value in parameters.items():
        expected = OPTION_TYPES.get(key)
        if key in FIXED_OPTIONS:
            if (problem := fixed_option_problem(key, value)) is not None:
                raise LocalLLMError(f"parameter {key!r}: {problem}")
            continue
        if expected is None:
            raise LocalLLMError(f"unknown parameter {key!r}")
        if key == "keep_alive":
            clean[key] = _keep_alive_parameter(value)
            continue
        if key == "stop":
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
                raise LocalLLMError("parameter 'stop' must be a string or a list of strings")
        elif key == "rpc_workers" and isinstance(value, str):
            value = ",".join(parse_rpc_workers(value, f"parameter {key!r}"))
        elif expected is int and isinstance(value, float) and value.is_integer():
            value = int(value)
        elif expected is bool and isinstance(value, str):
            value = value.lower() in ("true", "1", "yes")
        if (isinstance(value, bool) and expected is not bool) or not isinstance(value, expected):
            raise LocalLLMError(f"parameter {key!r} has the wrong type: {value!r}")
        clean[key] = value
    return clean


@dataclass
class LocalModel:
    """A model in the store with its layers resolved."""

    entry: ModelEntry
    """The store's record: name, manifest, digest, modified time."""
    store: Store = field(repr=False)
    """The store it lives in."""

    @property
    def name(self) -> ModelName:
        """The model's name."""
        return self.entry.name

    @property
    def model_layer(self) -> Layer:
        """The GGUF layer."""
        layer = self.entry.manifest.layer(MEDIA_MODEL)
        if layer is None:
            raise StoreError(f"{self.name} has no model layer")
        return layer

    @property
    def gguf_path(self) -> Path:
        """Path of the GGUF blob (the first part of a split model)."""
        return self.store.blob_path(self.model_layer.digest)

    @property
    def gguf_paths(self) -> list[Path]:
        """Every part of the GGUF in order (one path unless the model is split)."""
        from ..sources.splits import model_paths

        return model_paths(self.store, self.entry.manifest)

    @property
    def draft_layer(self) -> Layer | None:
        """The draft model's GGUF layer (Modelfile ``DRAFT``), if any."""
        return self.entry.manifest.layer(MEDIA_DRAFT)

    @property
    def draft_path(self) -> Path | None:
        """Path of the draft model's GGUF blob, if the model names one."""
        return self._blob_path(self.draft_layer)

    @cached_property
    def draft_info(self) -> GGUFInfo | None:
        """The draft GGUF's inspected header, if the model has a draft layer."""
        return self._inspected(self.draft_layer, _inspect_blob)

    @property
    def adapters(self) -> list[ModelAdapter]:
        """The model's LoRA adapters (Modelfile ``ADAPTER``), in order, with their scales."""
        return model_adapters(self.entry.manifest, self.store.blob_path)

    @property
    def projector_layer(self) -> Layer | None:
        """The vision projector (``mmproj``) layer, if the model has one."""
        return self.entry.manifest.layer(MEDIA_PROJECTOR)

    @property
    def projector_path(self) -> Path | None:
        """Path of the vision projector GGUF blob, or None for a text-only model."""
        return self._blob_path(self.projector_layer)

    @cached_property
    def projector_info(self) -> GGUFInfo | None:
        """The projector's inspected header (None without a projector)."""
        return self._inspected(self.projector_layer, _inspect_projector)

    def _blob_path(self, layer: Layer | None) -> Path | None:
        return self.store.blob_path(layer.digest) if layer is not None else None

    def _inspected(
        self, layer: Layer | None, inspect: Callable[[str, Path], GGUFInfo]
    ) -> GGUFInfo | None:
        if layer is None:
            return None
        return inspect(layer.digest, self.store.blob_path(layer.digest))

    @cached_property
    def info(self) -> GGUFInfo:
        """The GGUF's inspected header."""
        return _inspect_blob(self.model_layer.digest, self.gguf_path)

    def _text(self, media_type: str) -> str | None:
        layer = self.entry.manifest.layer(media_type)
        if layer is None:
            return None
        return self.store.read_blob(layer.digest).decode("utf-8", errors="replace")

    @cached_property
    def template(self) -> str | None:
        """The template layer if the model has one, else the GGUF's chat template."""
        return self._text(MEDIA_TEMPLATE) or self.info.chat_template

    @cached_property
    def system(self) -> str | None:
        """Default system prompt."""
        return self._text(MEDIA_SYSTEM)

    @cached_property
    def license(self) -> str | None:
        """License text, from the license layer or the GGUF."""
        return self._text(MEDIA_LICENSE) or self.info.license

    @cached_property
    def parameters(self) -> ModelOptions:
        """Default options from the params layer."""
        raw = self._text(MEDIA_PARAMS)
        if not raw:
            return {}
        try:
            data = json.loads(raw)
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}

    @cached_property
    def messages(self) -> list[dict[str, Any]]:
        """Example conversation (Modelfile MESSAGE lines) prepended to chats."""
        raw = self._text(MEDIA_MESSAGES)
        if not raw:
            return []
        try:
            data = json.loads(raw)
        except ValueError:
            return []
        return [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []

    def details(self) -> dict[str, Any]:
        """Ollama's ``details`` object."""
        info = self.info
        families = [info.architecture]
        if self.projector_layer is not None:
            families.append("clip")  # as Ollama lists a model with a vision projector
        return {
            "parent_model": "",
            "format": "gguf",
            "family": info.architecture,
            "families": families,
            "parameter_size": info.parameter_size,
            "quantization_level": info.file_type,
        }

    def capabilities(self) -> list[str]:
        """What the model can do: ``completion``, ``embedding``, ``insert`` (FIM), ``vision``
        (only with a projector layer, as Ollama reports it), ``rerank`` (rank pooling)."""
        rank = ["rerank"] if self.info.rank_pooling else []
        if self.info.is_embedding_only:
            return ["embedding", *rank]
        capabilities = ["completion", *rank]
        if any(k.startswith("tokenizer.ggml.fim_") for k in self.info.metadata):
            capabilities.append("insert")
        if self.projector_layer is not None:
            capabilities.append("vision")
        return capabilities


@lru_cache(maxsize=64)
def _inspect_blob(digest: str, path: Path) -> GGUFInfo:
    # Blobs are immutable and named by their digest, so a header read once stays true; the
    # daemon resolves the model on every request and a big vocabulary takes ~0.1 s to walk.
    info = inspect_gguf(path)
    info.require_model()  # a pulled file that is no model is refused before llama.cpp sees it
    return info


@lru_cache(maxsize=16)
def _inspect_projector(digest: str, path: Path) -> GGUFInfo:
    info = inspect_gguf(path)
    info.require_projector()
    return info


def _projector_layer(store: Store, file: Path | None, digest: str | None) -> Layer | None:
    """The projector layer for a file or an uploaded blob, checked to be a ``clip`` GGUF."""
    if file is not None:
        try:
            inspect_gguf(file).require_projector()
        except GGUFError as exc:
            raise GGUFError(f"projector {file}: {exc}") from None
        return store.import_file(Path(file), MEDIA_PROJECTOR)
    if digest is not None:
        if not store.has_blob(digest):
            raise StoreError(f"blob {digest} not found; upload it first (POST /api/blobs)")
        path = store.blob_path(digest)
        try:
            inspect_gguf(path).require_projector()
        except GGUFError as exc:
            raise GGUFError(f"blob {digest} is not a usable projector: {exc}") from None
        return Layer(MEDIA_PROJECTOR, normalize_digest(digest), path.stat().st_size)
    return None


def load_model(store: Store, name: ModelName | str) -> LocalModel:
    """Resolve ``name`` in ``store``; raises ``ModelNotFoundError``."""
    return LocalModel(entry=store.get(name), store=store)


class ModelCache:
    """Models resolved once and reused while their manifest is the same file.

    The daemon resolves the model of every request: reading, hashing and parsing its manifest
    and reading its template, system, parameter and message layers again each time. A
    manifest is only ever replaced by an atomic rename, so the same inode, size and
    modification time mean the same manifest (and its layers are immutable blobs); anything
    else reads it again. The blobs' presence is still checked on every call, as
    :meth:`Store.get` does, so a damaged model is reported as before: each blob's size by one
    ``os.stat`` of a path kept with the model (the store's own check builds the paths anew,
    about 0.1 ms of every request on a cold cache), and on any difference the store reads
    the model again and says what is wrong.
    """

    def __init__(self, store: Store, size: int = 64) -> None:
        self.store = store
        self._size = size
        self._models: dict[ModelName, _Cached] = {}
        self._lock = threading.Lock()

    def get(self, name: ModelName) -> LocalModel:
        """The model called ``name`` (``ModelNotFoundError``, ``DamagedModelError``)."""
        with self._lock:
            cached = self._models.get(name)
        path = cached.path if cached is not None else os.fspath(self.store.manifest_path(name))
        try:
            stat = os.stat(path)
            key = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        except OSError:
            key = None
        if key is not None and cached is not None and cached.key == key and _whole(cached.blobs):
            return cached.model
        model = load_model(self.store, name)  # raises what the store says is wrong
        if key is not None:
            manifest = model.entry.manifest
            blobs = tuple(
                (os.fspath(self.store.blob_path(layer.digest)), layer.size)
                for layer in (manifest.config, *manifest.layers)
            )
            with self._lock:
                self._models.pop(name, None)
                self._models[name] = _Cached(key, model, path, blobs)
                if len(self._models) > self._size:
                    self._models.pop(next(iter(self._models)))
        return model


class _Cached(NamedTuple):
    """A resolved model, with what says it is still the same: its manifest file's identity
    (inode, modification time, size) at ``path`` and its blobs' paths and sizes."""

    key: tuple[int, int, int]
    model: LocalModel
    path: str
    blobs: tuple[tuple[str, int], ...]


def _whole(blobs: tuple[tuple[str, int], ...]) -> bool:
    """Whether every blob is there with its size (what :meth:`Store.damage` checks)."""
    for path, size in blobs:
        try:
            if os.stat(path).st_size != size:
                return False
        except OSError:
            return False
    return True


def _config_blob(store: Store, info: GGUFInfo, layers: list[Layer]) -> Layer:
    config = {
        "model_format": "gguf",
        "model_family": info.architecture,
        "model_families": [info.architecture],
        "model_type": info.parameter_size,
        "file_type": info.file_type,
        "architecture": {"x86_64": "amd64", "aarch64": "arm64"}.get(
            platform.machine(), platform.machine()
        ),
        "os": platform.system().lower(),
        "rootfs": {"type": "layers", "diff_ids": [layer.digest for layer in layers]},
    }
    return store.write_blob_bytes(json.dumps(config).encode(), MEDIA_CONFIG)


class ModelParts(TypedDict, total=False):
    """What a model is made of: the arguments of :func:`create_model` (all optional)."""

    gguf_file: Path | None
    gguf_digest: str | None
    checkout: Checkout | None
    base: ModelName | str | ModelEntry | None
    template: str | None
    system: str | None
    parameters: dict[str, Any] | None
    license: str | None
    messages: list[dict[str, Any]] | None
    draft_file: Path | None
    draft_digest: str | None
    projector_file: Path | None
    projector_digest: str | None
    adapters: list[AdapterSource] | None
    quantize: Quantize | None


def create_model(store: Store, name: ModelName | str, **parts: Unpack[ModelParts]) -> ModelEntry:
    """Create (or replace) ``name`` from exactly one of a GGUF file (``gguf_file``), a blob
    digest (``gguf_digest``), a safetensors checkout (``checkout``: a folder or uploaded
    blobs, converted to F16 first) or a model (``base``).

    Layers not given are inherited from ``base``; with a file or digest they are absent (the
    GGUF's own chat template is used). A vision projector (a ``clip`` GGUF, Ollama's second
    ``FROM``) comes from ``projector_file`` or ``projector_digest``, else from ``base``.
    ``draft_file`` or ``draft_digest`` (a GGUF blob) becomes the draft layer (Modelfile
    ``DRAFT``); its vocabulary is checked against the model's by the caller (the daemon).
    ``adapters`` (Modelfile ``ADAPTER``) are added after those ``base`` has, each checked
    against the model's weights first (:func:`~localllm.store.adapters.check_adapter`).
    ``template``, ``system``, ``license``, ``parameters`` and ``messages`` become layers. With
    ``quantize``, the model's weights are quantized first.

    One transaction: the GGUFs are validated before anything is written, every blob is
    written next, and the manifest that gives the model its name last, once all the work is
    done. A failure (a full disk, a refused quantization, a kill) leaves ``name`` as it was.
    """
    target = parse_name(name) if isinstance(name, str) else name
    base = parts.get("base")
    source = parse_name(base) if isinstance(base, str) else base
    read = [source] if isinstance(source, ModelName) else []
    with store.transaction(f"creating {target.short}", change=[target], read=read) as tx:
        return tx.commit(target, build_manifest(store, **(parts | {"base": source})))


def build_manifest(store: Store, **parts: Unpack[ModelParts]) -> Manifest:
    """Write the blobs of a model (see :func:`create_model`) and return its manifest, unwritten.

    ``base`` may be a model not yet named in the store (an entry whose manifest was not
    written, as a pull builds it). Call inside a :meth:`Store.transaction`.
    """
    gguf_file, gguf_digest = parts.get("gguf_file"), parts.get("gguf_digest")
    base, quantize, checkout = parts.get("base"), parts.get("quantize"), parts.get("checkout")
    sources = [s for s in (gguf_file, gguf_digest, base, checkout) if s is not None]
    if len(sources) != 1:
        raise LocalLLMError(
            "create needs exactly one source: a GGUF file, a blob digest, a safetensors "
            "folder or a model"
        )
    options = parse_parameters(parts.get("parameters"))
    inherited: dict[str, Layer] = {}
    merged_options: ModelOptions = {}
    model_layers: list[Layer] = []
    own_adapters: list[Layer] = []
    if base is not None:
        entry = base if isinstance(base, ModelEntry) else store.get(base)
        parent = LocalModel(entry=entry, store=store)
        model_layers = [x for x in parent.entry.manifest.layers if x.media_type == MEDIA_MODEL]
        inherited = {x.media_type: x for x in parent.entry.manifest.layers}
        own_adapters = parent.entry.manifest.layers_of(MEDIA_ADAPTER)
        info = parent.info
        paths = parent.gguf_paths
        what = parent.name.short
        merged_options = dict(parent.parameters)
    elif checkout is not None:
        # Converted (and quantized) into a blob first: the rest treats it as any GGUF blob.
        layer = convert_into_store(store, checkout, quantize)
        quantize = None
        model_layers = [layer]
        paths, what = [store.blob_path(layer.digest)], checkout.what
        info = _inspect_blob(layer.digest, paths[0])
    elif gguf_file is not None:
        info = inspect_gguf(gguf_file)  # refuse non-GGUF before copying gigabytes
        info.require_model()
        paths, what = [Path(gguf_file)], Path(gguf_file).name
    else:
        assert gguf_digest is not None
        if not store.has_blob(gguf_digest):
            raise StoreError(f"blob {gguf_digest} not found; upload it first (POST /api/blobs)")
        path = store.blob_path(gguf_digest)
        try:
            info = inspect_gguf(path)
            info.require_model()
        except GGUFError as exc:
            raise GGUFError(f"blob {gguf_digest} is not a usable GGUF: {exc}") from None
        model_layers = [Layer(MEDIA_MODEL, normalize_digest(gguf_digest), path.stat().st_size)]
        paths, what = [path], gguf_digest
    if quantize is not None:
        layer = quantize_into_store(store, paths, quantize, what)
        model_layers = [layer]
        info = _inspect_blob(layer.digest, store.blob_path(layer.digest))
    elif not model_layers:
        assert gguf_file is not None
        model_layers = [store.import_file(Path(gguf_file), MEDIA_MODEL)]

    layers = list(model_layers)
    layers += _adapter_layers(store, parts.get("adapters") or [], paths, info, own_adapters)
    projector = _projector_layer(store, parts.get("projector_file"), parts.get("projector_digest"))
    if projector is None:
        projector = inherited.get(MEDIA_PROJECTOR)
    if projector is not None:
        layers.append(projector)
    text_layers = (
        (MEDIA_TEMPLATE, parts.get("template")),
        (MEDIA_SYSTEM, parts.get("system")),
        (MEDIA_LICENSE, parts.get("license")),
    )
    for media_type, text in text_layers:
        if text is not None:
            layers.append(store.write_blob_bytes(text.encode(), media_type))
        elif media_type in inherited:
            layers.append(inherited[media_type])
    merged_options.update(options)
    if merged_options:
        layers.append(store.write_blob_bytes(json.dumps(merged_options).encode(), MEDIA_PARAMS))
    messages, draft_file, draft_digest = (
        parts.get("messages"),
        parts.get("draft_file"),
        parts.get("draft_digest"),
    )
    if messages is not None:
        layers.append(store.write_blob_bytes(json.dumps(messages).encode(), MEDIA_MESSAGES))
    elif MEDIA_MESSAGES in inherited:
        layers.append(inherited[MEDIA_MESSAGES])
    if draft_file is not None:
        draft_info = inspect_gguf(draft_file)
        draft_info.require_model()
        layers.append(store.import_file(Path(draft_file), MEDIA_DRAFT))
    elif draft_digest is not None:
        if not store.has_blob(draft_digest):
            raise StoreError(f"draft blob {draft_digest} not found; upload it first")
        draft_path = store.blob_path(draft_digest)
        inspect_gguf(draft_path).require_model()
        layers.append(Layer(MEDIA_DRAFT, normalize_digest(draft_digest), draft_path.stat().st_size))
    elif MEDIA_DRAFT in inherited:
        layers.append(inherited[MEDIA_DRAFT])

    config = _config_blob(store, info, layers)
    return Manifest(config=config, layers=tuple(layers))


def _adapter_layers(
    store: Store,
    sources: list[AdapterSource],
    paths: list[Path],
    info: GGUFInfo,
    inherited: list[Layer],
) -> list[Layer]:
    """The adapter layers of a new model: the base's, then ``sources``, each checked against
    the model's weights (every part of a split GGUF) before it is copied into the store."""
    if not sources:
        return list(inherited)
    parts = [info] if len(paths) == 1 else [inspect_gguf(p) for p in paths]
    layers = list(inherited)
    for source in sources:
        if source.file is not None:
            path, label = Path(source.file), source.label or Path(source.file).name
        else:
            assert source.digest is not None
            if not store.has_blob(source.digest):
                raise StoreError(
                    f"adapter blob {source.digest} not found; upload it first (POST /api/blobs)"
                )
            path, label = store.blob_path(source.digest), source.label or source.digest
        check_adapter(path, parts, label)
        if source.file is not None:
            layer = store.import_file(path, MEDIA_ADAPTER)
        else:
            layer = Layer(MEDIA_ADAPTER, normalize_digest(source.digest or ""), path.stat().st_size)
        if any(existing.digest == layer.digest for existing in layers):
            raise LocalLLMError(
                f"adapter {label} is applied already (llama.cpp applies an adapter once: give "
                "one ADAPTER line with the scale wanted)"
            )
        layers.append(with_scale(layer, source.scale))
    return layers


def quantize_model(
    store: Store,
    source: ModelName | str | Path,
    target_name: ModelName | str,
    quant: str,
    *,
    allow_requantize: bool = False,
    threads: int = 0,
    on_progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
) -> ModelEntry:
    """Quantize a model (a name in ``store``) or a GGUF file into the new model ``target_name``.

    The result keeps the source model's template, system, params, license, messages, projector
    and draft layers. ``target_name`` may equal the source's name (the model is replaced, once
    the quantized weights are complete). Emits the quantizer's progress, then ``writing
    manifest``; raises :class:`QuantizeError`, :class:`DiskFullError`,
    :class:`ModelNotFoundError` or :class:`OperationCancelledError`, leaving ``target_name`` as
    it was.
    """
    from ..sources.progress import PullProgress

    how = Quantize(quant, allow_requantize, threads, on_progress, cancel)
    if isinstance(source, Path) or (isinstance(source, str) and Path(source).is_file()):
        path = Path(source).expanduser()
        if not path.is_file():
            raise QuantizeError(f"{path}: no such file")
        entry = create_model(store, target_name, gguf_file=path, quantize=how)
    else:
        try:
            name = parse_name(source) if isinstance(source, str) else source
        except InvalidNameError:
            raise QuantizeError(f"{source}: no such GGUF file or model") from None
        entry = create_model(store, target_name, base=name, quantize=how)
    if on_progress is not None:
        on_progress(PullProgress("writing manifest"))
    return entry


def render_modelfile(model: LocalModel) -> str:
    """A Modelfile that recreates ``model`` (what ``show --modelfile`` prints)."""
    lines = [
        f"# Modelfile generated by localllm for {model.name}",
        f"FROM {model.gguf_path}",
    ]
    if model.projector_path is not None:
        lines.append(f"FROM {model.projector_path}")
    for adapter in model.adapters:
        scale = f" {adapter.scale:g}" if adapter.scale != 1.0 else ""
        lines.append(f"ADAPTER {adapter.path}{scale}")
    if model.entry.manifest.layer(MEDIA_TEMPLATE) is not None and model.template:
        lines.append(f'TEMPLATE """{model.template}"""')
    if model.system:
        lines.append(f'SYSTEM """{model.system}"""')
    for key, value in model.parameters.items():
        for item in value if isinstance(value, list) else [value]:
            lines.append(f"PARAMETER {key} {json.dumps(item) if isinstance(item, str) else item}")
    for message in model.messages:
        lines.append(f"MESSAGE {message.get('role', 'user')} {message.get('content', '')}")
    if model.draft_path is not None:
        lines.append(f"DRAFT {model.draft_path}")
    if model.entry.manifest.layer(MEDIA_LICENSE) is not None and model.license:
        lines.append(f'LICENSE """{model.license}"""')
    return "\n".join(lines) + "\n"
